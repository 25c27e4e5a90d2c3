"""The learner's loss on one micro-batch: the policy objective (PPO / GRPO surrogate, entropy bonus, KL to the
reference), the critic's clipped value loss, the supervised NLL and the reward model's Bradley-Terry loss, plus
what each reports.

Every loss is normalized by the *global* mini-batch token (or sequence) count times the number of ranks
(``pr_rlhf.algos.GlobalBatchInfo``): gradients averaged over the ranks then give the global-batch loss, so a step is
the same whatever the world size or micro-batch size. Pure torch (no Ray, no process group).
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from pr_rlhf.algos import POLICY_LOSSES, GlobalBatchInfo, agg_loss, behaviour_weights, kl_penalty, value_loss
from pr_rlhf.configs.learner import LearnerConfig


@dataclass
class MicroLoss:
    """A micro-batch's loss (to backpropagate), its named terms (``pg_loss``, ``kl_loss``, ...: summed over the
    micro-batches of an update) and per-token statistics: ``token_means`` weighted by the micro-batch's token count,
    ``token_sums`` added as they are."""

    loss: torch.Tensor
    terms: dict[str, float]
    token_means: Mapping[str, Any] = field(default_factory=dict)
    token_sums: dict[str, float] = field(default_factory=dict)


def policy_loss_terms(cfg: LearnerConfig) -> tuple[str, ...]:
    """The terms ``policy_objective`` reports under ``cfg``."""
    return ("pg_loss",) + (("entropy_loss",) if cfg.entropy_coef > 0 else ()) + (("kl_loss",) if cfg.kl_in_loss
                                                                                else ())


def policy_objective(cfg: LearnerConfig, logp: torch.Tensor, entropy: torch.Tensor, old_logprobs: torch.Tensor,
                     advantages: torch.Tensor, mask: torch.Tensor, global_batch: GlobalBatchInfo,
                     ref_logprobs: torch.Tensor | None = None,
                     behaviour_logprobs: torch.Tensor | None = None) -> MicroLoss:
    """``cfg.policy_loss`` (clipped surrogate) - ``entropy_coef`` x entropy + ``kl.coef`` x KL to the reference
    (when the KL is in the loss: ``ref_logprobs`` required), each aggregated with ``cfg.loss_agg_mode``.

    ``behaviour_logprobs``: samples drawn by older weights (one-step-off rollout), with the engine's log-probs;
    ``old_logprobs`` are then the proximal policy's (the learner's before this update) and each token's term is
    weighted by min(pi_prox / pi_behaviour, ``cfg.is_weight_cap``) (``pr_rlhf.algos.behaviour_weights``)."""
    extra: dict[str, Any] = {}
    is_stats: dict[str, float] = {}
    if behaviour_logprobs is not None:
        if "is_weights" not in inspect.signature(POLICY_LOSSES.get(cfg.policy_loss)).parameters:
            raise ValueError(f"policy loss {cfg.policy_loss!r} takes no importance weights: an off-policy batch "
                             "(one-step-off rollout) needs a loss that does (clipped, dual_clip)")
        extra["is_weights"], is_stats = behaviour_weights(old_logprobs, behaviour_logprobs, mask,
                                                                 cfg.is_weight_cap)
    pg_loss, stats = POLICY_LOSSES.call(
        cfg.policy_loss, old_logprobs, logp, advantages, mask, clip_ratio_low=cfg.clip_ratio_low,
        clip_ratio_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c, agg_mode=cfg.loss_agg_mode,
        global_batch=global_batch, **extra)
    loss = pg_loss
    terms = {"pg_loss": float(pg_loss.detach())}
    if cfg.entropy_coef > 0:
        ent_loss = agg_loss(entropy, mask, cfg.loss_agg_mode, global_batch=global_batch)
        loss = loss - cfg.entropy_coef * ent_loss
        terms["entropy_loss"] = float(ent_loss.detach())
    if cfg.kl_in_loss:
        if ref_logprobs is None:
            raise ValueError("the KL is in the loss (kl.coef > 0, kl.where 'loss'): ref_logprobs are required")
        kld = kl_penalty(logp, ref_logprobs, cfg.kl.kind)
        kl_term = agg_loss(kld, mask, cfg.loss_agg_mode, global_batch=global_batch)
        loss = loss + cfg.kl.coef * kl_term
        terms["kl_loss"] = float(kl_term.detach())
    return MicroLoss(loss, terms, {**stats, **is_stats}, {"entropy": float((entropy.detach() * mask).sum())})


def critic_objective(cfg: LearnerConfig, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                     mask: torch.Tensor, global_batch: GlobalBatchInfo) -> MicroLoss:
    """The clipped value loss (values clipped to old +- ``critic.cliprange_value``)."""
    loss, stats = value_loss(values, old_values, returns, mask, cfg.critic.cliprange_value, cfg.loss_agg_mode,
                             global_batch=global_batch)
    return MicroLoss(loss, {"vf_loss": float(loss.detach())}, {"vf_" + k: v for k, v in stats.items()},
                     {"vpred_mean": float((values.detach() * mask).sum())})


def sft_objective(logp: torch.Tensor, mask: torch.Tensor, global_batch: GlobalBatchInfo) -> MicroLoss:
    """Token-mean negative log-likelihood of the response tokens over the global batch: this rank's token sum /
    the global token count, times dp_size (gradients are averaged over the ranks)."""
    loss = -(logp * mask).sum() / global_batch.num_tokens * global_batch.dp_size
    return MicroLoss(loss, {"nll": float(loss.detach())},
                     token_sums={"token_accuracy": float(((logp.detach() > math.log(0.5)) * mask).sum())})


def reward_model_objective(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor,
                           global_batch: GlobalBatchInfo) -> MicroLoss:
    """Bradley-Terry: ``-log sigmoid(r_chosen - r_rejected - margin)`` summed over this rank's pairs / the global
    pair count (``num_seqs``: one loss token per pair), times dp_size. Reports per-pair sums (averaged by the
    update log): accuracy (chosen scored higher), the score gap and each side's mean."""
    gap = chosen - rejected
    loss = -torch.nn.functional.logsigmoid(gap - margin).sum() / global_batch.num_seqs * global_batch.dp_size
    gap = gap.detach()
    return MicroLoss(loss, {"bt_loss": float(loss.detach())},
                     token_sums={"accuracy": float((gap > 0).sum()), "reward_gap": float(gap.sum()),
                                 "reward_chosen": float(chosen.detach().sum()),
                                 "reward_rejected": float(rejected.detach().sum())})
