"""Personalized vs global rewards under GRPO, shrunk: the same policy trained on each user's gold reward serves
held-out users better than one trained on the population's preference. A file of its own (not tests/e2e/test_rl.py)
so that parallel test workers can run it beside the other RL tests."""
from pathlib import Path

import pytest

from pr_rlhf.configs.recipe import load_recipe
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(2400)   # a hang: ~4 min on a fast 2-core machine, twice that on a slow one
def test_personalized_reward_beats_a_global_one_downstream(ray_cluster, tmp_path):  # noqa: F811
    """The shipped personalized-vs-global recipe, shrunk (a smaller world, fewer steps, two arms that need no
    trained RM): the same instruction-following tiny policy trained on each user's gold reward serves held-out
    users better than one trained on the population's preference, paired over the same prompts, CI above 0."""
    from workers.rl_sweep import run_rl_sweep

    shrunk = [f"train.data.shards={tmp_path / 'shards'}", f"rl_sweep.out={tmp_path / 'sweep'}",
              "world.users=150", "world.cold_start_users=30", "world.reference_samples=600",
              "train.steps=24", "train.eval_every=24", "train.checkpoint_every=24",
              "train.warmup_sft_steps=120", "train.data.heldout_prompts=64", "tracking.enabled=false",
              "rl_sweep.arms={gold: {kind: gold}, prior: {kind: world_estimate, estimator: no_history}}",
              "rl_sweep.baseline=prior", "rl_sweep.benchmark_accuracy={}"]
    result = run_rl_sweep(load_recipe(ROOT / "recipes" / "ppo_personalized_vs_global.yaml", shrunk))
    rows = result["rows"]
    vs = rows["gold"]["vs_baseline"]
    assert vs["measure"] == "downstream" and vs["prompts"] == 64
    assert vs["ci_low"] > 0, vs
    assert set(vs["groups"]) <= {"agree", "disagree"} and sum(g["prompts"] for g in vs["groups"].values()) == 64
    assert rows["gold"]["benchmark_accuracy"] > rows["prior"]["benchmark_accuracy"]
    text = result["files"].markdown.read_text()
    assert "| gold |" in text and "(baseline)" in text
    assert (tmp_path / "sweep" / "correlation.md").is_file() and (tmp_path / "sweep" / "downstream.json").is_file()
