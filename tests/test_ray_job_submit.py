"""`ray job submit` of the GRPO recipe against a Ray head this test starts on 127.0.0.1 (and stops: only it)."""
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RAY = str(ROOT / ".venv" / "bin" / "ray") if (ROOT / ".venv" / "bin" / "ray").exists() else "ray"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def local_head(tmp_path):
    # Own ports for everything another Ray on this machine (e.g. the test session's cluster) may already hold.
    env = {**os.environ, "RAY_PORT": str(free_port()), "RAY_DASHBOARD_PORT": str(free_port()),
           "RAY_AGENT_PORT": str(free_port()), "RAY_AGENT_GRPC_PORT": str(free_port()),
           "RAY_METRICS_PORT": str(free_port()), "RAY_CLIENT_PORT": str(free_port()),
           "RAY_NUM_CPUS": "4", "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    # Ray's unix sockets live under the temp dir and their paths may not exceed 107 bytes: keep it short.
    temp_dir = Path(tempfile.mkdtemp(prefix="prr-"))
    script = str(ROOT / "cluster" / "local_head.sh")
    address = subprocess.run(["bash", script, "start", str(temp_dir)], env=env, check=True, capture_output=True,
                             text=True, timeout=180).stdout.strip()
    try:
        yield address, env
    finally:
        subprocess.run(["bash", script, "stop", str(temp_dir)], env=env, timeout=120)
        left = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert f"{temp_dir}/session_" not in left, "the test's Ray cluster is still running"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_submit_grpo_recipe(local_head, tmp_path):
    from pr_rlhf.config import DataConfig
    from data_pipelines.build import build_shards
    from pr_rlhf.world.config import WorldConfig

    address, env = local_head
    shards = tmp_path / "shards"
    build_shards(DataConfig(source="synthetic", out=str(shards), retrieval={"embedder": "bm25"}),
                 WorldConfig(users=12, cold_start_users=3, rendering="compact", reference_samples=200))
    out = tmp_path / "run"
    sets = ["train.rollout.backend=hf", "train.rollout.model=tiny", "train.rollout.dtype=float32",
            "train.learner.model=tiny", "train.learner.world_size=1", "train.steps=2", "train.prompts_per_step=2",
            "train.group_size=4", "train.max_tokens=8", "train.eval_every=2", "train.checkpoint_every=2",
            "train.data.heldout_prompts=2", "train.eval_samples=2", "train.data.profile_top_k=0",
            "reward.pool.num_cpus=0.5", f"train.data.shards={shards}"]
    entry = ["python", "-m", "pr_rlhf.cli", "train", "recipes/grpo_personalized.yaml", "--out", str(out)]
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
    deadline = time.time() + 600
    status = client.get_job_status(job_id)
    while time.time() < deadline and not status.is_terminal():
        time.sleep(3)
        status = client.get_job_status(job_id)
    assert status == JobStatus.SUCCEEDED, client.get_job_logs(job_id)[-3000:]
    history = json.loads((out / "history.json").read_text())
    assert len(history["history"]) == 2 and "eval/heldout_reward_mean" in history["evals"][-1]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("grpo_personalized").experiment_id])
    assert "reward/mean" in run.data.metrics and "time/rollout_s" in run.data.metrics
