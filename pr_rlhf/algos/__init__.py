"""RL algorithm math for pr_rlhf: advantage estimators, policy/value losses, KL estimators (pure torch, no Ray).

Tensors are `[B, T]` over response tokens with a `response_mask` (1 on response tokens); conventions match verl's
`verl.trainer.ppo.core_algos` (tests/unit/test_algos.py compares against it). Pick implementations by name:

    adv, ret = ADVANTAGE_ESTIMATORS.call(cfg.adv_estimator, token_level_rewards=r, response_mask=m, index=uids,
                                         values=v, gamma=1.0, lam=0.95)
    loss, stats = POLICY_LOSSES.call(cfg.policy_loss, old_lp, lp, adv, m, clip_ratio_low=0.2, clip_ratio_high=0.28,
                                     clip_ratio_c=3.0, agg_mode="token-mean")
"""
from .advantages import ADVANTAGE_ESTIMATORS, gae, grpo, grpo_no_std, rloo
from .functional import (
    entropy_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from .kl import KL_ESTIMATORS, apply_kl_to_rewards, kl_loss, kl_penalty
from .losses import (
    AGG_MODES,
    POLICY_LOSSES,
    GlobalBatchInfo,
    agg_loss,
    behaviour_weights,
    clipped,
    dual_clip,
    entropy_loss,
    value_loss,
)
from .registry import Registry, UnknownNameError

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "GlobalBatchInfo",
    "Registry",
    "UnknownNameError",
    "agg_loss",
    "apply_kl_to_rewards",
    "behaviour_weights",
    "clipped",
    "dual_clip",
    "entropy_from_logits",
    "entropy_loss",
    "gae",
    "grpo",
    "grpo_no_std",
    "kl_loss",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "rloo",
    "value_loss",
]
