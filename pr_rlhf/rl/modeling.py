"""The models the learner trains, loaded from an HF model directory: the policy / frozen reference (a causal LM),
the PPO critic (the policy's backbone with a scalar value head) and a Bradley-Terry reward model (an HF
sequence-classification model). Pure torch + transformers (no Ray); sharding them is the learner's business."""
from __future__ import annotations

import importlib.util
from typing import Any

import torch
from torch import nn


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


def pick_attn_implementation(requested: str, device_type: str, dtype: Any) -> str:
    """The attention kernel to load a model with: ``requested`` unless "auto"; "auto" takes flash_attention_2 on
    CUDA in 16-bit when flash-attn is importable (it supports nothing else), otherwise sdpa."""
    if requested != "auto":
        return requested
    if device_type == "cuda" and str(dtype).endswith(("bfloat16", "float16")):
        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
    return "sdpa"


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


def load_causal_lm(model_dir: str, dtype: torch.dtype, attn_implementation: str, *, trainable: bool,
                   gradient_checkpointing: bool = False) -> nn.Module:
    """The policy (``trainable``: train mode, optionally gradient checkpointing) or a frozen copy (eval mode, no
    gradients) for the reference; dropout off either way."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn_implementation)
    _no_dropout(model)
    if trainable:
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    else:
        model.eval().requires_grad_(False)
    return model


def load_critic(model_dir: str, attn_implementation: str, *, gradient_checkpointing: bool = False) -> CriticModel:
    """The critic in float32, train mode: the backbone's initial weights and a fresh value head (drawn from the
    torch RNG: seed it first for the same head on every rank)."""
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn_implementation)
    _no_dropout(backbone)
    if gradient_checkpointing:
        backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    critic = CriticModel(backbone, backbone.config.hidden_size,
                         float(getattr(backbone.config, "initializer_range", 0.02)))
    critic._no_split_modules = backbone._no_split_modules  # type: ignore[attr-defined]
    return critic.train()


def load_reward_model(model_dir: str, attn_implementation: str, pad_token_id: int, *,
                      gradient_checkpointing: bool = False) -> RewardModel:
    """A reward model in float32, train mode, from ``model_dir``: a trained RM's folder keeps its head; a causal
    LM's gets a fresh one (drawn from the torch RNG: seed it first for the same head on every rank)."""
    from transformers import AutoModelForSequenceClassification

    hf = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32,
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
