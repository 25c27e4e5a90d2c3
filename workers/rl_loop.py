"""The training steps every driver runs on its Ray workers: one RL step (rollout -> reward -> advantages -> update ->
weight sync) and a run of supervised steps, plus what they are built from (sharded generation, weight sync, the
policy update, phase timers) and the checkpoints a killed run resumes from.

The RL controller (``workers/controller.py``), the P-GenRM stages (``workers/pgenrm.py``) and ``research/psi_probe.py``
train through here (the Best-of-N sweep generates through it); they differ only in the prompts they pick, the reward
function and what they log, which they pass in.
"""
from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pr_rlhf.algos import ADVANTAGE_ESTIMATORS, apply_kl_to_rewards, kl_penalty
from pr_rlhf.configs.rl import RLConfig
from pr_rlhf.files import atomic_write_text, is_complete, mark_complete
from pr_rlhf.models.base import Generation, SamplingParams
from pr_rlhf.rl.prompts import SFTExample

CHECKPOINT_STATE = "controller.json"   # the driver's own state in a checkpoint folder (beside the learner's)

# (prompts, their generations) -> one reward per sample (prompt by prompt, samples in order) and extra metrics
RewardFn = Callable[[Sequence[Any], list[Generation]], tuple[np.ndarray, dict[str, float]]]


class Timer:
    """Seconds spent per named phase (a phase entered twice adds up)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------------------------
# Rollout workers
# ---------------------------------------------------------------------------------------------------------------

def generate_sharded(rollouts: list, messages: list, params: SamplingParams) -> list[Generation]:
    """Prompts sharded over the rollout workers; results back in prompt order."""
    import ray

    shards = np.array_split(np.arange(len(messages)), len(rollouts))
    futures = [w.generate.remote([messages[i] for i in idx], params) for w, idx in zip(rollouts, shards) if len(idx)]
    out: list = []
    for part in ray.get(futures):
        out.extend(part)
    return out


def sync_weights(learner: Any, rollouts: list, version: int) -> None:
    """The learner's current weights into every rollout engine (``LearnerGroup.push_weights``: a broadcast over
    the weight-update group, never through this driver)."""
    learner.push_weights(rollouts, version)


# ---------------------------------------------------------------------------------------------------------------
# RL
# ---------------------------------------------------------------------------------------------------------------

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


@dataclass
class ScoredRollouts:
    """The samples of one draw of prompts, flattened (prompt by prompt, samples in order), with their rewards."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    group: list[int]                  # GRPO group of each sample
    rewards: np.ndarray
    metrics: dict[str, float]

    def zero_std_groups(self) -> set[int]:
        """The groups whose rewards are all equal (they carry no advantage, hence no gradient)."""
        by_group: dict[int, list[float]] = {}
        for g, r in zip(self.group, self.rewards.tolist()):
            by_group.setdefault(g, []).append(r)
        return {g for g, rs in by_group.items() if max(rs) - min(rs) <= 1e-9}

    def only(self, keep: set[int]) -> ScoredRollouts:
        idx = [i for i, g in enumerate(self.group) if g in keep]
        return ScoredRollouts([self.prompt_ids[i] for i in idx], [self.response_ids[i] for i in idx],
                              [self.group[i] for i in idx], self.rewards[idx], self.metrics)

    @staticmethod
    def concat(parts: list[ScoredRollouts]) -> ScoredRollouts:
        return ScoredRollouts([p for s in parts for p in s.prompt_ids], [r for s in parts for r in s.response_ids],
                              [g for s in parts for g in s.group], np.concatenate([s.rewards for s in parts]),
                              parts[0].metrics)


def samples_per_prompt(cfg: RLConfig, group_of: Sequence[int]) -> int:
    """``cfg.group_size`` split evenly over the prompts of each group (e.g. a pair in both response orders)."""
    sizes = set(Counter(group_of).values())
    if len(sizes) != 1 or cfg.group_size % next(iter(sizes)):
        raise ValueError(f"every GRPO group needs the same number of prompts dividing group_size "
                         f"{cfg.group_size}; got {sorted(sizes)} prompts per group")
    return cfg.group_size // next(iter(sizes))


def sample_and_score(rollouts: list, cfg: RLConfig, prompts: Sequence[Any], group_of: Sequence[int],
                     reward_fn: RewardFn, seed: int, timer: Timer, logprobs: bool = False) -> ScoredRollouts:
    """Samples of every prompt (``samples_per_prompt``), scored by ``reward_fn``; group ids as ``group_of``."""
    params = SamplingParams(n=samples_per_prompt(cfg, group_of), temperature=cfg.temperature, top_p=cfg.top_p,
                            max_tokens=cfg.max_tokens, seed=seed, logprobs=logprobs)
    with timer.phase("rollout"):
        gens = generate_sharded(rollouts, [p.messages for p in prompts], params)
    bad = [g.error for g in gens if g.error]
    if bad:
        raise RuntimeError(f"rollout failed for {len(bad)} prompts, e.g. {bad[0]}")
    prompt_ids, response_ids, group = [], [], []
    for gi, gen in enumerate(gens):
        for sample in gen.samples:
            prompt_ids.append(gen.prompt_token_ids)
            response_ids.append(sample.token_ids)
            group.append(group_of[gi])
    with timer.phase("reward"):
        rewards, reward_metrics = reward_fn(prompts, gens)
    return ScoredRollouts(prompt_ids, response_ids, group, np.asarray(rewards, dtype=np.float64), reward_metrics)


# (refill round, number of groups wanted) -> (prompts, group id of each prompt), group ids unused so far
RefillFn = Callable[[int, int], tuple[Sequence[Any], Sequence[int]]]


def rl_step(learner: Any, rollouts: list, cfg: RLConfig, prompts: Sequence[Any], reward_fn: RewardFn, step: int,
            seed: int, *, group_of: Sequence[int] | None = None, refill: RefillFn | None = None,
            refill_rounds: int = 0, logprobs: bool = False) -> dict[str, float]:
    """RL step ``step`` (0-based) on ``prompts`` (anything with ``.messages``): ``cfg.group_size`` samples per GRPO
    group (seeded by ``seed`` and the step; ``group_of[i]`` is prompt i's group, default its own: a group of two
    prompts, e.g. one pair in both response orders, gets half of the samples on each), ``reward_fn`` scores them,
    one update (``policy_update``), then the new weights go to the rollout engines as version ``step + 1``.

    Dynamic sampling: with ``refill`` and ``refill_rounds > 0``, groups whose rewards are all equal are dropped and
    up to that many rounds of fresh groups (``refill(round, count)``) are drawn in their place; the reward metrics
    stay those of the scheduled prompts. Returns the step's metrics: the update's, the reward's (and
    ``reward_fn``'s own), ``reward/frac_zero_std`` (the share of groups without reward variance), response
    lengths, seconds per phase."""
    timer = Timer()
    group_of = list(range(len(prompts))) if group_of is None else list(group_of)
    first = sample_and_score(rollouts, cfg, prompts, group_of, reward_fn, seed * 1_000_003 + step, timer, logprobs)
    zero = first.zero_std_groups()
    n_groups = len(set(group_of))
    batch, refilled = first, 0
    if refill is not None and refill_rounds > 0 and zero:
        parts = [first.only(set(group_of) - zero)]
        wanted = len(zero)
        for rnd in range(refill_rounds):
            more, more_groups = refill(rnd, wanted)
            if not more:
                break
            part = sample_and_score(rollouts, cfg, more, more_groups, reward_fn,
                                    (seed * 1_000_003 + step) * 31 + rnd + 1, timer, logprobs)
            refilled += len(set(more_groups))
            informative = set(more_groups) - part.zero_std_groups()
            parts.append(part.only(informative))
            wanted -= len(informative)
            if wanted <= 0:
                break
        kept = ScoredRollouts.concat(parts)
        batch = kept if kept.group else first   # nothing informative anywhere: the scheduled batch (KL only)
    metrics, lengths = policy_update(learner, cfg, batch.prompt_ids, batch.response_ids, batch.rewards,
                                     batch.group, timer)
    with timer.phase("weight_sync"):
        sync_weights(learner, rollouts, step + 1)
    metrics.update({
        "step": step,
        "reward/mean": float(first.rewards.mean()),
        "reward/std": float(first.rewards.std()),
        "reward/frac_zero_std": len(zero) / max(n_groups, 1),
        **first.metrics,
        "rollout/response_tokens_mean": float(lengths.float().mean()),
        "rollout/tokens_per_s": int(lengths.sum()) / max(timer.seconds["rollout"], 1e-9),
        **{f"time/{k}_s": v for k, v in timer.seconds.items()},
    })
    if refill is not None and refill_rounds > 0:
        metrics.update({"rollout/refill_groups": float(refilled),
                        "rollout/update_groups": float(len(set(batch.group))),
                        "reward/update_mean": float(batch.rewards.mean())})
    return metrics


# ---------------------------------------------------------------------------------------------------------------
# Supervised steps
# ---------------------------------------------------------------------------------------------------------------

def sft_steps(learner: Any, batch: Callable[[int], Sequence[SFTExample]], lr_at: Callable[[int], float | None],
              steps: int, first: int = 0, on_step: Callable[[int, dict[str, float]], None] | None = None
              ) -> dict[str, float]:
    """Supervised steps ``first .. steps - 1``: step ``s`` trains on ``batch(s)`` at learning rate ``lr_at(s)``
    (None: the learner's own) with ``learner.update_sft``; ``on_step(s, metrics)`` after each (log, checkpoint).
    Returns the last step's metrics ({} when there was none)."""
    metrics: dict[str, float] = {}
    for step in range(first, steps):
        examples = batch(step)
        metrics = learner.update_sft({"prompt_ids": [p for p, _ in examples],
                                      "response_ids": [t for _, t in examples]}, lr_at(step))
        if on_step is not None:
            on_step(step, metrics)
    return metrics


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------------

def checkpoint_step(path: Path) -> int:
    """The step of a ``step_N`` checkpoint folder."""
    return int(path.name.split("_")[1])


def complete_checkpoints(root: Path) -> list[Path]:
    """The complete ``step_*`` checkpoint folders under ``root``, oldest first."""
    return sorted((p for p in root.glob("step_*") if is_complete(p)), key=checkpoint_step)


def write_checkpoint(root: Path, learner: Any, step: int, data_position: Any, state: dict, keep: int) -> Path:
    """``root/step_N``: the learner's state, the caller's ``state`` (JSON) and, last, the COMPLETE marker; all but
    the newest ``keep`` complete checkpoints are removed."""
    path = root / f"step_{step:06d}"
    if path.exists():
        shutil.rmtree(path)
    learner.save_checkpoint(path / "learner", step, data_position)
    atomic_write_text(path / CHECKPOINT_STATE, json.dumps(state))
    mark_complete(path)
    for old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def read_checkpoint(root: Path, learner: Any) -> tuple[Path, dict] | None:
    """Load the newest complete checkpoint under ``root`` into ``learner``; its path and saved state, or None."""
    done = complete_checkpoints(root)
    if not done:
        return None
    learner.load_checkpoint(done[-1] / "learner")
    return done[-1], json.loads((done[-1] / CHECKPOINT_STATE).read_text())
