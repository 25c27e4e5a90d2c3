"""Loss aggregation, PPO policy losses (registered in `POLICY_LOSSES`), the clipped value loss and the entropy term.

Semantics follow verl's `verl.trainer.ppo.core_algos` (`agg_loss`, `compute_policy_loss_vanilla`,
`compute_value_loss`, `compute_entropy_loss`); the tests compare against it.

Loss aggregation modes (`agg_loss(loss_mat, mask, mode)`, `loss_mat` and `mask` are `[B, T]`):

=========================  =====================================================================================
"token-mean"               sum over every valid token / number of valid tokens. Each token weighs the same, so a
                           long response weighs more than a short one. verl's default (DAPO).
"token-sum"                plain sum over the valid tokens.
"seq-mean-token-sum"       sum within each sequence, then mean over the sequences that have a valid token.
"seq-mean-token-sum-norm"  "seq-mean-token-sum" divided by a constant (`loss_scale_factor`, default T) so the
                           scale does not depend on lengths (Dr. GRPO).
"seq-mean-token-mean"      mean within each sequence, then mean over the sequences that have a valid token. Each
                           sequence weighs the same (the original GRPO paper).
=========================  =====================================================================================

Fully masked sequences never count. Under data parallelism pass a `GlobalBatchInfo` so that a rank's micro-batch
is normalized by the global token / sequence count and multiplied by the DP size: averaging gradients over ranks
then yields the global-batch loss (verl's `global_batch_info`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .functional import entropy_from_logits, masked_mean, masked_sum
from .registry import Registry

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean")

POLICY_LOSSES: Registry = Registry("policy loss")

_LOG_RATIO_CLAMP = 20.0  # log(pi/pi_old) is clamped to [-20, 20] before exp, as in verl


@dataclass(frozen=True)
class GlobalBatchInfo:
    """Normalizers for data-parallel training. `num_tokens`: valid tokens in the global batch (token-mean);
    `num_seqs`: sequences in the global batch (seq-mean modes); `dp_size`: number of data-parallel ranks.
    A None count means "this micro-batch's own count", only allowed when dp_size == 1."""

    dp_size: int = 1
    num_tokens: float | None = None
    num_seqs: float | None = None


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    global_batch: GlobalBatchInfo | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a `[B, T]` per-token loss into a scalar (see the module docstring for the modes)."""
    gb = global_batch or GlobalBatchInfo()
    if mode in ("token-mean", "token-sum"):
        total = masked_sum(loss_mat, mask)
        if mode == "token-sum":
            return total * gb.dp_size
        num_tokens = gb.num_tokens
        if num_tokens is None:
            if gb.dp_size > 1:
                raise ValueError("GlobalBatchInfo.num_tokens is required for token-mean when dp_size > 1")
            num_tokens = mask.sum()
        return total / num_tokens * gb.dp_size
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        tokens_per_seq = mask.sum(dim=-1)
        has_tokens = (tokens_per_seq > 0).to(loss_mat.dtype)
        if mode == "seq-mean-token-mean":
            per_seq = masked_mean(loss_mat, mask, dim=-1)
        else:
            per_seq = masked_sum(loss_mat, mask, dim=-1)
        num_seqs = gb.num_seqs
        if num_seqs is None:
            if gb.dp_size > 1:
                raise ValueError("GlobalBatchInfo.num_seqs is required for seq-mean modes when dp_size > 1")
            num_seqs = has_tokens.sum()
        loss = masked_sum(per_seq, has_tokens) / num_seqs * gb.dp_size
        if mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_scale_factor if loss_scale_factor is not None else mask.shape[-1])
        return loss
    raise ValueError(f"unknown loss aggregation mode {mode!r}; known: {', '.join(AGG_MODES)}")


def _ppo_clip_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None,
    agg_mode: str,
    global_batch: GlobalBatchInfo | None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    log_ratio = torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    per_token = torch.maximum(unclipped, clipped)  # pessimistic bound
    stats = {
        "clipfrac": masked_mean((clipped > unclipped).to(per_token.dtype), response_mask),
        "approx_kl": masked_mean(-log_ratio, response_mask),  # k1 estimate of KL(pi_old || pi)
        "ratio_mean": masked_mean(ratio, response_mask),
    }
    if clip_ratio_c is not None:
        if not clip_ratio_c > 1.0:
            raise ValueError(f"dual-clip lower bound clip_ratio_c must be > 1, got {clip_ratio_c}")
        negative = advantages < 0
        cap = -advantages * clip_ratio_c  # for A < 0 the loss may not exceed c * |A|
        stats["clipfrac_lower"] = masked_mean(((per_token > cap) & negative).to(per_token.dtype), response_mask)
        per_token = torch.where(negative, torch.minimum(per_token, cap), per_token)
    if is_weights is not None:
        # behaviour correction of an off-policy batch (decoupled PPO): the clipped surrogate is taken against the
        # proximal policy (old_log_prob, the learner's weights before this update) and weighted by the detached,
        # truncated pi_prox / pi_behaviour of each token (pr_rlhf.algos.behaviour_weights)
        per_token = per_token * is_weights.detach()
    loss = agg_loss(per_token, response_mask, agg_mode, global_batch=global_batch)
    return loss, {k: float(v.detach()) for k, v in stats.items()}


@POLICY_LOSSES.register("clipped")
def clipped(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    agg_mode: str = "token-mean",
    global_batch: GlobalBatchInfo | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate: per token max(-A * r, -A * clip(r, 1 - low, 1 + high)), r = exp(logp - logp_old).

    Asymmetric bounds give DAPO's clip-higher. Stats: clipfrac (share of tokens where the clipped term is the
    larger), approx_kl (masked mean of logp_old - logp), ratio_mean.
    """
    return _ppo_clip_loss(
        old_log_prob, log_prob, advantages, response_mask,
        clip_ratio_low, clip_ratio_high, None, agg_mode, global_batch, is_weights,
    )


@POLICY_LOSSES.register("dual_clip")
def dual_clip(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    agg_mode: str = "token-mean",
    global_batch: GlobalBatchInfo | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Dual-clip PPO (Ye et al. 2020, arXiv:1912.09729): `clipped`, and for A < 0 the per-token loss is also capped at
    -A * clip_ratio_c (c > 1), so a huge ratio on a bad token cannot blow up the loss. verl's "vanilla" loss.
    Extra stat: clipfrac_lower (share of tokens where the cap is active).
    """
    return _ppo_clip_loss(
        old_log_prob, log_prob, advantages, response_mask,
        clip_ratio_low, clip_ratio_high, clip_ratio_c, agg_mode, global_batch, is_weights,
    )


def value_loss(
    vpreds: torch.Tensor,
    values_old: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
    agg_mode: str = "token-mean",
    *,
    global_batch: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss: 0.5 * agg(max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)).

    Stats: clipfrac (share of tokens where the clipped error is the larger). Note the argument order
    (values_old before returns) differs from verl's compute_value_loss(vpreds, returns, values, ...).
    """
    vclipped = torch.clamp(vpreds, values_old - cliprange_value, values_old + cliprange_value)
    err = (vpreds - returns) ** 2
    err_clipped = (vclipped - returns) ** 2
    loss = 0.5 * agg_loss(torch.maximum(err, err_clipped), mask, agg_mode, global_batch=global_batch)
    clipfrac = masked_mean((err_clipped > err).to(err.dtype), mask)
    return loss, {"clipfrac": float(clipfrac.detach())}


def entropy_loss(
    logits: torch.Tensor,
    mask: torch.Tensor,
    agg_mode: str = "token-mean",
    *,
    global_batch: GlobalBatchInfo | None = None,
) -> torch.Tensor:
    """Aggregated token entropy of `logits [B, T, V]` over the mask (subtract coef * this to reward exploration)."""
    return agg_loss(entropy_from_logits(logits), mask, agg_mode, global_batch=global_batch)


def behaviour_weights(prox_log_prob: torch.Tensor, behaviour_log_prob: torch.Tensor, response_mask: torch.Tensor,
                      cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token importance weights of samples drawn by a stale behaviour policy (one-step-off asynchronous
    rollout): ``w = min(pi_prox / pi_behaviour, cap)``, 0 outside the mask, 1 where the behaviour log-prob is NaN
    (none recorded).

    The decoupled PPO objective (Hilton, Cobbe & Schulman 2022, "Batch size-invariance for policy optimization",
    arXiv:2110.00641; as AReaL uses it, arXiv:2505.24298) clips the ratio against the *proximal* policy (the
    learner's weights before this update, ``old_log_prob`` of the clipped losses) and corrects for the behaviour
    policy with this weight; truncating it at ``cap`` (Ionides 2008's truncated importance sampling, as verl's
    rollout-IS and Yao et al. 2025's TIS do against engine/trainer mismatch) bounds the variance a rare token adds.
    Stats: is_weight_mean, is_truncated_frac (tokens whose weight hit the cap), behaviour_kl (k1 estimate of
    KL(pi_behaviour || pi_prox) on the sampled tokens)."""
    if not cap > 0:
        raise ValueError(f"the importance-weight cap must be > 0, got {cap}")
    prox_log_prob = prox_log_prob.detach()
    behaviour_log_prob = torch.where(torch.isnan(behaviour_log_prob), prox_log_prob, behaviour_log_prob)  # none: 1
    log_ratio = torch.clamp(prox_log_prob - behaviour_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    weights = torch.clamp(ratio, max=cap) * response_mask
    stats = {"is_weight_mean": masked_mean(weights, response_mask),
             "is_truncated_frac": masked_mean((ratio > cap).to(ratio.dtype), response_mask),
             "behaviour_kl": masked_mean(-log_ratio, response_mask)}
    return weights.detach(), {k: float(v) for k, v in stats.items()}
