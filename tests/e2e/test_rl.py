"""RL on Ray with the tiny policy on the synthetic world: GRPO and PPO raise the held-out users' reward, and a run
interrupted mid-way and resumed ends with exactly the weights of an uninterrupted run."""
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from data_pipelines.build import ensure_world_shards
from pr_rlhf.configs.recipe import load_recipe
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)
from workers.controller import PER_PROMPT, PER_PROMPT_DOWNSTREAM, loggable

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world_shards(tmp_path_factory):
    """The tiny recipes' own world (compact rendering, users who partly agree), built as `pr-rlhf train` would."""
    out = tmp_path_factory.mktemp("rl_world") / "shards"
    assert ensure_world_shards(out, load_recipe(ROOT / "recipes" / "grpo_tiny.yaml").train.data.world)
    return out


def recipe(name: str, shards: Path, out: Path, *overrides: str):
    return load_recipe(ROOT / "recipes" / name, [f"train.data.shards={shards}", f"train.out={out}", *overrides])


def final_policy(run_dir: Path, step: int) -> dict:
    return load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "learner" / "policy" / "model.safetensors"))


@pytest.fixture(scope="module")
def shipped_run(ray_cluster, world_shards, tmp_path_factory):  # noqa: F811
    """``run(recipe, *overrides)``: the run of a shipped recipe, once per module (tests compare against them)."""
    from workers.controller import RLController

    done: dict = {}

    def run(name: str, *overrides: str):
        if (name, overrides) not in done:
            out = tmp_path_factory.mktemp(name.removesuffix(".yaml")) / "run"
            done[name, overrides] = RLController(recipe(name, world_shards, out, *overrides)).run()
        return done[name, overrides]

    return run


def test_world_shards_are_reused_and_never_confused(world_shards):
    world = load_recipe(ROOT / "recipes" / "grpo_tiny.yaml").train.data.world
    assert ensure_world_shards(world_shards, world) is False        # same world: kept as is
    with pytest.raises(ValueError, match="another world"):
        ensure_world_shards(world_shards, world.model_copy(update={"seed": 1}))


@pytest.mark.timeout(1800)   # a hang: PPO takes ~2.5 min on a fast 2-core machine, twice that on a slow one
@pytest.mark.parametrize("name", ["grpo_tiny.yaml", "ppo_tiny.yaml"])
def test_heldout_reward_rises(shipped_run, name):
    """The shipped tiny recipes, unchanged: the mean reward on cold-start users (never trained on) rises from step
    0 to step 20, the 95% bootstrap CI of the rise (paired over the held-out prompts, resampling users) above zero."""
    from workers.controller import heldout_rise

    result = shipped_run(name)
    first, last = result.evals[0], result.evals[-1]
    assert (first["step"], last["step"]) == (0, 20)
    rise = heldout_rise(first, last, result.heldout_users)
    assert rise["ci_low"] > 0 and rise["rise"] > 0.3, (rise, [loggable(e) for e in result.evals])
    train = [h["reward/mean"] for h in result.history]
    assert np.mean(train[-5:]) > np.mean(train[:5]), train
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{(result.run_dir / 'mlflow.db').resolve().as_posix()}")
    [run] = client.search_runs([client.get_experiment_by_name(result_name(name)).experiment_id])
    logged = [m.value for m in client.get_metric_history(run.info.run_id, "eval/heldout_reward_mean")]
    assert logged == pytest.approx([e["eval/heldout_reward_mean"] for e in result.evals])
    for key in ("reward/std", "actor/entropy", "actor/clipfrac", "rollout/tokens_per_s", "time/update_s"):
        assert len(client.get_metric_history(run.info.run_id, key)) == 20, key


@pytest.mark.timeout(1800)
def test_one_step_off_rollout_learns(shipped_run):
    """The shipped grpo_tiny with the one-step-off rollout: each step after the first trains on samples the previous
    weights drew (staleness 1), corrected by importance weights near 1, and the held-out reward still rises, the 95%
    CI of the rise (users resampled) above zero. The pre-registered comparison with the sequential step over seeds
    is docs/results/async_rollout (tests/unit/test_async_rollout_results.py recomputes it)."""
    from workers.controller import heldout_rise

    result = shipped_run("grpo_tiny.yaml", "train.rollout_mode=one_step_off")
    assert [h["rollout/staleness"] for h in result.history] == [0.0] + [1.0] * 19
    weights = [h["actor/is_weight_mean"] for h in result.history]
    assert abs(weights[0] - 1.0) < 1e-3 and all(0.8 < w < 1.2 for w in weights), weights   # step 0 is on-policy
    rise = heldout_rise(result.evals[0], result.evals[-1], result.heldout_users)
    assert rise["ci_low"] > 0 and rise["rise"] > 0.2, (rise, [loggable(e) for e in result.evals])


@pytest.mark.timeout(1800)
def test_colocated_layout_learns_as_the_split_one(shipped_run):
    """The hybrid engine on CPU: grpo_tiny with each rollout engine in its learner rank's bundle, sleeping during the
    update and waking for the transfer (vLLM's sleep and wake are no-ops on CPU; the hf engine has nothing to free
    there), learns exactly what the split layout learns on the same seed: the held-out reward of every prompt at
    every evaluation, hence a paired difference of 0 with its user-resampled CI."""
    from workers.controller import PER_PROMPT, heldout_rise

    split, colocated = shipped_run("grpo_tiny.yaml"), shipped_run("grpo_tiny.yaml", "train.layout=colocated")
    placement = json.loads((colocated.run_dir / "placement.json").read_text())
    assert placement["rollout"] == placement["learner"]
    phases = [k for k in colocated.history[0] if k.startswith("time/")]
    assert phases.index("time/rollout_s") < phases.index("time/sleep_s") < phases.index("time/update_s") \
        < phases.index("time/wake_s") < phases.index("time/weight_sync_s")
    for a, b in zip(colocated.evals, split.evals):
        assert a[PER_PROMPT] == b[PER_PROMPT], a["step"]
    paired = heldout_rise(split.evals[-1], colocated.evals[-1], colocated.heldout_users)
    assert (paired["rise"], paired["ci_low"], paired["ci_high"]) == (0.0, 0.0, 0.0)


def result_name(recipe_file: str) -> str:
    return load_recipe(ROOT / "recipes" / recipe_file).tracking.experiment


class Interrupt(RuntimeError):
    pass


SMALL = ["train.steps=4", "train.prompts_per_step=2", "train.group_size=4", "train.max_tokens=8",
         "train.checkpoint_every=1", "train.keep_checkpoints=5", "train.eval_every=2",
         "train.warmup_sft_steps=2", "train.warmup_sft_batch=4", "train.learner.lr=1e-3",
         "train.data.heldout_prompts=4", "train.eval_samples=2", "tracking.enabled=false",
         "train.downstream={kind: gold}"]


def test_interrupted_run_resumes_to_the_same_weights(ray_cluster, world_shards, tmp_path):  # noqa: F811
    from workers.controller import RLController

    small = SMALL
    full = RLController(recipe("grpo_tiny.yaml", world_shards, tmp_path / "full", *small)).run()
    assert len(full.history) == 4
    # the downstream scorer (here the same gold reward) scores the very samples of each held-out evaluation
    last = full.evals[-1]
    assert last[PER_PROMPT_DOWNSTREAM] == pytest.approx(last[PER_PROMPT]) and len(last[PER_PROMPT]) == 4
    assert last["eval/downstream_mean"] == pytest.approx(last["eval/heldout_reward_mean"])

    def crash_after_step_3(metrics):
        if metrics["step"] == 2:  # step index 2 = the third step, before its checkpoint is written
            raise Interrupt("killed mid-run")

    cut = recipe("grpo_tiny.yaml", world_shards, tmp_path / "cut", *small)
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
    from pr_rlhf.rl.compare import compare_runs

    same = compare_runs(tmp_path / "cut", tmp_path / "full")   # the same policy: no difference, paired
    assert same["measure"] == "downstream" and same["prompts"] == 4 and same["gain"] == pytest.approx(0.0)


def test_a_cached_warm_start_is_the_warm_start(ray_cluster, world_shards, tmp_path):  # noqa: F811
    """Runs with the same settings share one warm start (as a sweep's arms do): the run that loads it ends with
    bitwise the weights and rewards of the one that trained it; other settings get their own."""
    from workers.controller import RLController

    cache = f"train.warm_start_cache={tmp_path / 'warm'}"
    trained = RLController(recipe("grpo_tiny.yaml", world_shards, tmp_path / "a", *SMALL, cache))
    trained_result = trained.run()
    assert len(list((tmp_path / "warm").iterdir())) == 1
    loading = RLController(recipe("grpo_tiny.yaml", world_shards, tmp_path / "b", *SMALL, cache))
    assert loading.warm_start_root() == trained.warm_start_root()

    def trained_again():
        raise AssertionError("the cached warm start was trained again")

    loading.warm_start = trained_again
    loaded_result = loading.run()
    a, b = final_policy(tmp_path / "a", 4), final_policy(tmp_path / "b", 4)
    assert all(np.array_equal(a[k], b[k]) for k in a), "the loaded warm start diverged from the trained one"
    assert [h["reward/mean"] for h in loaded_result.history] == [h["reward/mean"] for h in trained_result.history]
    other = RLController(recipe("grpo_tiny.yaml", world_shards, tmp_path / "c", *SMALL, cache,
                                "train.warmup_sft_steps=3"))
    assert other.warm_start_root() != trained.warm_start_root()
