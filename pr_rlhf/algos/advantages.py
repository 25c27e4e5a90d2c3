"""Advantage estimators, registered by name in `ADVANTAGE_ESTIMATORS`.

Conventions (the same as verl's `verl.trainer.ppo.core_algos`, so results compare directly):
- every tensor is `[B, T]` over the response tokens; `response_mask` is 1 on real response tokens;
- an outcome reward is a token-level reward placed on the last valid response token (a sequence's score is the
  sum of its token rewards);
- every estimator returns `(advantages, returns)`, both `[B, T]`, and is computed without gradients;
- group estimators take `index`: one group label per sample (np array / list of str or int, or a tensor), normally
  the prompt id so the n rollouts of a prompt form a group.

Registered names: "grpo", "grpo_no_std" (Dr. GRPO: no division by the group std), "rloo", "gae".
Use `ADVANTAGE_ESTIMATORS.call(name, **settings)` to pass one superset of settings to whichever estimator is chosen.
"""
from __future__ import annotations

import torch

from .functional import as_group_ids, masked_whiten
from .registry import Registry

ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")


def _group_stats(scores: torch.Tensor, index) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (group mean, group unbiased std, group size) of `scores [B]`, each `[B]`.

    A group of one sample gets mean 0 and std 1 (verl's convention: its raw score passes through GRPO unchanged).
    """
    ids, n_groups = as_group_ids(index, scores.shape[0], scores.device)
    counts = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, torch.ones_like(scores))
    sums = torch.zeros_like(counts).index_add_(0, ids, scores)
    mean = sums / counts
    sq_dev = torch.zeros_like(counts).index_add_(0, ids, (scores - mean[ids]) ** 2)
    std = torch.sqrt(sq_dev / (counts - 1).clamp_min(1))
    single = counts == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[ids], std[ids], counts[ids]


@ADVANTAGE_ESTIMATORS.register("grpo")
@torch.no_grad()
def grpo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: (score - group mean) / (group unbiased std + epsilon), broadcast over the mask.

    `norm_adv_by_std=False` drops the division (Dr. GRPO). Returns are the advantages (no critic).
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, std, _ = _group_stats(scores, index)
    adv = scores - mean
    if norm_adv_by_std:
        adv = adv / (std + epsilon)
    adv = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
    return adv, adv


@ADVANTAGE_ESTIMATORS.register("grpo_no_std")
def grpo_no_std(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """`grpo` with `norm_adv_by_std=False` (Dr. GRPO), as its own registry entry."""
    return grpo(token_level_rewards, response_mask, index, epsilon=epsilon, norm_adv_by_std=False)


@ADVANTAGE_ESTIMATORS.register("rloo")
@torch.no_grad()
def rloo(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: score minus the mean score of the other samples in its group, i.e. n/(n-1) * (score - group mean).

    A group of one sample keeps its raw score (no baseline), as verl does.
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, _, counts = _group_stats(scores, index)
    scale = counts / (counts - 1).clamp_min(1)
    adv = torch.where(counts > 1, scale * (scores - mean), scores)
    adv = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
    return adv, adv


@ADVANTAGE_ESTIMATORS.register("gae")
@torch.no_grad()
def gae(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016) over the response tokens.

    delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * lam * A_{t+1}, where "t+1" is the next
    position with mask 1: masked positions (padding, or tool/observation tokens inside a multi-turn response) are
    skipped and carry the running value and advantage through. The value after the last valid token is 0.
    returns = A + V (before whitening). With `whiten` the advantages are whitened over the mask (verl does this
    always). Both outputs are 0 outside the mask (verl leaves arbitrary values there).
    """
    mask = response_mask.to(values.dtype)
    n_tokens = token_level_rewards.shape[-1]
    next_value = torch.zeros_like(values[:, 0])
    running = torch.zeros_like(values[:, 0])
    advs = [None] * n_tokens
    for t in range(n_tokens - 1, -1, -1):
        m = mask[:, t]
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * running
        running = m * step + (1 - m) * running
        next_value = m * values[:, t] + (1 - m) * next_value
        advs[t] = running
    adv = torch.stack(advs, dim=1)
    valid = mask != 0
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    returns = torch.where(valid, adv + values, zero)
    if whiten:
        adv = masked_whiten(adv, mask)
    return torch.where(valid, adv, zero), returns
