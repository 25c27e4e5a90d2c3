"""The single controller of an RL run: rollout -> reward -> advantages -> update -> weight sync -> log -> checkpoint.

It drives three worker groups on Ray: rollout workers (an hf or vLLM engine each), a reward pool (personalized
rewards, sticky per user), and the learner group (FSDP2 ranks holding policy, reference and, for PPO, critic).
A run is reproducible from its recipe and seed: prompt order, sampling seeds, the reward and the learner's RNG are
all derived from them, and a checkpoint stores everything needed to continue exactly where a killed run stopped
(with `train.rollout_mode: one_step_off` the batch in flight is not saved: the first step after a resume draws its
samples with the restored weights).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pr_rlhf import actors
from pr_rlhf.configs.recipe import Recipe, dump_recipe
from pr_rlhf.configs.rl import RLConfig
from pr_rlhf.models.base import Generation, SamplingParams
from pr_rlhf.models.prompting import load_tokenizer
from pr_rlhf.models.sources import resolve_model
from pr_rlhf.rl.prompts import PromptItem, batch_at, load_prompts, load_warmup_answers, sft_example
from pr_rlhf.shards import ShardReader
from pr_rlhf.stats import mean_ci, paired_difference_ci
from pr_rlhf.tracking import make_tracker
from workers.rl_loop import (
    Colocated,
    OneStepOff,
    generate_sharded,
    read_checkpoint,
    rl_step,
    sft_steps,
    sync_weights,
    write_checkpoint,
)

PER_PROMPT = "heldout_reward_per_prompt"   # an evaluation's mean reward per held-out prompt (same prompts each time)
PER_PROMPT_DOWNSTREAM = "heldout_downstream_per_prompt"   # the same for the downstream scorer (train.downstream)


@dataclass
class RLResult:
    run_dir: Path
    history: list[dict] = field(default_factory=list)     # one dict of metrics per step
    evals: list[dict] = field(default_factory=list)       # held-out evaluations (step, reward mean)
    resumed_from: int = 0
    heldout_users: list[str] = field(default_factory=list)   # the user of each held-out prompt (the CI's unit)


def heldout_rise(first: dict, last: dict, users: list[str], n_bootstrap: int = 2000,
                 seed: int = 0) -> dict[str, float]:
    """Paired rise of the held-out reward between two evaluations: the mean over prompts of (last - first) with a
    95% bootstrap CI resampling users (``users``: each prompt's user; a user's prompts share one reward). Pairing
    removes what differs between users (their attainable reward), which dominates the unpaired CIs of each
    evaluation."""
    rise, low, high = paired_difference_ci(last[PER_PROMPT], first[PER_PROMPT], clusters=users,
                                           n_bootstrap=n_bootstrap, seed=seed)
    return {"rise": rise, "ci_low": low, "ci_high": high, "prompts": len(last[PER_PROMPT]),
            "users": len(set(users))}


def loggable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in (PER_PROMPT, PER_PROMPT_DOWNSTREAM)}


def in_shards_world(reward: Any, shards: str):
    """The world's judges (gold, world_estimate) must judge in the very world the shards were built from: their
    config with the world of the shards' manifest; any other scorer unchanged."""
    if reward.kind not in ("gold", "world_estimate"):
        return reward
    from pr_rlhf.configs.world import WorldConfig

    built = ShardReader(shards).manifest.get("config", {}).get("world")
    if built is None:
        raise ValueError(f"{shards}: {reward.kind} rewards need shards of the synthetic world")
    return reward.model_copy(update={"world": WorldConfig.model_validate(built)})


class RLController:
    """Owns the worker groups of one run; ``run()`` trains ``cfg.steps`` steps (or continues a killed run)."""

    def __init__(self, recipe: Recipe, on_step: Callable[[dict], None] | None = None):
        if recipe.train is None:
            raise ValueError("the recipe has no train: section")
        self.recipe = recipe
        self.cfg: RLConfig = recipe.train
        self.run_dir = Path(self.cfg.out)
        self.ckpt_root = self.run_dir / "checkpoints"
        self.on_step = on_step or (lambda _m: None)
        # a comparing GenRM judges each sample against its group's first sample (see _score)
        self.reward_compares = bool(getattr(recipe.reward, "compares_with_reference", False))
        if self.reward_compares and self.cfg.group_size < 2:
            raise ValueError("reward: a GenRM in sec_reference mode judges each sample against its group's first "
                             f"sample, so train.group_size must be >= 2 (it is {self.cfg.group_size})")
        self.train_prompts, self.heldout_prompts = load_prompts(self.cfg)
        self._workers_started = False
        self.learner: Any = None
        self.reward_pool: Any = None
        self.downstream_pool: Any = None
        self.rollouts: list = []
        self.pipeline: OneStepOff | None = None   # train.rollout_mode one_step_off
        self.colocated: Colocated | None = None   # train.layout colocated
        self._rollout_pg: Any = None
        self.placement: dict = {}

    # ------------------------------------------------------------------------------------------ workers
    def reward_config(self, reward: Any = None):
        """``reward`` (default: the recipe's) judging in the world of the run's shards (:func:`in_shards_world`)."""
        return in_shards_world(reward or self.recipe.reward, self.cfg.data.shards)

    def start_workers(self) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from workers.learner import LearnerGroup
        from workers.ray_utils import reserve_bundles
        from workers.reward import RewardPool
        from workers.rollout import spawn_rollout_worker

        cfg = self.cfg
        learner_cfg = cfg.learner.model_copy(update={"temperature": cfg.temperature, "seed": self.recipe.seed})
        self._workers_started = True  # from here on, shutdown() releases whatever was started
        import ray

        rollout = next(g for g in actors.declare(self.recipe, "train", ray.cluster_resources().get("GPU", 0.0))
                       if g.role == "rollout")
        self.learner = LearnerGroup(learner_cfg, name=None,
                                    colocated=rollout.bundle if rollout.colocated_with else None)
        if rollout.colocated_with:   # engine i in learner rank i's bundle, sharing its device
            pg, engine_cfg = self.learner.placement_group, Colocated.engine(cfg.rollout)
        else:
            self._rollout_pg = pg = reserve_bundles(list(rollout.bundles), rollout.placement_group, "rollout")
            engine_cfg = cfg.rollout
        self.rollouts = [spawn_rollout_worker(engine_cfg, **rollout.options(),
                                              scheduling_strategy=PlacementGroupSchedulingStrategy(
                                                  placement_group=pg, placement_group_bundle_index=i))
                         for i in range(rollout.count)]
        if rollout.colocated_with:
            self.colocated = Colocated(self.rollouts, cfg.sleep_level)
        if cfg.rollout_mode == "one_step_off":
            self.pipeline = OneStepOff(self.rollouts, version=-1)   # the engines' weights are not the learner's yet
        self.reward_pool = RewardPool(self.reward_config())
        if cfg.downstream is not None:
            self.downstream_pool = RewardPool(self.reward_config(cfg.downstream))
        self.placement = self._placement()

    def _placement(self) -> dict:
        """Where every actor of the run landed: node ids, and each node's custom resources."""
        import ray

        from workers.ray_utils import node_resources

        return {"nodes": node_resources(),
                "learner": [info["node_id"] for info in self.learner.describe()],
                "rollout": [info["node_id"] for info in ray.get([w.ready.remote() for w in self.rollouts])],
                "reward": [info["node_id"] for info in ray.get([w.ready.remote() for w in self.reward_pool.workers])]}

    def shutdown(self) -> None:
        if not self._workers_started:
            return
        import ray

        from workers.ray_utils import release_bundles

        for pool in (self.reward_pool, self.downstream_pool):
            if pool is not None:
                pool.close()
        if self.learner is not None:
            self.learner.shutdown()
        for w in self.rollouts:
            ray.kill(w)
        release_bundles(self._rollout_pg)
        self.learner, self.reward_pool, self.downstream_pool = None, None, None
        self.rollouts, self._rollout_pg, self.pipeline, self.colocated = [], None, None, None
        self._workers_started = False

    # ------------------------------------------------------------------------------------------ phases
    def _sync_weights(self, version: int) -> None:
        if self.pipeline is not None:
            self.pipeline.sync(self.learner, version)   # after the generation in flight, if any
        else:
            sync_weights(self.learner, self.rollouts, version)

    def _score(self, items: list[PromptItem], gens: list[Generation], tag: str,
               pool: Any = None) -> tuple[np.ndarray, int]:
        """Every sample's reward (prompt by prompt, samples in order) and how many could not be scored.

        A reward that compares with a reference (the P-GenRM's chain) judges each sample against its prompt's
        first sample: with an exact chain the score is an offset plus the utility difference, and GRPO's group
        baseline removes the offset, so which sample is the reference does not change the advantages."""
        from pr_rlhf.scorers import RewardRequest

        compares = pool is None and self.reward_compares
        requests, group = [], []
        for g_index, (item, gen) in enumerate(zip(items, gens)):
            for sample in gen.samples:
                meta = item.reward_meta()
                if compares:
                    meta["reference"] = gen.samples[0].text
                requests.append(RewardRequest(request_id=f"{tag}/{len(requests)}", user_id=item.user_id,
                                              question=item.question, response=sample.text, meta=meta))
                group.append(g_index)
        results = (pool or self.reward_pool).score(requests)
        failed = np.array([r.error is not None or r.score is None for r in results], dtype=bool)
        if failed.any() and self.cfg.reward_failures == "raise":
            # A reward that could not be computed is not a zero reward: the step stops with a clear error.
            first = next(r for r, f in zip(results, failed) if f)
            raise RuntimeError(f"{int(failed.sum())} of {len(results)} rewards failed, e.g. {first.error} "
                               f"(train.reward_failures: neutral gives them their prompt's mean reward)")
        rewards = np.array([0.0 if f else r.score for r, f in zip(results, failed)], dtype=np.float64)
        group_ids = np.array(group)
        for g in np.unique(group_ids[failed]):
            members = group_ids == g
            scored = members & ~failed
            rewards[members & failed] = rewards[scored].mean() if scored.any() else 0.0
        return rewards, int(failed.sum())

    def _pool_rewards(self, items: list[PromptItem], gens: list[Generation], tag: str) -> tuple[np.ndarray, dict]:
        """The reward pool's score of every sample (the RL step's reward function)."""
        rewards, failed = self._score(items, gens, tag)
        return rewards, {"reward/failed": float(failed)}

    def evaluate(self, step: int) -> dict:
        """Mean reward of sampled answers to held-out users' prompts (seeded: comparable across steps)."""
        items = self.heldout_prompts
        if self.pipeline is not None:   # one step off, the engines are an update behind the learner's weights
            self._sync_weights(step)
        params = SamplingParams(n=self.cfg.eval_samples, temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                                max_tokens=self.cfg.max_tokens, seed=self.recipe.seed + 7_777)
        gens = generate_sharded(self.rollouts, [p.messages for p in items], params)
        index = np.array([i for i, g in enumerate(gens) for _ in g.samples])
        clusters = [items[i].user_id for i in index]   # a user's prompts and samples share one reward

        def per_prompt(values: np.ndarray) -> list[float]:
            return (np.bincount(index, weights=values, minlength=len(items))
                    / np.maximum(np.bincount(index, minlength=len(items)), 1)).tolist()

        rewards, failed = self._score(items, gens, f"eval{step}")
        low, high = mean_ci(rewards, seed=step, clusters=clusters)
        out = {"step": step, "eval/heldout_reward_mean": float(rewards.mean()),
               "eval/heldout_reward_std": float(rewards.std()), "eval/heldout_reward_failed": float(failed),
               "eval/heldout_reward_ci_low": low, "eval/heldout_reward_ci_high": high, PER_PROMPT: per_prompt(rewards)}
        if self.downstream_pool is not None:
            down, _ = self._score(items, gens, f"downstream{step}", self.downstream_pool)
            low, high = mean_ci(down, seed=step, clusters=clusters)
            out.update({"eval/downstream_mean": float(down.mean()), "eval/downstream_ci_low": low,
                        "eval/downstream_ci_high": high, PER_PROMPT_DOWNSTREAM: per_prompt(down)})
        return out

    def train_step(self, step: int) -> dict:
        cfg = self.cfg
        items = batch_at(self.train_prompts, step * cfg.prompts_per_step, cfg.prompts_per_step, self.recipe.seed)
        following = None
        if self.pipeline is not None and step + 1 < cfg.steps:
            following = batch_at(self.train_prompts, (step + 1) * cfg.prompts_per_step, cfg.prompts_per_step,
                                 self.recipe.seed)
        return rl_step(self.learner, self.rollouts, cfg, items,
                       lambda prompts, gens: self._pool_rewards(prompts, gens, f"train{step}"), step, self.recipe.seed,
                       pipeline=self.pipeline, next_prompts=following, colocated=self.colocated)

    def warm_start(self) -> dict:
        """Supervised next-token training on the shards' answers before RL (both answers of each training pair,
        so the policy learns what answers look like, not whom they suit), then the warm-started policy becomes
        the reference that the KL term and the rollout start from."""
        cfg = self.cfg
        tokenizer = load_tokenizer(resolve_model(cfg.learner.model))
        pairs = load_warmup_answers(cfg, self.recipe.seed)
        order = np.random.default_rng([self.recipe.seed, 17]).permutation(len(pairs))

        def batch(step: int) -> list:
            idx = [order[(step * cfg.warmup_sft_batch + i) % len(order)] for i in range(cfg.warmup_sft_batch)]
            return [sft_example(tokenizer, pairs[i][0].messages, pairs[i][1], cfg.max_tokens - 1) for i in idx]

        metrics = sft_steps(self.learner, batch, lambda _step: cfg.warmup_sft_lr, cfg.warmup_sft_steps)
        self.learner.rebase_reference()
        return {f"warmup/{k}": v for k, v in metrics.items()}

    def warm_start_root(self) -> Path | None:
        """``train.warm_start_cache``'s folder for this run's settings (every train field but its own folders and
        the downstream judge, and the seed), or None without a cache."""
        if self.cfg.warm_start_cache is None:
            return None
        settings = self.cfg.model_dump(mode="json", exclude={"out", "warm_start_cache", "downstream"})
        key = hashlib.sha256(json.dumps({"seed": self.recipe.seed, "train": settings}, sort_keys=True).encode())
        return Path(self.cfg.warm_start_cache) / key.hexdigest()[:16]

    def warm_start_or_load(self) -> None:
        """The warm start, or the learner state (weights, optimizer, RNG, reference) a run with the same settings
        saved right after its own."""
        root = self.warm_start_root()
        if root is not None and read_checkpoint(root, self.learner) is not None:
            return
        self.warm_start()
        if root is not None:
            write_checkpoint(root, self.learner, 0, 0, {"warm_start_steps": self.cfg.warmup_sft_steps}, 1)

    # ------------------------------------------------------------------------------------------ checkpoints
    def save(self, step: int, history: list[dict], evals: list[dict]) -> Path:
        """Checkpoint after ``step`` steps: learner state (weights, optimizer, RNG), data position, history."""
        return write_checkpoint(self.ckpt_root, self.learner, step, step * self.cfg.prompts_per_step,
                                {"step": step, "history": history, "evals": evals}, self.cfg.keep_checkpoints)

    def restore(self) -> tuple[int, list[dict], list[dict]]:
        found = read_checkpoint(self.ckpt_root, self.learner) if self.cfg.resume else None
        if found is None:
            return 0, [], []
        state = found[1]
        self._sync_weights(state["step"])
        return int(state["step"]), state["history"], state["evals"]

    # ------------------------------------------------------------------------------------------ the loop
    def run(self) -> RLResult:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "recipe.yaml").write_text(dump_recipe(self.recipe))
        try:
            self.start_workers()
            (self.run_dir / "placement.json").write_text(json.dumps(self.placement, indent=1))
            start, history, evals = self.restore()
            if start == 0:
                if self.cfg.warmup_sft_steps:
                    self.warm_start_or_load()
                self._sync_weights(0)  # the rollout starts from exactly the learner's weights
            tracker = make_tracker(self.recipe.tracking, self.run_dir, f"{self.recipe.name}/{self.cfg.algorithm}",
                                   tags={"stage": f"rl/{self.cfg.algorithm}"})
            with tracker:
                tracker.log_params(self.recipe.model_dump(mode="json"))
                if start == 0:
                    evals.append(self.evaluate(0))
                    tracker.log_metrics(loggable(evals[-1]), step=0)
                for step in range(start, self.cfg.steps):
                    metrics = self.train_step(step)
                    history.append(metrics)
                    tracker.log_metrics(metrics, step=step + 1)
                    done = step + 1
                    if done % self.cfg.eval_every == 0 or done == self.cfg.steps:
                        evals.append(self.evaluate(done))
                        tracker.log_metrics(loggable(evals[-1]), step=done)
                        metrics = {**metrics, **{k: v for k, v in loggable(evals[-1]).items() if k != "step"}}
                    self.on_step(metrics)
                    if done % self.cfg.checkpoint_every == 0 or done == self.cfg.steps:
                        self.save(done, history, evals)
            (self.run_dir / "history.json").write_text(json.dumps(
                {"history": history, "evals": evals, "heldout_users": [p.user_id for p in self.heldout_prompts]},
                indent=1))
            return RLResult(self.run_dir, history, evals, resumed_from=start,
                            heldout_users=[p.user_id for p in self.heldout_prompts])
        finally:
            self.shutdown()


def cpus_needed(recipe: Recipe) -> float:
    """Logical CPUs an RL run's actors ask Ray for (a local Ray must offer at least this many)."""
    return actors.cpus_needed(actors.declare(recipe, "train"))


def run_rl(recipe: Recipe, address: str | None = None, *, on_step: Callable[[dict], None] | None = None,
           log: Callable[[str], None] = print) -> tuple[RLResult, dict[str, float]]:
    """`pr-rlhf train`: the recipe's synthetic world built into its shards when absent, Ray joined at ``address``
    (else a local Ray), the run; returns its result and the paired held-out rise from the first evaluation to the
    last (:func:`heldout_rise`)."""
    import math

    from workers.ray_utils import check_resources, start_driver

    cfg = recipe.train
    if cfg is None:
        raise ValueError("the recipe has no train: section")
    start_driver(address, math.ceil(cpus_needed(recipe)), shards=cfg.data.shards, world=cfg.data.world, log=log)
    check_resources(recipe, "train", log=log)
    result = RLController(recipe, on_step=on_step).run()
    return result, heldout_rise(result.evals[0], result.evals[-1], result.heldout_users)
