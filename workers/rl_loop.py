"""The training steps every driver runs on its Ray workers: one RL step (rollout -> reward -> advantages -> update ->
weight sync) and a run of supervised steps, plus what they are built from (sharded generation, weight sync, the
policy update, phase timers) and the checkpoints a killed run resumes from.

The RL controller (``workers/controller.py``), the P-GenRM stages (``workers/pgenrm.py``) and ``tools/psi_probe.py``
train through here (the Best-of-N sweep generates through it); they differ only in the prompts they pick, the reward
function and what they log, which they pass in.
"""
from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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
    """The learner's current weights into every rollout engine (one object-store copy for all)."""
    import ray

    ref = ray.put(learner.state_dict_for_rollout())
    ray.get([w.load_weights.remote(ref, version) for w in rollouts])


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


def rl_step(learner: Any, rollouts: list, cfg: RLConfig, prompts: Sequence[Any], reward_fn: RewardFn, step: int,
            seed: int) -> dict[str, float]:
    """RL step ``step`` (0-based) on ``prompts`` (anything with ``.messages``): ``cfg.group_size`` samples of each
    (seeded by ``seed`` and the step), ``reward_fn`` scores them, one update (``policy_update``: GRPO's groups are
    the prompts), then the new weights go to the rollout engines as version ``step + 1``. Returns the step's
    metrics: the update's, the reward's (and ``reward_fn``'s own), response lengths, seconds per phase."""
    timer = Timer()
    params = SamplingParams(n=cfg.group_size, temperature=cfg.temperature, top_p=cfg.top_p,
                            max_tokens=cfg.max_tokens, seed=seed * 1_000_003 + step)
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
            group.append(gi)
    with timer.phase("reward"):
        rewards, reward_metrics = reward_fn(prompts, gens)
    metrics, lengths = policy_update(learner, cfg, prompt_ids, response_ids, rewards, group, timer)
    with timer.phase("weight_sync"):
        sync_weights(learner, rollouts, step + 1)
    metrics.update({
        "step": step,
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        **reward_metrics,
        "rollout/response_tokens_mean": float(lengths.float().mean()),
        "rollout/tokens_per_s": int(lengths.sum()) / max(timer.seconds["rollout"], 1e-9),
        **{f"time/{k}_s": v for k, v in timer.seconds.items()},
    })
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

def complete_checkpoints(root: Path) -> list[Path]:
    """The complete ``step_*`` checkpoint folders under ``root``, oldest first."""
    return sorted((p for p in root.glob("step_*") if is_complete(p)), key=lambda p: int(p.name.split("_")[1]))


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
