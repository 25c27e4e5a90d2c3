"""The cluster launch files, checked as far as a CPU machine allows: the Ray cluster-launcher config against Ray's
own schema, the KubeRay RayJob's shape and entrypoint, every recipe the files name, the Dockerfile's Ray version,
and the job-submission wrapper's command line (through a stand-in `ray`)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from pr_rlhf.configs.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"


def test_cluster_launcher_config_passes_rays_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((CLUSTER / "ray_cluster_gpu.yaml").read_text())
    validate_config(prepare_config(config))
    head = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "RAY_AUTH_MODE=token" in head   # never an open dashboard
    assert any(".[gpu]" in c for c in config["setup_commands"])


def test_rayjob_manifest_shape_and_entrypoint():
    import ray

    job = yaml.safe_load((CLUSTER / "kuberay_rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    entry = spec["entrypoint"].split()
    assert entry[:3] == ["python", "-m", "pr_rlhf.cli"] and entry[3] in {"train", "pgenrm", "bon", "scaling"}
    overrides = [entry[i + 1] for i, arg in enumerate(entry) if arg == "--set"]
    recipe = load_recipe(ROOT / entry[4], overrides)
    # each node runs the job in its own temporary copy of the working dir: outputs and shards on the shared volume
    groups = [spec["rayClusterSpec"]["headGroupSpec"], *spec["rayClusterSpec"]["workerGroupSpecs"]]
    mounts = {m["mountPath"] for g in groups for c in g["template"]["spec"]["containers"]
              for m in c.get("volumeMounts", [])}
    assert len(mounts) == 1
    (mount,) = mounts
    for path in (recipe.train.out, recipe.train.data.shards):
        assert path.startswith(mount + "/"), path
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert runtime_env["env_vars"]["HF_HUB_OFFLINE"] == "1"
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == ray.__version__
    images = {c["image"] for g in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
              for c in g["template"]["spec"]["containers"]}
    assert len(images) == 1                                            # one image for head and workers
    gpus = [c["resources"]["limits"].get("nvidia.com/gpu") for g in cluster["workerGroupSpecs"]
            for c in g["template"]["spec"]["containers"]]
    assert all(gpus), "every worker group asks for GPUs"


def test_dockerfile_uses_the_installed_ray_version():
    import ray

    base = re.search(r"^FROM rayproject/ray:(\S+)", (CLUSTER / "Dockerfile").read_text(), re.M).group(1)
    assert base.startswith(ray.__version__ + "-")


def _named_recipes(path: Path) -> list[str]:
    return sorted(set(re.findall(r"recipes/[\w/]+\.yaml", path.read_text())))


NAMING = [p for p in sorted(CLUSTER.glob("*")) if p.is_file() and p.suffix != ".pyc" and _named_recipes(p)]


@pytest.mark.parametrize("path", NAMING, ids=lambda p: p.name)
def test_every_recipe_a_cluster_file_names_exists_and_validates(path):
    for name in _named_recipes(path):
        load_recipe(ROOT / name)


def test_the_cluster_files_that_launch_jobs_name_a_recipe():
    # a job manifest or launcher that names no recipe would skip the check above silently
    assert {p.name for p in NAMING} >= {"kuberay_rayjob.yaml", "ray_cluster_gpu.yaml", "submit.sh"}


def test_submit_wrapper_builds_the_job_submission(tmp_path):
    fake = tmp_path / "ray"
    fake.write_text("#!/usr/bin/env bash\nprintf '%s\\n' \"$@\"\n")
    fake.chmod(0o755)
    env = {**os.environ, "RAY_BIN": str(fake), "RAY_ADDRESS": "http://127.0.0.1:9999"}
    out = subprocess.run(["bash", str(CLUSTER / "submit.sh"), "--no-wait", "--", "pr-rlhf", "bon",
                          "recipes/bon_sweep.yaml"], env=env, capture_output=True, text=True, check=True).stdout
    args = out.split("\n")
    assert args[:4] == ["job", "submit", "--address", "http://127.0.0.1:9999"]
    assert "--runtime-env" in args and str(CLUSTER / "runtime_env.yaml") in args and "--no-wait" in args
    assert args[args.index("--") + 1:args.index("--") + 5] == ["python", "-m", "pr_rlhf.cli", "bon"]
    missing = subprocess.run(["bash", str(CLUSTER / "submit.sh")], env=env, capture_output=True, text=True)
    assert missing.returncode == 2 and "no command" in missing.stderr
