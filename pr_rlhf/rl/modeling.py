"""The models the learner trains, loaded from an HF model directory: the policy / frozen reference (a causal LM),
the PPO critic (the policy's backbone with a scalar value head) and a Bradley-Terry reward model (an HF
sequence-classification model). Pure torch + transformers (no Ray); sharding them is the learner's business."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:  # pragma: no cover
    from pr_rlhf.configs.learner import LearnerConfig

log = logging.getLogger(__name__)


class CriticModel(nn.Module):
    """A value model: an HF decoder backbone (``AutoModel``) with a linear scalar head on every position."""

    def __init__(self, backbone: nn.Module, hidden_size: int, init_std: float) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.value_head.weight, std=init_std)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                keep_last: int) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=False).last_hidden_state
        hidden = hidden[:, -keep_last:]
        # a fresh tensor, not a view: FSDP2 hooks the module output for backward
        return self.value_head(hidden.to(self.value_head.weight.dtype))[..., 0].clone()


class RewardModel(nn.Module):
    """A scalar reward model held as the learner trains it: an HF decoder sequence-classification model
    (``num_labels`` 1) whose backbone and ``score`` head are this module's own children under their HF names, so
    its state dict *is* the HF model's (the saved folder loads with ``AutoModelForSequenceClassification``, and by
    path in the ``scalar`` reward kind). ``forward`` is a module call, so FSDP2 gathers the root's parameters."""

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.base_model_prefix = hf_model.base_model_prefix
        self.add_module(self.base_model_prefix, getattr(hf_model, self.base_model_prefix))
        self.score = hf_model.score
        self.config = hf_model.config
        self._no_split_modules = hf_model._no_split_modules

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                last: torch.Tensor) -> torch.Tensor:
        from pr_rlhf.reward.scalar import sequence_scores

        # a fresh tensor, not a view: FSDP2 hooks the module output for backward
        return sequence_scores(self, input_ids, attention_mask, last, position_ids).clone()


class AttentionConfigError(ValueError):
    """A learner config whose attention kernel cannot work; the message names the fields to change."""


def pick_attn_implementation(requested: str, device_type: str, dtype: Any, *, mask_4d: bool = False) -> str:
    """The attention kernel of a model computing in ``dtype``: ``requested`` unless "auto"; "auto" takes
    flash_attention_2 on CUDA in 16-bit when flash-attn is importable (it supports nothing else) and the model is
    never fed a 4-D attention mask (``mask_4d``: flash-attention 2 takes only 2-D padding masks, transformers#39608),
    otherwise sdpa (whose memory-efficient kernel takes any boolean mask). An explicit flash_attention_2 with
    ``mask_4d`` is refused."""
    if requested == "flash_attention_2" and mask_4d:
        raise AttentionConfigError("attn_implementation 'flash_attention_2' cannot take the 4-D attention mask this "
                                   "model is fed (transformers#39608)")
    if requested != "auto":
        return requested
    if device_type == "cuda" and str(dtype).endswith(("bfloat16", "float16")) and not mask_4d:
        if flash_attn_available():
            return "flash_attention_2"
    return "sdpa"


def flash_attn_available() -> bool:
    """flash-attn installed *and* importable. It ships no wheel for every torch, so it is often a source build, which
    may be installed and still fail to import (built against another torch or CUDA): "auto" then takes sdpa."""
    return importlib.util.find_spec("flash_attn") is not None and _flash_attn_imports()


@functools.lru_cache(maxsize=1)
def _flash_attn_imports() -> bool:
    try:
        importlib.import_module("flash_attn")
    except Exception as exc:  # noqa: BLE001 -- any failure to import means the kernel cannot run here
        log.warning("flash-attn is installed but does not import (%s: %s); using sdpa", type(exc).__name__, exc)
        return False
    return True


# The models a learner builds. The frozen reference is built lazily by a policy learner even without a KL term
# (compute_ref_logprobs, rebase_reference), so it is always one of them.
LEARNER_ROLES = ("policy", "reference", "critic", "reward_model")


def learner_roles(cfg: LearnerConfig) -> tuple[str, ...]:
    """The roles of the models a learner with ``cfg`` may build."""
    if cfg.trains == "reward_model":
        return ("reward_model",)
    return ("policy", "reference", "critic") if cfg.critic.enabled else ("policy", "reference")


def fed_4d_mask(cfg: LearnerConfig, role: str) -> bool:
    """Whether model ``role`` may be fed a 4-D attention mask: the policy's and reference's log-probs pack a
    shared prompt with its responses behind a 4-D block mask when ``shared_prefix`` (pr_rlhf.rl.packing); critic
    values and reward-model scores always take the 2-D padding mask (pr_rlhf.rl.forward)."""
    return cfg.shared_prefix and role in ("policy", "reference")


def attention_for(cfg: LearnerConfig, role: str, device_type: str | None = None) -> tuple[torch.dtype, str]:
    """(load dtype, attention kernel) of the learner's model ``role`` (one of :data:`LEARNER_ROLES`) on
    ``device_type`` ("cuda" / "cpu"; None: ``cfg.device``, "auto" meaning cuda when torch sees one).

    Load dtype: the trained models (policy, critic, reward model) hold float32 master weights; the frozen reference
    is stored in the compute dtype under fsdp2 (no optimizer to feed) and in float32 under strategy 'none' (the
    learner's ``Strategy.reference_dtype``).

    Kernel: chosen by the *compute* dtype ``cfg.dtype``, not the load dtype. FSDP2 mixed precision casts the float32
    parameters to ``cfg.dtype`` for every forward, so attention receives 16-bit queries / keys / values; under
    strategy 'none' (autocast) they arrive in float32 and transformers' FA2 integration casts them to the autocast
    dtype. At load, transformers (5.19, constraints.txt) only warns when flash-attention 2 is asked for a float32
    model. So a trained model computing in bfloat16 gets flash_attention_2 like the reference does, unless it is
    fed the packed 4-D mask (:func:`fed_4d_mask`): then sdpa. Raises :class:`AttentionConfigError` for an explicit
    flash_attention_2 that cannot work (fed the 4-D mask, or float32 compute). tests/unit/test_attention_kernel.py
    checks each of these facts."""
    if role not in LEARNER_ROLES:
        raise ValueError(f"unknown learner model role {role!r} (one of {LEARNER_ROLES})")
    check_attention_config(cfg)
    if device_type is None:
        device_type = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    compute = getattr(torch, cfg.dtype)
    frozen_low_precision = role == "reference" and cfg.strategy == "fsdp2"
    load = compute if frozen_low_precision else torch.float32
    return load, pick_attn_implementation(cfg.attn_implementation, device_type, compute,
                                          mask_4d=fed_4d_mask(cfg, role))


def check_attention_config(cfg: LearnerConfig) -> None:
    """Refuse an explicit flash_attention_2 that no model of the learner could run (see :func:`attention_for`)."""
    if cfg.attn_implementation != "flash_attention_2":
        return
    if cfg.dtype == "float32":
        raise AttentionConfigError("learner.attn_implementation 'flash_attention_2' computes in 16-bit only: set "
                                   "learner.dtype to bfloat16 / float16, or attn_implementation to auto / sdpa")
    packed = [r for r in learner_roles(cfg) if fed_4d_mask(cfg, r)]
    if packed:
        raise AttentionConfigError(
            f"learner.attn_implementation 'flash_attention_2' with learner.shared_prefix true: the "
            f"{' and '.join(packed)} are fed the packed 4-D shared-prefix mask, which flash-attention 2 cannot take "
            f"(transformers#39608); "
            f"set learner.shared_prefix: false, or attn_implementation: auto (sdpa for those, flash_attention_2 for "
            f"the others)")


def decoder_layer_classes(model: nn.Module) -> tuple[type, ...]:
    """The classes of ``model``'s decoder layers (HF's ``_no_split_modules``): the units FSDP2 shards one by one."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not classes:
        raise ValueError(f"{type(model).__name__}: cannot find its decoder layers (_no_split_modules={names})")
    return tuple(classes)


def _no_dropout(module: nn.Module) -> None:
    """On-policy PPO needs log-probs that do not depend on train / eval mode."""
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0


def _build(auto_class: Any, model_dir: str, meta: bool, **kwargs: Any) -> nn.Module:
    """``auto_class`` from ``model_dir``'s weights, or (``meta``) its structure alone on the meta device: no
    memory, no file read but the config; the weights arrive later (the learner broadcasts rank 0's)."""
    if not meta:
        return auto_class.from_pretrained(model_dir, **kwargs)
    from transformers import AutoConfig

    config_kwargs = {k: kwargs.pop(k) for k in ("num_labels",) if k in kwargs}
    config = AutoConfig.from_pretrained(model_dir, **config_kwargs)
    with torch.device("meta"):
        return auto_class.from_config(config, **kwargs)


def load_causal_lm(model_dir: str, dtype: torch.dtype, attn_implementation: str, *, trainable: bool,
                   gradient_checkpointing: bool = False, meta: bool = False) -> nn.Module:
    """The policy (``trainable``: train mode, optionally gradient checkpointing) or a frozen copy (eval mode, no
    gradients) for the reference; dropout off either way. ``meta``: the structure only (see ``_build``)."""
    from transformers import AutoModelForCausalLM

    model = _build(AutoModelForCausalLM, model_dir, meta, dtype=dtype, attn_implementation=attn_implementation)
    _no_dropout(model)
    if trainable:
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    else:
        model.eval().requires_grad_(False)
    return model


def load_critic(model_dir: str, attn_implementation: str, *, gradient_checkpointing: bool = False,
                meta: bool = False) -> CriticModel:
    """The critic in float32, train mode: the backbone's initial weights and a fresh value head (drawn from the
    torch RNG: seed it first for the same head on every rank). ``meta``: the structure only."""
    from transformers import AutoModel

    backbone = _build(AutoModel, model_dir, meta, dtype=torch.float32, attn_implementation=attn_implementation)
    _no_dropout(backbone)
    if gradient_checkpointing:
        backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with torch.device("meta" if meta else "cpu"):
        critic = CriticModel(backbone, backbone.config.hidden_size,
                             float(getattr(backbone.config, "initializer_range", 0.02)))
    critic._no_split_modules = backbone._no_split_modules  # type: ignore[attr-defined]
    return critic.train()


def load_reward_model(model_dir: str, attn_implementation: str, pad_token_id: int, *,
                      gradient_checkpointing: bool = False, meta: bool = False) -> RewardModel:
    """A reward model in float32, train mode, from ``model_dir``: a trained RM's folder keeps its head; a causal
    LM's gets a fresh one (drawn from the torch RNG: seed it first for the same head on every rank). ``meta``: the
    structure only."""
    from transformers import AutoModelForSequenceClassification

    hf = _build(AutoModelForSequenceClassification, model_dir, meta, num_labels=1, dtype=torch.float32,
                attn_implementation=attn_implementation)
    if not isinstance(getattr(hf, "score", None), nn.Module):
        raise ValueError(f"{model_dir}: {type(hf).__name__} has no 'score' head: a reward model needs a decoder "
                         f"model with a sequence-classification class (Llama, Qwen2, SmolLM2, ...)")
    hf.config.pad_token_id = pad_token_id
    hf.config.architectures = [type(hf).__name__]
    _no_dropout(hf)
    if gradient_checkpointing:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return RewardModel(hf).train()
