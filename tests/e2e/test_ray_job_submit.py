"""`ray job submit` against Ray clusters this test starts on 127.0.0.1 (and stops: only them): the GRPO recipe end to
end on one node, and a two-node cluster (head + worker node, own ports and custom resources) where the learner
ranks and the rollout workers land on different nodes through their placement groups."""
import contextlib
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.local_nodes import free_port, stop_nodes

ROOT = Path(__file__).resolve().parents[2]
RAY = str(ROOT / ".venv" / "bin" / "ray") if (ROOT / ".venv" / "bin" / "ray").exists() else "ray"
SCRIPT = str(ROOT / "cluster" / "local_head.sh")
# short and quick: 2 GRPO steps of the tiny recipe (its world is built inside the job)
SHORT = ["train.steps=2", "train.prompts_per_step=2", "train.group_size=4", "train.max_tokens=8",
         "train.eval_every=2", "train.checkpoint_every=2", "train.warmup_sft_steps=2", "train.warmup_sft_batch=4",
         "train.data.heldout_prompts=2", "train.eval_samples=2"]


def own_ports() -> dict:
    """Ports another Ray on this machine (the test session's, or the other node) may already hold."""
    return {"RAY_AGENT_PORT": str(free_port()), "RAY_AGENT_GRPC_PORT": str(free_port()),
            "RAY_METRICS_PORT": str(free_port()), "RAY_CLIENT_PORT": str(free_port())}


@contextlib.contextmanager
def local_cluster(head_resources: dict | None = None, worker_resources: dict | None = None, cpus: int = 4):
    """A head (and optionally a worker node) on 127.0.0.1; yields (job address, env). Stops exactly these."""
    gcs_port = free_port()
    env = {**os.environ, "RAY_PORT": str(gcs_port), "RAY_DASHBOARD_PORT": str(free_port()),
           "RAY_NUM_CPUS": str(cpus), "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    # Ray's unix sockets live under the temp dir and their paths may not exceed 107 bytes: keep it short.
    dirs = [Path(tempfile.mkdtemp(prefix="prr-"))]
    try:
        address = subprocess.run(
            ["bash", SCRIPT, "start", str(dirs[0])], check=True, capture_output=True, text=True, timeout=180,
            env={**env, **own_ports(), "RAY_RESOURCES": json.dumps(head_resources or {})}).stdout.strip()
        if worker_resources is not None:
            dirs.append(Path(tempfile.mkdtemp(prefix="prw-")))
            subprocess.run(["bash", SCRIPT, "start", str(dirs[1]), "--worker"], check=True, timeout=180,
                           env={**env, **own_ports(), "RAY_RESOURCES": json.dumps(worker_resources),
                                "RAY_HEAD_ADDRESS": f"127.0.0.1:{gcs_port}"})
        yield address, env
    finally:
        stop_nodes(dirs, env)


@pytest.fixture(scope="module")
def one_node():
    """One single-node head shared by the jobs that need no other node: each job is its own driver process with
    its own run directory, and a head's start and stop cost ~15 s. (The two-node test comes first in this file,
    so the shared head is not running beside its cluster.)"""
    with local_cluster() as cluster:
        yield cluster


def read_predictions(run_dir: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(run_dir / "predictions.parquet").to_pylist()


def eval_inputs(run_dir: Path):
    """(eval recipe, the pairs it evaluated rebuilt from its shards, its recorded predictions) of the evaluation
    in ``run_dir``, read from the recipe the job wrote there; the pairs are those of the predictions, in order."""
    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.eval.runner import load_eval_inputs

    recipe = load_recipe(str(run_dir / "recipe.yaml"))
    inputs = load_eval_inputs(recipe.eval, recipe.seed)
    saved = read_predictions(run_dir)
    assert [i.pair_id for i in inputs] == [r["pair_id"] for r in saved]
    return recipe, inputs, saved


def submit_and_wait(address: str, env: dict, recipe: str, out: Path, sets: list[str], timeout_s: float = 1200,
                    command: str = "train"):
    entry = ["python", "-m", "pr_rlhf.cli", command, recipe, "--out", str(out)]
    for s in sets:
        entry += ["--set", s]
    cmd = [RAY, "job", "submit", "--address", address, "--working-dir", str(ROOT),
           "--runtime-env", str(ROOT / "cluster" / "runtime_env.yaml"), "--no-wait", "--", *entry]
    for _ in range(30):  # a fresh head answers "No available agent" until its job agent is up
        submit = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if submit.returncode == 0 or "No available agent" not in submit.stderr:
            break
        time.sleep(2)
    assert submit.returncode == 0, submit.stderr
    job_id = re.search(r"raysubmit_[A-Za-z0-9]+", submit.stdout + submit.stderr).group(0)
    from ray.job_submission import JobStatus, JobSubmissionClient

    os.environ["RAY_AUTH_MODE"] = "disabled"  # this process talks to the test's loopback-only head
    client = JobSubmissionClient(address)
    deadline = time.time() + timeout_s
    status = client.get_job_status(job_id)
    while time.time() < deadline and not status.is_terminal():
        time.sleep(3)
        status = client.get_job_status(job_id)
    assert status == JobStatus.SUCCEEDED, client.get_job_logs(job_id)[-3000:]


@pytest.mark.timeout(1800)   # a hang: the jobs take 0.5-2.5 min on a fast 2-core machine
def test_two_nodes_learner_and_rollout_placed_apart(tmp_path):
    """Head offers `learner_host`, the worker node `rollout_host`: 2 FSDP ranks (gloo) go to the head, the rollout
    worker to the other node, and the weights still reach it every step, as they would across hosts."""
    out = tmp_path / "run"
    sets = [*SHORT, f"train.data.shards={tmp_path / 'shards'}", "train.learner.world_size=2",
            'train.learner.resources={"learner_host": 1}', 'train.rollout_resources={"rollout_host": 1}']
    with local_cluster({"learner_host": 2}, {"rollout_host": 2}, cpus=2) as (address, env):
        submit_and_wait(address, env, "recipes/grpo_tiny.yaml", out, sets)
    placement = json.loads((out / "placement.json").read_text())
    nodes = placement["nodes"]
    assert len(nodes) == 2, nodes
    learner_node = next(n for n, res in nodes.items() if "learner_host" in res)
    rollout_node = next(n for n, res in nodes.items() if "rollout_host" in res)
    assert learner_node != rollout_node
    assert placement["learner"] == [learner_node, learner_node]
    assert placement["rollout"] == [rollout_node]
    history = json.loads((out / "history.json").read_text())
    assert len(history["history"]) == 2 and history["history"][-1]["time/weight_sync_s"] > 0


@pytest.mark.timeout(1800)   # a hang: the jobs take 0.5-2.5 min on a fast 2-core machine
def test_submit_grpo_recipe(tmp_path, one_node):
    out = tmp_path / "run"
    address, env = one_node
    submit_and_wait(address, env, "recipes/grpo_tiny.yaml", out,
                    [*SHORT, f"train.data.shards={tmp_path / 'shards'}"])
    history = json.loads((out / "history.json").read_text())
    assert len(history["history"]) == 2 and "eval/heldout_reward_mean" in history["evals"][-1]
    assert (tmp_path / "shards" / "manifest.json").is_file()   # the job built the recipe's world itself

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("grpo_tiny").experiment_id])
    assert "reward/mean" in run.data.metrics and "time/rollout_s" in run.data.metrics


@pytest.mark.timeout(1800)   # a hang: the jobs take 0.5-2.5 min on a fast 2-core machine
def test_submit_pgenrm_pipeline(tmp_path, one_node):
    """The P-GenRM pipeline as a Ray job: an SFT stage from the shipped GenRM and a GRPO stage from its output
    (learners, rollout workers, evaluation tasks) on the cluster's workers, one step each; every stage runs in the
    pipeline tests. What the job computed is recomputed here: its summaries are its verdicts', and the model it
    exported writes the same chains (hence the same verdicts) on the pairs it evaluated."""
    out = tmp_path / "run"
    shipped = ROOT / "models" / "pgenrm_tiny"
    sets = [f"pgenrm.shards={tmp_path / 'shards'}", "pgenrm.stages=[psi,cre]", f"pgenrm.start_from.psi={shipped}",
            "pgenrm.psi.steps=1", "pgenrm.psi.batch_size=4", "pgenrm.cre.steps=1", "pgenrm.cre.refill_rounds=0",
            "pgenrm.cre.prompts_per_step=2", "pgenrm.cre.group_size=2",
            "pgenrm.eval.seen_pairs=6", "pgenrm.eval.cold_pairs=2", "pgenrm.headroom.after_psi=false"]
    address, env = one_node
    submit_and_wait(address, env, "recipes/pgenrm_from_shipped.yaml", out, sets, command="pgenrm")
    for stage in ("psi", "cre"):
        result = json.loads((out / stage / "result.json").read_text())
        assert (out / stage / "COMPLETE").is_file()
        for group, n in (("seen", 6), ("cold", 2)):   # each summary is that of its own verdicts
            summary = result[group]["summary"]
            verdicts = read_predictions(out / stage / f"eval_{group}")
            assert summary["n"] == len(verdicts) == n, (stage, group)
            assert summary["accuracy"] == pytest.approx(sum(v["correct"] for v in verdicts) / n), (stage, group)
            assert summary["failures"] == sum(v["error"] is not None for v in verdicts), (stage, group)
    assert (out / "ablation.md").is_file()

    from pr_rlhf.models import make_engine
    from pr_rlhf.models.base import SamplingParams
    from pr_rlhf.reward.judge import PairwiseJudge

    recipe, inputs, saved = eval_inputs(out / "psi" / "eval_seen")
    cfg, gen, seed = recipe.eval, recipe.eval.generation, recipe.seed
    assert cfg.judge.model == str(out / "psi" / "model") and gen.temperature == 0 and cfg.max_pairs == 6
    assert sum(r["error"] is None for r in saved) >= 3, "the shipped GenRM's chains parse: a real comparison"
    engine = make_engine(cfg.judge)
    try:
        judge = PairwiseJudge(engine, params=SamplingParams(temperature=0.0, top_p=gen.top_p,
                                                            max_tokens=gen.max_tokens, seed=seed),
                              seed=seed, fmt=cfg.pairwise_format, use_stated_preferences=cfg.sec_use_stated_preferences)
        verdicts = judge.judge(inputs, "none", cfg.top_k_profile, both_orders=False)
    finally:
        engine.close()
    assert [(v.raw, v.chosen_slot, v.predicted or "", v.error) for v in verdicts] == [
        (r["raw"], r["chosen_slot"], r["predicted"], r["error"]) for r in saved]


@pytest.mark.timeout(1800)   # a hang: the jobs take 0.5-2.5 min on a fast 2-core machine
def test_submit_bon_sweep(tmp_path, one_node):
    """A Best-of-N sweep as a Ray job: pool, scores, curves, the validity report and mlflow metrics."""
    import yaml

    world = {"users": 6, "cold_start_users": 2, "history_size": 2, "val_pairs_per_user": 0, "test_pairs_per_user": 2}
    recipe = tmp_path / "bon.yaml"
    recipe.write_text(yaml.safe_dump({"name": "bon_job", "seed": 0, "tracking": {"experiment": "bon_job"}, "bon": {
        "policy": {"backend": "hf", "model": "tiny"}, "shards": str(tmp_path / "shards"), "world": world,
        "prompts": 2, "n": 4, "max_tokens": 8,
        "reward_models": {"true_weights": {"kind": "gold", "world": world},
                          "prior_only": {"kind": "world_estimate", "estimator": "no_history", "world": world}},
        "downstream": {"kind": "gold", "normalize": True, "world": world}}}))
    out = tmp_path / "run"
    address, env = one_node
    submit_and_wait(address, env, str(recipe), out, [], command="bon")
    report = json.loads((out / "bon.json").read_text())
    assert set(report["curves"]) == {"true_weights", "prior_only"} and set(report["benchmark_accuracy"]) == {
        "true_weights", "prior_only"}
    assert (out / "correlation.md").is_file() and (out / "bon.png").is_file()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("bon_job").experiment_id])
    assert "bon/true_weights/best_of_4" in run.data.metrics


@pytest.mark.timeout(1800)   # a hang: the jobs take 0.5-2.5 min on a fast 2-core machine
def test_submit_train_rm(tmp_path, one_node):
    """Bradley-Terry RM training as a Ray job: the learner rank and the evaluation task on the cluster."""
    from tests.e2e.test_train_rm import write_recipe

    out = tmp_path / "run"
    address, env = one_node
    submit_and_wait(address, env, str(write_recipe(tmp_path)), out, ["rm.input_modes=[none]", "rm.steps=2"],
                    command="train-rm")
    report = json.loads((out / "report.json").read_text())
    assert [r["mode"] for r in report["rows"]] == ["none"] and (out / "none" / "model" / "config.json").is_file()
    # what the job computed, recomputed here: the exported RM scores every evaluation pair as the job recorded,
    # and the report's accuracies are those scores' (chosen above rejected), per group of users too
    from pr_rlhf.reward.scalar import ScalarRM
    from pr_rlhf.world import WorldConfig, build_world
    from tests.e2e.test_train_rm import WORLD

    recipe, inputs, saved = eval_inputs(out / "none" / "eval")
    cfg = recipe.eval
    assert cfg.scalar_rm.model == str(out / "none" / "model")
    scores = ScalarRM(cfg.scalar_rm).score_pairs(inputs, "none", cfg.top_k_profile)
    assert [x for s in scores for x in (s.chosen, s.rejected)] == pytest.approx(
        [x for r in saved for x in (r["score_chosen"], r["score_rejected"])], abs=1e-5)
    correct = {i.pair_id: s.chosen > s.rejected for i, s in zip(inputs, scores)}
    (row,) = report["rows"]
    assert row["n"] == len(correct) == 12 * 3 + 4 * 2 and row["accuracy"] == sum(correct.values()) / row["n"]
    cold_users = {u.user_id for u in build_world(WorldConfig(**WORLD)).users if u.cold_start}
    cold = {i.pair_id for i in inputs if i.user_id in cold_users}
    for group, ids in (("seen", set(correct) - cold), ("cold-start", cold)):
        assert row["groups"][group]["n"] == len(ids) and row["groups"][group]["accuracy"] == pytest.approx(
            sum(correct[i] for i in ids) / len(ids)), group
