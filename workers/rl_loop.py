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

def launch_generation(rollouts: list, messages: list, params: SamplingParams) -> list:
    """Prompts sharded over the rollout workers; the workers' futures, in prompt order (:func:`collect_generation`)."""
    shards = np.array_split(np.arange(len(messages)), len(rollouts))
    return [w.generate.remote([messages[i] for i in idx], params) for w, idx in zip(rollouts, shards) if len(idx)]


def collect_generation(futures: list) -> list[Generation]:
    import ray

    out: list = []
    for part in ray.get(futures):
        out.extend(part)
    return out


def generate_sharded(rollouts: list, messages: list, params: SamplingParams) -> list[Generation]:
    """Prompts sharded over the rollout workers; results back in prompt order."""
    return collect_generation(launch_generation(rollouts, messages, params))


def sync_weights(learner: Any, rollouts: list, version: int) -> None:
    """The learner's current weights into every rollout engine (``LearnerGroup.push_weights``: a broadcast over
    the weight-update group, never through this driver)."""
    learner.push_weights(rollouts, version)


class OneStepOff:
    """One-step-off asynchronous rollout for the split layout (``train.rollout_mode: one_step_off``): while the
    learner trains on step t's samples, the engines already generate step t+1's with the weights of step t (one
    update old); at step t+1 the driver takes them, brings the engines to the learner's weights while they are
    idle, and launches step t+2's generation before it scores and updates. The samples keep the engines'
    log-probs and the version of the weights that drew them (the staleness the loss corrects for)."""

    def __init__(self, rollouts: list, version: int) -> None:
        self.rollouts = rollouts
        self.version = version                              # the weights the engines hold
        self._pending: tuple[int, list, int] | None = None  # (step, futures, weights version)

    def launch(self, step: int, messages: list, params: SamplingParams) -> None:
        self._pending = (step, launch_generation(self.rollouts, messages, params), self.version)

    def take(self, step: int, messages: list, params: SamplingParams) -> tuple[list[Generation], int]:
        """Step ``step``'s generations and the weights version that drew them: those launched for it, else (the
        first step, or the first after a resume) generated now with the engines' weights."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == step:
            return collect_generation(pending[1]), pending[2]
        self._settle(pending)
        return generate_sharded(self.rollouts, messages, params), self.version

    def sync(self, learner: Any, version: int) -> None:
        """The learner's weights (``version``) into the engines, once a generation in flight has finished (an
        engine takes a weight update between requests, never in the middle of one)."""
        if version == self.version:
            return
        self._settle(self._pending)
        sync_weights(learner, self.rollouts, version)
        self.version = version

    @staticmethod
    def _settle(pending: tuple[int, list, int] | None) -> None:
        if pending is not None:
            import ray

            ray.wait(pending[1], num_returns=len(pending[1]))


class Colocated:
    """The hybrid engine's phases (``train.layout: colocated``): each rollout engine shares a learner rank's device,
    so after the rollout the engines sleep (vLLM's sleep ``level``: KV cache freed, weights offloaded or freed)
    while the learner updates, then wake their weights, take the new ones and wake their KV cache for the next
    rollout. On CPU vLLM's worker treats sleep and wake as no-ops; ``log`` keeps the order the phases of the last step
    ran in."""

    def __init__(self, rollouts: list, level: int) -> None:
        self.rollouts = rollouts
        self.level = level
        self.log: list[str] = []

    @staticmethod
    def engine(cfg: Any) -> Any:
        """The rollout engine's config when colocated: vLLM built with its sleep mode (GPU), and its weights staged
        through host memory unless a transfer is named (NCCL refuses two ranks on one GPU)."""
        if getattr(cfg, "backend", "") != "vllm":
            return cfg
        return cfg.model_copy(update={"enable_sleep_mode": True, "weight_transfer": (
            "gloo" if cfg.weight_transfer == "auto" else cfg.weight_transfer)})

    def _all(self, method: str, *args: Any) -> None:
        import ray

        ray.get([getattr(r, method).remote(*args) for r in self.rollouts])

    def sleep(self) -> None:
        self._all("sleep", self.level)
        self.log = ["sleep"]   # a step starts here: the log holds one step, not the run

    def wake(self, tags: list[str]) -> None:
        self._all("wake_up", tags)
        self.log.append("wake " + "+".join(tags))


# ---------------------------------------------------------------------------------------------------------------
# RL
# ---------------------------------------------------------------------------------------------------------------

def policy_update(learner: Any, cfg: RLConfig, prompt_ids: list[list[int]], response_ids: list[list[int]],
                  rewards: np.ndarray, group: list[int], timer: Timer,
                  behaviour_logprobs: list[list[float]] | None = None) -> tuple[dict[str, float], torch.Tensor]:
    """One RL update from scored samples (a sequence reward on each response's last token): the KL term,
    advantages (GRPO groups by ``group``, PPO's critic), the critic and policy updates. Returns the metrics and
    the response lengths.

    ``behaviour_logprobs`` (the engines' per-token log-probs of samples drawn by older weights: one-step-off
    rollout): the learner weights each token by min(pi_prox / pi_behaviour, ``learner.is_weight_cap``), pi_prox
    its weights before the update (:func:`pr_rlhf.algos.behaviour_weights`)."""
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
    if behaviour_logprobs is not None:   # an empty response is one placeholder token: no engine log-prob
        batch["behaviour_logprobs"] = [list(lp) or [float("nan")] for lp in behaviour_logprobs]
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
    behaviour_logprobs: list[list[float]] | None = None   # the engines' log-probs (when requested)

    def zero_std_groups(self) -> set[int]:
        """The groups whose rewards are all equal (they carry no advantage, hence no gradient)."""
        by_group: dict[int, list[float]] = {}
        for g, r in zip(self.group, self.rewards.tolist()):
            by_group.setdefault(g, []).append(r)
        return {g for g, rs in by_group.items() if max(rs) - min(rs) <= 1e-9}

    def only(self, keep: set[int]) -> ScoredRollouts:
        idx = [i for i, g in enumerate(self.group) if g in keep]
        return ScoredRollouts([self.prompt_ids[i] for i in idx], [self.response_ids[i] for i in idx],
                              [self.group[i] for i in idx], self.rewards[idx], self.metrics,
                              None if self.behaviour_logprobs is None else [self.behaviour_logprobs[i] for i in idx])

    @staticmethod
    def concat(parts: list[ScoredRollouts]) -> ScoredRollouts:
        behaviour = None if any(s.behaviour_logprobs is None for s in parts) else [
            lp for s in parts for lp in s.behaviour_logprobs]
        return ScoredRollouts([p for s in parts for p in s.prompt_ids], [r for s in parts for r in s.response_ids],
                              [g for s in parts for g in s.group], np.concatenate([s.rewards for s in parts]),
                              parts[0].metrics, behaviour)


def samples_per_prompt(cfg: RLConfig, group_of: Sequence[int]) -> int:
    """``cfg.group_size`` split evenly over the prompts of each group (e.g. a pair in both response orders)."""
    sizes = set(Counter(group_of).values())
    if len(sizes) != 1 or cfg.group_size % next(iter(sizes)):
        raise ValueError(f"every GRPO group needs the same number of prompts dividing group_size "
                         f"{cfg.group_size}; got {sorted(sizes)} prompts per group")
    return cfg.group_size // next(iter(sizes))


def sampling_params(cfg: RLConfig, group_of: Sequence[int], seed: int, logprobs: bool) -> SamplingParams:
    return SamplingParams(n=samples_per_prompt(cfg, group_of), temperature=cfg.temperature, top_p=cfg.top_p,
                          max_tokens=cfg.max_tokens, seed=seed, logprobs=logprobs)


def score_generations(prompts: Sequence[Any], group_of: Sequence[int], gens: list[Generation], reward_fn: RewardFn,
                      timer: Timer, keep_logprobs: bool = False) -> ScoredRollouts:
    """Every prompt's samples flattened, scored by ``reward_fn``; group ids as ``group_of``; the engines' log-probs
    of each sample kept with ``keep_logprobs``."""
    bad = [g.error for g in gens if g.error]
    if bad:
        raise RuntimeError(f"rollout failed for {len(bad)} prompts, e.g. {bad[0]}")
    prompt_ids, response_ids, group, behaviour = [], [], [], []
    for gi, gen in enumerate(gens):
        for sample in gen.samples:
            prompt_ids.append(gen.prompt_token_ids)
            response_ids.append(sample.token_ids)
            group.append(group_of[gi])
            if keep_logprobs:
                if sample.logprobs is None or len(sample.logprobs) != len(sample.token_ids):
                    raise RuntimeError(f"the rollout engine returned {len(sample.logprobs or [])} log-probs for "
                                       f"{len(sample.token_ids)} tokens: the behaviour correction needs one each")
                behaviour.append(list(sample.logprobs))
    with timer.phase("reward"):
        rewards, reward_metrics = reward_fn(prompts, gens)
    return ScoredRollouts(prompt_ids, response_ids, group, np.asarray(rewards, dtype=np.float64), reward_metrics,
                          behaviour if keep_logprobs else None)


def sample_and_score(rollouts: list, cfg: RLConfig, prompts: Sequence[Any], group_of: Sequence[int],
                     reward_fn: RewardFn, seed: int, timer: Timer, logprobs: bool = False) -> ScoredRollouts:
    """Samples of every prompt (``samples_per_prompt``), scored by ``reward_fn``; group ids as ``group_of``."""
    params = sampling_params(cfg, group_of, seed, logprobs)
    with timer.phase("rollout"):
        gens = generate_sharded(rollouts, [p.messages for p in prompts], params)
    return score_generations(prompts, group_of, gens, reward_fn, timer)


# (refill round, number of groups wanted) -> (prompts, group id of each prompt), group ids unused so far
RefillFn = Callable[[int, int], tuple[Sequence[Any], Sequence[int]]]


def rl_step(learner: Any, rollouts: list, cfg: RLConfig, prompts: Sequence[Any], reward_fn: RewardFn, step: int,
            seed: int, *, group_of: Sequence[int] | None = None, refill: RefillFn | None = None,
            refill_rounds: int = 0, logprobs: bool = False, pipeline: OneStepOff | None = None,
            next_prompts: Sequence[Any] | None = None, next_group_of: Sequence[int] | None = None,
            colocated: Colocated | None = None) -> dict[str, float]:
    """RL step ``step`` (0-based) on ``prompts`` (anything with ``.messages``): ``cfg.group_size`` samples per GRPO
    group (seeded by ``seed`` and the step; ``group_of[i]`` is prompt i's group, default its own: a group of two
    prompts, e.g. one pair in both response orders, gets half of the samples on each), ``reward_fn`` scores them,
    one update (``policy_update``), then the new weights go to the rollout engines as version ``step + 1``.

    Dynamic sampling: with ``refill`` and ``refill_rounds > 0``, groups whose rewards are all equal are dropped and
    up to that many rounds of fresh groups (``refill(round, count)``) are drawn in their place; the reward metrics
    stay those of the scheduled prompts. Returns the step's metrics: the update's, the reward's (and
    ``reward_fn``'s own), ``reward/frac_zero_std`` (the share of groups without reward variance), response
    lengths, seconds per phase.

    One-step-off (``pipeline``, :class:`OneStepOff`): the step's samples are those launched during the previous
    step (or drawn now when there are none), the engines then take the learner's weights (version ``step``) and
    start on ``next_prompts`` (step + 1; none after the last step) before this step scores and updates with the
    behaviour correction; the weights reach the engines at the next step, not at the end of this one. Adds
    ``rollout/staleness`` (updates between the weights that drew the samples and the learner's) and the
    correction's statistics.

    Colocated (``colocated``, :class:`Colocated`): the engines sleep once the samples are drawn and scored, wake
    their weights for the weight transfer and their KV cache after it."""
    if colocated is not None and pipeline is not None:
        raise ValueError("a colocated engine sleeps during the update: it cannot generate one step off")
    timer = Timer()
    group_of = list(range(len(prompts))) if group_of is None else list(group_of)
    sample_seed = seed * 1_000_003 + step
    staleness = None
    if pipeline is None:
        first = sample_and_score(rollouts, cfg, prompts, group_of, reward_fn, sample_seed, timer, logprobs)
    else:
        if refill is not None and refill_rounds > 0:
            raise ValueError("dynamic sampling (refill) draws more samples within a step: it needs the sync rollout")
        with timer.phase("rollout_wait"):
            gens, drawn_by = pipeline.take(step, [p.messages for p in prompts],
                                           sampling_params(cfg, group_of, sample_seed, True))
        with timer.phase("weight_sync"):
            pipeline.sync(learner, step)
        if next_prompts is not None:
            following = list(range(len(next_prompts))) if next_group_of is None else list(next_group_of)
            pipeline.launch(step + 1, [p.messages for p in next_prompts],
                            sampling_params(cfg, following, sample_seed + 1, True))
        first = score_generations(prompts, group_of, gens, reward_fn, timer, keep_logprobs=True)
        staleness = step - drawn_by
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
    if colocated is not None:
        with timer.phase("sleep"):
            colocated.sleep()
    metrics, lengths = policy_update(learner, cfg, batch.prompt_ids, batch.response_ids, batch.rewards,
                                     batch.group, timer, batch.behaviour_logprobs if pipeline is not None else None)
    if colocated is not None:
        with timer.phase("wake"):
            colocated.wake(["weights"])
    if pipeline is None:
        with timer.phase("weight_sync"):
            sync_weights(learner, rollouts, step + 1)
    if colocated is not None:
        with timer.phase("wake"):
            colocated.wake(["kv_cache"])
    metrics.update({
        "step": step,
        "reward/mean": float(first.rewards.mean()),
        "reward/std": float(first.rewards.std()),
        "reward/frac_zero_std": len(zero) / max(n_groups, 1),
        **first.metrics,
        "rollout/response_tokens_mean": float(lengths.float().mean()),
        **{f"time/{k}_s": v for k, v in timer.seconds.items()},
    })
    if pipeline is None:   # generation overlaps other phases one step off: no time of its own to divide by
        metrics["rollout/tokens_per_s"] = int(lengths.sum()) / max(timer.seconds["rollout"], 1e-9)
    else:
        metrics["rollout/staleness"] = float(staleness)
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
