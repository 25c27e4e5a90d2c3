"""The single controller of an RL run: rollout -> reward -> advantages -> update -> weight sync -> log -> checkpoint.

It drives three worker groups on Ray: rollout workers (an hf or vLLM engine each), a reward pool (personalized
rewards, sticky per user), and the learner group (FSDP2 ranks holding policy, reference and, for PPO, critic).
A run is reproducible from its recipe and seed: prompt order, sampling seeds, the reward and the learner's RNG are
all derived from them, and a checkpoint stores everything needed to continue exactly where a killed run stopped.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from pr_rlhf.algos import ADVANTAGE_ESTIMATORS, apply_kl_to_rewards, kl_penalty
from pr_rlhf.configs.recipe import Recipe, dump_recipe
from pr_rlhf.eval.metrics import accuracy_ci
from pr_rlhf.models.base import SamplingParams
from pr_rlhf.reward.inputs import policy_messages
from pr_rlhf.shards import ShardReader
from pr_rlhf.tracking import make_tracker
from pr_rlhf.configs.rl import RLConfig, RLDataConfig

PER_PROMPT = "heldout_reward_per_prompt"   # an evaluation's mean reward per held-out prompt (same prompts each time)
COMPLETE = "COMPLETE"          # written last into a checkpoint folder: only complete ones are resumed from
CONTROLLER_STATE = "controller.json"


@dataclass(frozen=True)
class PromptItem:
    prompt_id: str
    user_id: str
    subset: str
    question: str
    messages: list


@dataclass
class RLResult:
    run_dir: Path
    history: list[dict] = field(default_factory=list)     # one dict of metrics per step
    evals: list[dict] = field(default_factory=list)       # held-out evaluations (step, reward mean)
    resumed_from: int = 0


def query_plans(reader: ShardReader, data: RLDataConfig) -> dict[str, list[str]]:
    """query id -> the aspects the policy is shown (``data.plan``: none, or the shards' rubrics)."""
    if data.plan == "none":
        return {}
    plans = {r["query_id"]: [a["aspect"] for a in r["aspects"]] for r in reader.iter_rows("rubrics")}
    if not plans:
        raise ValueError(f"{data.shards}: train.data.plan='rubrics' but the shards hold no rubrics")
    return plans


def make_item(row: dict, data: RLDataConfig, plans: dict[str, list[str]]) -> PromptItem:
    if data.plan != "none" and row["query_id"] not in plans:
        raise ValueError(f"{data.shards}: query {row['query_id']!r} has no rubric (train.data.plan='rubrics')")
    return PromptItem(row["query_id"], row["user_id"], row["subset"], row["question"],
                      policy_messages(row["question"], row["retrieved"], data.profile_top_k,
                                      plans.get(row["query_id"])))


def load_prompts(cfg: RLConfig) -> tuple[list[PromptItem], list[PromptItem]]:
    """Training prompts (queries of seen users) and held-out prompts (cold-start users, or the test split)."""
    reader = ShardReader(cfg.data.shards)
    cold = {(r["user_id"], r["subset"]) for r in reader.iter_rows("profiles") if r["cold_start"]}
    plans = query_plans(reader, cfg.data)

    def items(rows) -> list[PromptItem]:
        return [make_item(r, cfg.data, plans) for r in rows]

    train = items(r for r in reader.iter_rows("queries", cfg.data.train_split)
                  if (r["user_id"], r["subset"]) not in cold)
    if cfg.data.heldout == "cold_start" and cold:
        held = items(r for r in reader.iter_rows("queries") if (r["user_id"], r["subset"]) in cold)
    else:
        held = items(reader.iter_rows("queries", "test"))
    if not train or not held:
        raise ValueError(f"{cfg.data.shards}: {len(train)} training and {len(held)} held-out prompts; need both")
    held = [held[i] for i in np.random.default_rng(0).permutation(len(held))[:cfg.data.heldout_prompts]]
    return train, held


def load_warmup_answers(cfg: RLConfig) -> list[tuple[PromptItem, str]]:
    """(prompt, answer) pairs from the training users' pairs: both answers of each pair, so a warm start learns
    what answers look like without learning whom they suit."""
    reader = ShardReader(cfg.data.shards)
    plans = query_plans(reader, cfg.data)
    out = []
    for r in reader.iter_rows("pairs", cfg.data.train_split):
        item = make_item(r, cfg.data, plans)
        out += [(item, r["chosen"]), (item, r["rejected"])]
    return out


def heldout_rise(first: dict, last: dict, n_bootstrap: int = 2000, seed: int = 0) -> dict[str, float]:
    """Paired rise of the held-out reward between two evaluations: the mean over prompts of (last - first) with a
    95% bootstrap CI over prompts. Pairing removes what differs between users (their attainable reward), which
    dominates the unpaired CIs of each evaluation."""
    diff = np.asarray(last[PER_PROMPT]) - np.asarray(first[PER_PROMPT])
    low, high = accuracy_ci(diff, n_bootstrap=n_bootstrap, seed=seed)
    return {"rise": float(diff.mean()), "ci_low": low, "ci_high": high, "prompts": int(diff.size)}


def loggable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != PER_PROMPT}


def prompt_order(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def batch_at(prompts: list[PromptItem], position: int, count: int, seed: int) -> list[PromptItem]:
    """``count`` prompts starting at global data ``position`` (epochs reshuffle with their own seed)."""
    out = []
    n = len(prompts)
    for pos in range(position, position + count):
        epoch, offset = divmod(pos, n)
        out.append(prompts[prompt_order(n, seed, epoch)[offset]])
    return out


def complete_checkpoints(root: Path) -> list[Path]:
    """The complete ``step_*`` checkpoint folders under ``root``, oldest first."""
    return sorted((p for p in root.glob("step_*") if (p / COMPLETE).exists()), key=lambda p: int(p.name.split("_")[1]))


def write_checkpoint(root: Path, learner: Any, step: int, data_position: Any, state: dict, keep: int) -> Path:
    """``root/step_N``: the learner's state, the caller's ``state`` (JSON) and, last, the COMPLETE marker; all but
    the newest ``keep`` complete checkpoints are removed."""
    path = root / f"step_{step:06d}"
    if path.exists():
        shutil.rmtree(path)
    learner.save_checkpoint(path / "learner", step, data_position)
    (path / CONTROLLER_STATE).write_text(json.dumps(state))
    (path / COMPLETE).write_text("ok\n")
    for old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def read_checkpoint(root: Path, learner: Any) -> tuple[Path, dict] | None:
    """Load the newest complete checkpoint under ``root`` into ``learner``; its path and saved state, or None."""
    done = complete_checkpoints(root)
    if not done:
        return None
    learner.load_checkpoint(done[-1] / "learner")
    return done[-1], json.loads((done[-1] / CONTROLLER_STATE).read_text())


def generate_sharded(rollouts: list, messages: list, params: SamplingParams) -> list:
    """Prompts sharded over the rollout workers; results back in prompt order."""
    import ray

    shards = np.array_split(np.arange(len(messages)), len(rollouts))
    futures = [w.generate.remote([messages[i] for i in idx], params) for w, idx in zip(rollouts, shards) if len(idx)]
    out: list = []
    for part in ray.get(futures):
        out.extend(part)
    return out


def sync_weights(learner: Any, rollouts: list, version: int) -> None:
    """The learner's current weights into every rollout engine (one object-store copy for all)."""
    import ray

    ref = ray.put(learner.state_dict_for_rollout())
    ray.get([w.load_weights.remote(ref, version) for w in rollouts])


def policy_update(learner: Any, cfg: RLConfig, prompt_ids: list[list[int]], response_ids: list[list[int]],
                  rewards: np.ndarray, group: list[int], timer: Timer) -> tuple[dict[str, float], torch.Tensor]:
    """One RL update from scored samples (a sequence reward on each response's last token): the KL term,
    advantages (GRPO groups by ``group``, PPO's critic), the critic and policy updates. Returns the metrics and
    the response lengths."""
    batch: dict[str, Any] = {"prompt_ids": [list(p) for p in prompt_ids],
                             "response_ids": [list(r) or [0] for r in response_ids]}
    n = len(batch["response_ids"])
    lengths = torch.tensor([len(ids) for ids in batch["response_ids"]])
    width = int(lengths.max())
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(n), lengths - 1] = torch.tensor(rewards, dtype=torch.float32)

    metrics: dict[str, float] = {}
    kl_cfg = cfg.learner.kl
    kl_in_reward = kl_cfg.coef > 0 and kl_cfg.where == "reward"
    # a single on-policy step takes the old log-probs from the update's own forward (no separate pass)
    if kl_in_reward or not cfg.learner.single_update(n):
        with timer.phase("old_logprobs"):
            batch["old_logprobs"] = learner.compute_logprobs(batch)
    if kl_in_reward:
        with timer.phase("ref_logprobs"):
            ref = learner.compute_ref_logprobs(batch)
        kl = kl_penalty(batch["old_logprobs"], ref, kl_cfg.kind)
        token_rewards, kl_stats = apply_kl_to_rewards(token_rewards, kl, kl_cfg.coef, mask)
        metrics.update({f"train/{k}": float(v) for k, v in kl_stats.items()})
    with timer.phase("advantages"):
        if cfg.algorithm == "ppo":
            batch["values"] = learner.compute_values(batch)
            adv, returns = ADVANTAGE_ESTIMATORS.call(cfg.advantage_estimator, token_level_rewards=token_rewards,
                                                     values=batch["values"], response_mask=mask,
                                                     gamma=cfg.gamma, lam=cfg.lam)
            batch["returns"] = returns
        else:
            adv, _ = ADVANTAGE_ESTIMATORS.call(cfg.advantage_estimator, token_level_rewards=token_rewards,
                                               response_mask=mask, index=np.array(group))
        batch["advantages"] = adv
    with timer.phase("update"):
        if cfg.algorithm == "ppo":
            metrics.update(learner.update_critic(batch))
        metrics.update(learner.update_policy(batch))
    return metrics, lengths


class Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def phase(self, name: str):
        timer = self

        class _Phase:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                timer.seconds[name] = timer.seconds.get(name, 0.0) + time.perf_counter() - self.t0

        return _Phase()


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
        self.train_prompts, self.heldout_prompts = load_prompts(self.cfg)
        self._workers_started = False
        self.learner: Any = None
        self.reward_pool: Any = None
        self.rollouts: list = []
        self._rollout_pg: Any = None
        self.placement: dict = {}

    # ------------------------------------------------------------------------------------------ workers
    def reward_config(self):
        """The gold reward must judge in the very world the shards were built from: take it from their manifest."""
        reward = self.recipe.reward
        if reward.kind == "gold":
            from pr_rlhf.configs.world import WorldConfig

            built = ShardReader(self.cfg.data.shards).manifest.get("config", {}).get("world")
            if built is None:
                raise ValueError(f"{self.cfg.data.shards}: gold rewards need shards of the synthetic world")
            reward = reward.model_copy(update={"world": WorldConfig.model_validate(built)})
        return reward

    def cpus_needed(self) -> float:
        """Logical CPUs the run's actors ask Ray for (a local Ray must offer at least this many)."""
        cfg = self.cfg
        learner = cfg.learner.world_size * cfg.learner.num_cpus_per_worker
        pool = self.recipe.reward.pool
        return learner + cfg.rollout_workers * cfg.rollout_num_cpus + pool.workers * pool.num_cpus

    def start_workers(self) -> None:
        from workers.learner import LearnerGroup
        from workers.reward import RewardPool
        from workers.rollout import spawn_rollout_worker

        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from workers.ray_utils import reserve_bundles

        cfg = self.cfg
        learner_cfg = cfg.learner.model_copy(update={"temperature": cfg.temperature, "seed": self.recipe.seed})
        self._workers_started = True  # from here on, shutdown() releases whatever was started
        self.learner = LearnerGroup(learner_cfg, name=None)
        bundle = {"CPU": cfg.rollout_num_cpus, **({"GPU": cfg.rollout_num_gpus} if cfg.rollout_num_gpus else {}),
                  **cfg.rollout_resources}
        self._rollout_pg = reserve_bundles([dict(bundle) for _ in range(cfg.rollout_workers)], "PACK", "rollout")
        self.rollouts = [spawn_rollout_worker(cfg.rollout, num_cpus=cfg.rollout_num_cpus,
                                              num_gpus=cfg.rollout_num_gpus, resources=dict(cfg.rollout_resources),
                                              scheduling_strategy=PlacementGroupSchedulingStrategy(
                                                  placement_group=self._rollout_pg,
                                                  placement_group_bundle_index=i))
                         for i in range(cfg.rollout_workers)]
        self.reward_pool = RewardPool(self.reward_config())
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

        if self.reward_pool is not None:
            self.reward_pool.close()
        if self.learner is not None:
            self.learner.shutdown()
        for w in self.rollouts:
            ray.kill(w)
        release_bundles(self._rollout_pg)
        self.learner, self.reward_pool, self.rollouts, self._rollout_pg = None, None, [], None
        self._workers_started = False

    # ------------------------------------------------------------------------------------------ phases
    def _generate(self, messages: list, params: SamplingParams) -> list:
        return generate_sharded(self.rollouts, messages, params)

    def _sync_weights(self, version: int) -> None:
        sync_weights(self.learner, self.rollouts, version)

    def _score(self, items: list[PromptItem], texts: list[str], tag: str) -> np.ndarray:
        from workers.reward import RewardRequest

        requests = [RewardRequest(request_id=f"{tag}/{i}", user_id=item.user_id, question=item.question,
                                  response=text) for i, (item, text) in enumerate(zip(items, texts))]
        results = self.reward_pool.score(requests)
        failed = [r for r in results if r.error is not None or r.score is None]
        if failed:
            # A reward that could not be computed is not a zero reward: the step stops with a clear error.
            raise RuntimeError(f"{len(failed)} of {len(results)} rewards failed, e.g. {failed[0].error}")
        return np.array([r.score for r in results], dtype=np.float64)

    def evaluate(self, step: int) -> dict:
        """Mean reward of sampled answers to held-out users' prompts (seeded: comparable across steps)."""
        items = self.heldout_prompts
        params = SamplingParams(n=self.cfg.eval_samples, temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                                max_tokens=self.cfg.max_tokens, seed=self.recipe.seed + 7_777)
        gens = self._generate([p.messages for p in items], params)
        flat_items = [item for item, g in zip(items, gens) for _ in g.samples]
        texts = [s.text for g in gens for s in g.samples]
        rewards = self._score(flat_items, texts, f"eval{step}")
        # samples of one prompt are not independent: the CI resamples whole prompts
        low, high = accuracy_ci(rewards, seed=step, clusters=[item.prompt_id for item in flat_items])
        index = np.array([i for i, g in enumerate(gens) for _ in g.samples])
        per_prompt = (np.bincount(index, weights=rewards, minlength=len(items))
                      / np.maximum(np.bincount(index, minlength=len(items)), 1)).tolist()
        return {"step": step, "eval/heldout_reward_mean": float(rewards.mean()),
                "eval/heldout_reward_std": float(rewards.std()),
                "eval/heldout_reward_ci_low": low, "eval/heldout_reward_ci_high": high,
                PER_PROMPT: per_prompt}

    def train_step(self, step: int) -> dict:
        cfg = self.cfg
        timer = Timer()
        items = batch_at(self.train_prompts, step * cfg.prompts_per_step, cfg.prompts_per_step, self.recipe.seed)
        params = SamplingParams(n=cfg.group_size, temperature=cfg.temperature, top_p=cfg.top_p,
                                max_tokens=cfg.max_tokens, seed=self.recipe.seed * 1_000_003 + step)
        with timer.phase("rollout"):
            gens = self._generate([p.messages for p in items], params)
        bad = [g.error for g in gens if g.error]
        if bad:
            raise RuntimeError(f"rollout failed for {len(bad)} prompts, e.g. {bad[0]}")
        rows, group = [], []
        for gi, (item, gen) in enumerate(zip(items, gens)):
            for sample in gen.samples:
                rows.append((item, gen.prompt_token_ids, sample))
                group.append(gi)
        with timer.phase("reward"):
            rewards = self._score([r[0] for r in rows], [r[2].text for r in rows], f"train{step}")
        metrics, lengths = policy_update(self.learner, cfg, [r[1] for r in rows], [r[2].token_ids for r in rows],
                                         rewards, group, timer)
        with timer.phase("weight_sync"):
            self._sync_weights(step + 1)
        generated = int(lengths.sum())
        metrics.update({
            "step": step,
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std()),
            "rollout/response_tokens_mean": float(lengths.float().mean()),
            "rollout/tokens_per_s": generated / max(timer.seconds["rollout"], 1e-9),
            **{f"time/{k}_s": v for k, v in timer.seconds.items()},
        })
        return metrics

    def warm_start(self) -> dict:
        """Supervised next-token training on the shards' answers before RL (both answers of each training pair,
        so the policy learns what answers look like, not whom they suit), then the warm-started policy becomes
        the reference that the KL term and the rollout start from."""
        from pr_rlhf.models.prompting import encode_prompt, load_tokenizer
        from pr_rlhf.models.sources import resolve_model

        cfg = self.cfg
        tokenizer = load_tokenizer(resolve_model(cfg.learner.model))
        pairs = load_warmup_answers(cfg)
        order = np.random.default_rng([self.recipe.seed, 17]).permutation(len(pairs))
        metrics: dict = {}
        for step in range(cfg.warmup_sft_steps):
            idx = [order[(step * cfg.warmup_sft_batch + i) % len(order)] for i in range(cfg.warmup_sft_batch)]
            chosen = [pairs[i] for i in idx]
            batch: dict[str, Any] = {
                "prompt_ids": [encode_prompt(tokenizer, item.messages) for item, _ in chosen],
                "response_ids": [tokenizer(text, add_special_tokens=False)["input_ids"][:cfg.max_tokens - 1]
                                 + [tokenizer.eos_token_id] for _, text in chosen],
            }
            metrics = self.learner.update_sft(batch, cfg.warmup_sft_lr)
        self.learner.rebase_reference()
        return {f"warmup/{k}": v for k, v in metrics.items()}

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
                    self.warm_start()
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
            (self.run_dir / "history.json").write_text(json.dumps({"history": history, "evals": evals}, indent=1))
            return RLResult(self.run_dir, history, evals, resumed_from=start)
        finally:
            self.shutdown()
