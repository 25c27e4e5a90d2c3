"""Per-token KL estimators between the policy and a reference policy (Schulman, "Approximating KL divergence",
http://joschu.net/blog/kl-approx.html), registered in `KL_ESTIMATORS`, and the two ways to use them:
in the reward (`apply_kl_to_rewards`) or as a loss term (`kl_loss`).

With d = logprob - ref_logprob on the sampled tokens (samples from the policy):
- "k1" (alias "kl"):          d                                   unbiased for KL(pi || ref), high variance
- "abs":                      |d|
- "k2" (alias "mse"):         0.5 * d^2                           low bias, its gradient is the right one
- "k3" (alias "low_var_kl"):  exp(-d) + d - 1, always >= 0        unbiased, low variance; as in verl -d is clamped to
                              [-20, 20] before exp and the estimate to [-10, 10]
A "+" suffix ("k1+", "k3+", "abs+") keeps that estimator's value but takes the gradient of k2 (straight-through),
as verl does; "k2+" / "mse+" are just k2.
"""
from __future__ import annotations

import torch

from .functional import masked_mean
from .losses import GlobalBatchInfo, agg_loss
from .registry import Registry

KL_ESTIMATORS: Registry = Registry("KL estimator")


@KL_ESTIMATORS.register("k1", "kl")
def kl_k1(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return logprob - ref_logprob


@KL_ESTIMATORS.register("abs")
def kl_abs(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return (logprob - ref_logprob).abs()


@KL_ESTIMATORS.register("k2", "mse")
def kl_k2(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprob - ref_logprob) ** 2


@KL_ESTIMATORS.register("k3", "low_var_kl")
def kl_k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    log_ratio = torch.clamp(ref_logprob - logprob, -20.0, 20.0)  # log(ref / pi)
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, -10.0, 10.0)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL estimate of the given `kind` (see the module docstring), same shape as the inputs."""
    straight_through = kind.endswith("+")
    estimator = KL_ESTIMATORS.get(kind[:-1] if straight_through else kind)
    value = estimator(logprob, ref_logprob)
    if not straight_through or estimator is kl_k2:
        return value
    k2 = kl_k2(logprob, ref_logprob)
    return k2 - k2.detach() + value.detach()


def apply_kl_to_rewards(
    token_level_scores: torch.Tensor, kl: torch.Tensor, beta: float, mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL in the reward: rewards = scores - beta * kl on the masked tokens (kl from `kl_penalty`, usually with the
    rollout policy's log-probs). Returns `(token_level_rewards, stats)`; stats["kl"] is the batch mean of each
    sequence's token-mean KL (what an adaptive KL controller tracks), stats["kl_coef"] is beta. As verl's
    apply_kl_penalty."""
    kl = torch.where(mask != 0, kl, torch.zeros((), dtype=kl.dtype, device=kl.device)) * mask
    rewards = token_level_scores - beta * kl
    seq_kl = masked_mean(kl, mask, dim=-1)
    return rewards, {"kl": float(seq_kl.mean().detach()), "kl_coef": float(beta)}


def kl_loss(
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    mask: torch.Tensor,
    kind: str = "k3",
    agg_mode: str = "token-mean",
    *,
    global_batch: GlobalBatchInfo | None = None,
) -> torch.Tensor:
    """KL as a loss term (GRPO style): agg_loss(kl_penalty(logprob, ref_logprob, kind), mask, agg_mode)."""
    return agg_loss(kl_penalty(logprob, ref_logprob, kind), mask, agg_mode, global_batch=global_batch)
