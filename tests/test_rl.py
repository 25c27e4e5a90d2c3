"""RL on Ray with the tiny policy on the synthetic world: a run interrupted mid-way and resumed ends with exactly the
weights of an uninterrupted run."""
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from data_pipelines.build import build_shards
from pr_rlhf.config import DataConfig, load_recipe
from pr_rlhf.world.config import WorldConfig
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)

ROOT = Path(__file__).resolve().parents[1]
TINY = ["train.rollout.backend=hf", "train.rollout.model=tiny", "train.rollout.dtype=float32",
        "train.learner.model=tiny", "train.learner.world_size=1", "train.learner.kl.coef=0",
        "train.data.profile_top_k=0", "train.max_tokens=16", "reward.pool.num_cpus=0.5"]


@pytest.fixture(scope="module")
def world_shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("rl_world") / "shards"
    data = DataConfig(source="synthetic", out=str(out), retrieval={"embedder": "bm25"})
    build_shards(data, WorldConfig(users=40, cold_start_users=10, rendering="compact", reference_samples=300))
    return out


def recipe(name: str, shards: Path, out: Path, *overrides: str):
    return load_recipe(ROOT / "recipes" / name, [*TINY, f"train.data.shards={shards}", f"train.out={out}",
                                                 *overrides])


def final_policy(run_dir: Path, step: int) -> dict:
    return load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "learner" / "policy" / "model.safetensors"))


class Interrupt(RuntimeError):
    pass


def test_interrupted_run_resumes_to_the_same_weights(ray_cluster, world_shards, tmp_path):
    from workers.controller import RLController

    small = ["train.steps=4", "train.prompts_per_step=2", "train.group_size=4", "train.max_tokens=8",
             "train.checkpoint_every=1", "train.keep_checkpoints=5", "train.eval_every=2",
             "train.warmup_sft_steps=2", "train.warmup_sft_batch=4", "train.learner.lr=1e-3",
             "train.data.heldout_prompts=4", "train.eval_samples=2", "tracking.enabled=false"]
    full = RLController(recipe("grpo_personalized.yaml", world_shards, tmp_path / "full", *small)).run()
    assert len(full.history) == 4

    def crash_after_step_3(metrics):
        if metrics["step"] == 2:  # step index 2 = the third step, before its checkpoint is written
            raise Interrupt("killed mid-run")

    cut = recipe("grpo_personalized.yaml", world_shards, tmp_path / "cut", *small)
    with pytest.raises(Interrupt):
        RLController(cut, on_step=crash_after_step_3).run()
    resumed = RLController(cut).run()
    assert resumed.resumed_from == 2 and len(resumed.history) == 4
    a, b = final_policy(tmp_path / "full", 4), final_policy(tmp_path / "cut", 4)
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a), "resumed run diverged from the uninterrupted one"
    assert [h["reward/mean"] for h in resumed.history] == [h["reward/mean"] for h in full.history]
    assert not np.array_equal(a["model.embed_tokens.weight"],
                              final_policy(tmp_path / "full", 1)["model.embed_tokens.weight"])  # it trained
