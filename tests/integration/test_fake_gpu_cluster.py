"""Every GPU recipe's actors scheduled on a fake-GPU two-node Ray cluster on 127.0.0.1, on CPU.

Two raylets (a head and a second node joined through cluster/loopback_worker.py), each offering the GPU worker
pods' shape of cluster/kuberay_rayjob.yaml (8 GPUs, 16 CPUs) with ``--num-gpus``: no GPU exists, Ray only counts
them. For each recipe in recipes/gpu/ a driver (a subprocess: this test process may hold the session's own Ray)
runs the check the real drivers run (pr_rlhf.resources.check), then starts each phase's actor groups as the real
code does (learner ranks and train's rollout workers each in one placement group, the rest as plain actors) with
dummy bodies that report their node and GPU ids: all must become ready, none stay pending, no GPU is handed out
twice, and a tensor-parallel engine's GPUs are those of one actor (hence one node). Phases of the same shape (bon's
one-worker scoring pools, the two P-GenRM recipes) are scheduled once."""
from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.local_nodes import free_port, stop_nodes

ROOT = Path(__file__).resolve().parents[2]
RAY = str(ROOT / ".venv" / "bin" / "ray") if (ROOT / ".venv" / "bin" / "ray").exists() else "ray"
GPU_RECIPES = {"ppo_personalized": "train", "pgenrm_pipeline": "pgenrm", "pgenrm_real": "pgenrm",
               "rm_bt": "train-rm", "bon_sweep": "bon"}
READY_TIMEOUT_S = 60.0


def gpu_node_shape() -> tuple[int, int]:
    """(CPUs, GPUs) of a GPU worker pod in cluster/kuberay_rayjob.yaml."""
    group = yaml.safe_load((ROOT / "cluster" / "kuberay_rayjob.yaml").read_text())["spec"]["rayClusterSpec"][
        "workerGroupSpecs"][0]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    params = group.get("rayStartParams") or {}
    return int(params.get("num-cpus", limits["cpu"])), int(params.get("num-gpus", limits["nvidia.com/gpu"]))


def own_ports() -> list[str]:
    """Ports another Ray on this machine (the test session's, the other node) may already hold."""
    return ["--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
            "--metrics-export-port", str(free_port()), "--ray-client-server-port", str(free_port())]


def in_own_session(temp_dir: Path, cmd: list[str], env: dict) -> None:
    """Run ``cmd`` as the leader of a new session whose id is kept in ``temp_dir/node.sid`` (as
    cluster/local_head.sh does): its stop ends exactly that session's processes."""
    log = temp_dir / "start.log"
    with log.open("w") as out:
        done = subprocess.run(["setsid", "--wait", "bash", "-c", 'echo $$ > "$0/node.sid"; shift; exec "$@"',
                               str(temp_dir), "_", *cmd], env=env, stdout=out, stderr=subprocess.STDOUT, timeout=180)
    assert done.returncode == 0, log.read_text()[-3000:]


@contextlib.contextmanager
def fake_gpu_cluster(cpus: int, gpus: int):
    """Two nodes on 127.0.0.1, each with ``cpus`` CPUs and ``gpus`` fake GPUs; yields the GCS address. Stops only
    them, and checks that none of their processes is left."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0",
           # no idle Python workers started per CPU (32 of them on a 2-core machine): only the actors' own
           "RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}
    gcs = free_port()
    # Ray's unix sockets live under the temp dir and their paths may not exceed 107 bytes: keep it short.
    dirs = [Path(tempfile.mkdtemp(prefix="prg-")), Path(tempfile.mkdtemp(prefix="prg-"))]
    node = ["--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus), "--num-gpus", str(gpus),
            "--object-store-memory", str(80 * 2**20), "--disable-usage-stats"]
    try:
        in_own_session(dirs[0], [RAY, "start", "--head", "--port", str(gcs), "--temp-dir", str(dirs[0]),
                                 "--include-dashboard", "false", *node, *own_ports()], env)
        in_own_session(dirs[1], [sys.executable, str(ROOT / "cluster" / "loopback_worker.py"), "--address",
                                 f"127.0.0.1:{gcs}", "--temp-dir", str(dirs[1]), *node, *own_ports()], env)
        yield f"127.0.0.1:{gcs}", env
    finally:
        stop_nodes(dirs, env)


# ------------------------------------------------------------------------------------------------ the driver
def schedule_phase(members: list, timeout_s: float) -> dict:
    """Start ``members`` (actor groups alive together) as the drivers would, wait for every actor; then remove them."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    class Dummy:   # defined here, so that it travels by value (the workers cannot import this test module)
        def ready(self) -> dict:
            return {"node": ray.get_runtime_context().get_node_id(), "gpus": [str(i) for i in ray.get_gpu_ids()]}

    remote = ray.remote(Dummy)
    t0 = time.perf_counter()
    actors, refs, rows, pgs = [], [], [], []
    group_pgs: dict = {}
    # a colocated group (the hybrid engine's rollout) runs in its host group's bundles: the host first
    for g in sorted(members, key=lambda g: g.colocated_with is not None):
        pg = placement_group([dict(b) for b in g.bundles], strategy=g.placement_group) if g.placement_group else None
        if pg is not None:
            pgs.append(pg)
            group_pgs[g.name] = pg
        if g.colocated_with:
            pg = group_pgs[g.colocated_with]
        for i in range(g.count if g.colocated_with else len(g.bundles)):
            options = g.options()   # inside a shared bundle, each actor's own part
            if pg is not None:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=i)
            actor = remote.options(**options).remote()
            actors.append(actor)
            refs.append(actor.ready.remote())
            rows.append({"group": g.name, "bundle": dict(g.bundle), "asks_gpus": options["num_gpus"],
                         "engine_gpus": g.engine_gpus, "placement_group": g.placement_group,
                         "colocated_with": g.colocated_with, "index": i})
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    done_set = set(done)
    for ref, row in zip(refs, rows):
        row.update(ray.get(ref) if ref in done_set else {"pending": True})
    pg_states = [ray.util.placement_group_table(pg)["state"] for pg in pgs]
    seconds = time.perf_counter() - t0
    for actor in actors:
        ray.kill(actor)
    for pg in pgs:
        remove_placement_group(pg)
    # the next phase starts in an empty cluster, as a driver's next phase does: Ray frees a killed actor's
    # resources asynchronously, and a placement group asked for meanwhile would spread where PACK packs
    total = ray.cluster_resources()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(ray.available_resources().get(k, 0.0) < total[k] - 1e-6
                                              for k in ("CPU", "GPU")):
        time.sleep(0.2)
    return {"actors": rows, "placement_groups": pg_states, "seconds": round(seconds, 1)}


def drive(address: str) -> dict:
    """Check and schedule every GPU recipe on the cluster at ``address``."""
    import ray

    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.resources import check

    ray.init(address=address, logging_level="WARNING")
    nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
    report: dict = {"nodes": nodes, "phases": {}}
    scheduled: dict[str, str] = {}
    for name, command in GPU_RECIPES.items():
        groups = check(load_recipe(ROOT / "recipes" / "gpu" / f"{name}.yaml"), command, nodes)
        for phase in dict.fromkeys(g.phase for g in groups):
            members = [g for g in groups if g.phase == phase]
            shape = json.dumps([[sorted(b.items()) for b in g.bundles] + [g.placement_group, g.engine_gpus]
                                for g in members])
            where = f"{name}: {phase}"
            if shape in scheduled:
                report["phases"][where] = {"same_as": scheduled[shape]}
                continue
            scheduled[shape] = where
            report["phases"][where] = schedule_phase(members, READY_TIMEOUT_S)
    ray.shutdown()
    return report


# ------------------------------------------------------------------------------------------------ the test
@pytest.mark.timeout(600)
def test_gpu_recipes_schedule_on_a_fake_two_node_gpu_cluster(tmp_path):
    cpus, gpus = gpu_node_shape()
    assert (cpus, gpus) == (16, 8)
    t0 = time.perf_counter()
    with fake_gpu_cluster(cpus, gpus) as (address, env):
        started = time.perf_counter() - t0
        out = tmp_path / "report.json"
        run = subprocess.run([sys.executable, "-m", "tests.integration.test_fake_gpu_cluster", address, str(out)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
        assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(out.read_text())
    print(f"cluster up in {started:.0f} s; phases:", {k: v.get("seconds", v.get("same_as"))
                                                     for k, v in report["phases"].items()})
    assert len(report["nodes"]) == 2 and all(n["GPU"] == gpus for n in report["nodes"])
    assert {w.split(":")[0] for w in report["phases"]} == set(GPU_RECIPES)
    for where, phase in report["phases"].items():
        if "same_as" in phase:
            assert phase["same_as"] in report["phases"] and "actors" in report["phases"][phase["same_as"]]
            continue
        actors = phase["actors"]
        pending = [a["group"] for a in actors if a.get("pending")]
        assert not pending, f"{where}: still pending after {READY_TIMEOUT_S:.0f} s: {pending}"
        assert set(phase["placement_groups"]) <= {"CREATED"}, (where, phase["placement_groups"])
        handed = [(a["node"], gpu) for a in actors for gpu in a["gpus"] if not a["colocated_with"]]
        assert len(handed) == len(set(handed)), f"{where}: a GPU handed to two actors"
        for a in actors:
            assert len(a["gpus"]) == math.ceil(a["asks_gpus"]), (where, a)
            if a["colocated_with"]:   # the hybrid engine: on its learner rank's node and GPU
                [host] = [h for h in actors if h["group"] == a["colocated_with"] and h["index"] == a["index"]]
                assert (a["node"], a["gpus"]) == (host["node"], host["gpus"]), (where, a, host)
            if a["engine_gpus"] > 1:   # tensor parallelism: all of the engine's GPUs in its own actor, one node
                assert len(a["gpus"]) == a["engine_gpus"], (where, a)
        learners = [a for a in actors if a["group"].endswith("learner")]
        gpus_per_learner = sum(a["bundle"].get("GPU", 0) for a in learners)
        if learners and gpus_per_learner <= gpus:   # PACK in an empty cluster keeps the ranks on one node
            assert len({a["node"] for a in learners}) == 1, f"{where}: learner ranks spread over nodes"
    # the P-GenRM GRPO phase, colocated: 8 learner ranks, each with its engine on its GPU, on one node
    grpo = report["phases"]["pgenrm_pipeline: pgenrm GRPO (cre, curriculum)"]["actors"]
    assert sum(1 for a in grpo if a["colocated_with"]) == 8 and len({a["node"] for a in grpo}) == 1


if __name__ == "__main__":   # the driver, run by the test in its own process
    Path(sys.argv[2]).write_text(json.dumps(drive(sys.argv[1]), indent=1))
