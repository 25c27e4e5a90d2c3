"""Typed configuration of the learner (policy / reference / critic training workers, ``workers.learner``).

Pydantic only: importable without torch or Ray, so a recipe is validated before any worker starts. Names and
defaults follow verl's actor / critic config where one exists (``clip_ratio_low`` / ``clip_ratio_high`` /
``clip_ratio_c``, ``loss_agg_mode``, ``ppo_epochs``, ``kl_loss_type`` -> ``kl.kind``).

Batch sizes are counted in samples (one prompt + one response):

- ``mini_batch_size`` (global, over all ranks): samples per optimizer step; ``None`` = the whole batch passed to
  ``update_policy`` is one mini-batch (one optimizer step per PPO epoch).
- ``micro_batch_size`` (per rank): samples per forward/backward; gradients are accumulated over the micro-batches
  of a mini-batch. The loss is normalized by the *global* mini-batch token (or sequence) count, so the result of
  a step does not depend on the number of ranks or on the micro-batch size.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from pr_rlhf.configs.base import StrictModel

Strategy = Literal["fsdp2", "none"]
LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                      "seq-mean-token-mean"]
KLKind = Literal["k1", "k2", "k3", "abs", "k1+", "k3+", "abs+"]


class KLConfig(StrictModel):
    """KL to the frozen reference policy (the initial weights)."""

    coef: float = Field(0.0, ge=0, description="beta; 0 disables the KL term (and the reference model is then "
                                                 "only built if compute_ref_logprobs is called)")
    kind: KLKind = Field("k3", description="per-token estimator: k1 = logp - ref, k2 = 0.5 d^2, k3 = "
                                           "exp(-d) + d - 1 (verl low_var_kl); a '+' suffix takes k2's gradient")
    where: Literal["reward", "loss"] = Field(
        "loss", description="'loss': coef * agg(kl) is added to the policy loss by the learner (GRPO); 'reward': "
                            "the controller subtracts coef * kl from the token rewards (PPO) and the learner "
                            "only supplies ref log-probs")


class CriticConfig(StrictModel):
    """The PPO value model: the policy's backbone (a copy of the initial weights) with a scalar head."""

    enabled: bool = False
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    cliprange_value: float = Field(0.5, gt=0, description="values are clipped to old +- this (verl: 0.5)")
    micro_batch_size: int | None = Field(None, ge=1, description="default: the learner's micro_batch_size")


class LearnerConfig(StrictModel):
    """Every knob of ``workers.learner.LearnerWorker`` / ``LearnerGroup``."""

    INHERITED: ClassVar[tuple[str, ...]] = ("seed",)

    model: str = Field("tiny", description="model spec for pr_rlhf.models.sources.resolve_model: 'tiny', "
                                           "'smollm2', or a local HF causal-LM directory")
    trains: Literal["policy", "reward_model"] = Field(
        "policy", description="'policy': a causal LM (RL, SFT; optionally a reference and a critic); "
                              "'reward_model': a Bradley-Terry scalar RM (the model with a sequence-classification "
                              "head; update_reward_model / compute_rewards)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="compute dtype. Master weights and optimizer state stay float32 (FSDP2 mixed "
                               "precision casts parameters for compute and reduces gradients in float32)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="'auto': cuda when the worker sees a GPU")
    world_size: int = Field(1, ge=1, description="number of learner ranks (Ray actors, one per GPU / CPU slot)")
    strategy: Strategy = Field("fsdp2", description="'fsdp2' (torch fully_shard; gloo on CPU, nccl on GPU) or "
                                                    "'none' (a plain module; world_size 1 only)")
    num_cpus_per_worker: float = Field(0.5, gt=0, description="Ray CPU resources per rank (fractional lets two "
                                                              "ranks fit a 2-core machine)")
    num_gpus_per_worker: float = Field(1.0, gt=0, le=1, description="GPU share of a rank on GPU (0.5 lets a rank "
                                                                     "and a rollout worker share one GPU)")
    attn_implementation: Literal["auto", "sdpa", "flash_attention_2", "eager"] = Field(
        "auto", description="'auto': flash_attention_2 on CUDA when flash-attn is installed, else sdpa")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources per rank (in its "
                                                                         "placement-group bundle), e.g. "
                                                                         "{learner_host: 1} pins ranks to the "
                                                                         "nodes that offer it")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="placement-group strategy of the ranks' bundles (STRICT_SPREAD: one rank per node)")
    torch_threads: int | None = Field(None, ge=1, description="intra-op CPU threads of each rank; None: Ray's "
                                                              "default (floor(num_cpus_per_worker), at least 1)")
    gradient_checkpointing: bool = False
    load_weights_on: Literal["rank0", "every_rank"] = Field(
        "rank0", description="'rank0': with fsdp2 over several ranks only rank 0 reads the weights, the others "
                             "build the model on the meta device and receive their shards from rank 0 (host "
                             "memory of one model on one rank per group); 'every_rank': each rank loads the whole "
                             "model (the earlier path, for the bench)")
    weight_sync_bucket_mb: int = Field(256, ge=1, description="largest broadcast of the weight sync learner -> "
                                                              "rollout engines over gloo "
                                                              "(pr_rlhf.models.weight_transfer)")
    weight_sync_timeout_s: float = Field(120.0, gt=0, description="longest wait of any one step of a weight sync "
                                                                  "(joining, a bucket, the engines' update) "
                                                                  "before the sync fails on every learner rank")

    # optimizer (AdamW)
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float | None = Field(1.0, gt=0, description="max global grad norm (clip_grad_norm_); None: no "
                                                           "clipping (the norm is still reported)")

    # batching
    micro_batch_size: int = Field(4, ge=1, description="samples per forward/backward on one rank")
    shared_prefix: bool = Field(True, description="compute a prompt shared by several samples of a micro-batch "
                                                  "once (GRPO groups), packing its responses behind it with a "
                                                  "block attention mask; identical log-probs, fewer tokens")
    forward_micro_batch_size: int | None = Field(None, ge=1, description="samples per no-grad forward "
                                                                        "(log-probs, values); default: "
                                                                        "micro_batch_size")
    mini_batch_size: int | None = Field(None, ge=1, description="global samples per optimizer step; None: the "
                                                                "whole update batch")
    ppo_epochs: int = Field(1, ge=1)

    # policy loss
    policy_loss: str = Field("clipped", description="name in pr_rlhf.algos.POLICY_LOSSES: 'clipped', "
                                                    "'dual_clip'")
    clip_ratio_low: float = Field(0.2, ge=0, lt=1)
    clip_ratio_high: float = Field(0.2, ge=0, description="> clip_ratio_low gives DAPO's clip-higher")
    clip_ratio_c: float = Field(3.0, gt=1, description="dual-clip bound for negative advantages")
    is_weight_cap: float = Field(2.0, gt=0, description="samples a stale policy drew (train.rollout_mode "
                                                        "one_step_off): the cap C of each token's importance weight "
                                                        "min(pi_learner / pi_rollout, C)")
    loss_agg_mode: LossAggMode = "token-mean"
    entropy_coef: float = Field(0.0, ge=0, description="coef * entropy is subtracted from the loss; the "
                                                       "entropy is always reported")
    temperature: float = Field(1.0, gt=0, description="logits are divided by this before log-softmax: use the "
                                                      "rollout's sampling temperature")

    kl: KLConfig = Field(default_factory=KLConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    seed: int = 0

    @field_validator("strategy", mode="before")
    @classmethod
    def _strategy_not_removed(cls, v: object) -> object:
        if v == "deepspeed":
            raise ValueError("strategy 'deepspeed' was removed until it can be tested on a GPU machine; use 'fsdp2'")
        return v

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError(f"betas must be in [0, 1), got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> LearnerConfig:
        if self.strategy == "none" and self.world_size != 1:
            raise ValueError("strategy 'none' runs a single rank: set world_size 1 (or strategy 'fsdp2')")
        if self.trains == "reward_model" and (self.critic.enabled or self.kl.coef > 0):
            raise ValueError("a reward-model learner has no critic and no reference: leave critic.enabled false "
                             "and kl.coef 0")
        return self

    @property
    def needs_reference(self) -> bool:
        """Whether the reference model is built eagerly (it is needed for the KL term)."""
        return self.kl.coef > 0

    def single_update(self, batch_samples: int) -> bool:
        """Whether updating on ``batch_samples`` samples is one on-policy optimizer step (one epoch over one
        mini-batch): then the learner takes the old log-probs from its own forward."""
        return self.ppo_epochs == 1 and (self.mini_batch_size is None or self.mini_batch_size >= batch_samples)

    @property
    def kl_in_loss(self) -> bool:
        return self.kl.coef > 0 and self.kl.where == "loss"


class RolloutLayout(StrictModel):
    """Where a section's rollout engines run beside its learner ranks (the RL run's ``train:``, the P-GenRM GRPO
    stages): the fields and their check, written once. The section has ``learner``, ``rollout``,
    ``rollout_workers`` and ``rollout_num_gpus``."""

    layout: Literal["split", "colocated"] = Field(
        "split", description="'split': the rollout engines on devices of their own (rollout_num_gpus each); "
                             "'colocated' (the hybrid engine): each learner rank's device also hosts one rollout "
                             "engine (rollout_workers = learner.world_size, TP 1), which sleeps during the update "
                             "(sleep_level) and wakes for the weight transfer and the next rollout; Ray gives the "
                             "engine rollout_num_gpus of the rank's GPU and the rank the rest")
    sleep_level: Literal[1, 2] = Field(
        1, description="colocated: vLLM's sleep level during the update (1: weights offloaded to host memory and KV "
                       "cache freed; 2: both freed, the weight transfer brings the weights back)")

    def check_layout(self, rollout_mode: str = "sync") -> None:
        if self.layout != "colocated":
            return
        learner, workers, gpus = self.learner, self.rollout_workers, self.rollout_num_gpus
        if rollout_mode != "sync":
            raise ValueError("layout colocated runs the rollout and the update on the same devices in turn: "
                             "rollout_mode one_step_off needs the split layout")
        if workers != learner.world_size:
            raise ValueError(f"layout colocated puts one rollout engine on each learner rank's device: "
                             f"rollout_workers ({workers}) must equal learner.world_size ({learner.world_size})")
        if getattr(self.rollout, "tensor_parallel_size", 1) != 1:
            raise ValueError("layout colocated runs engines of tensor_parallel_size 1 (one per learner rank)")
        if 0 < gpus >= learner.num_gpus_per_worker:
            raise ValueError(f"layout colocated: the engine's share of the rank's GPU (rollout_num_gpus {gpus}) "
                             f"must be below learner.num_gpus_per_worker ({learner.num_gpus_per_worker}): the rank "
                             "keeps the rest")
