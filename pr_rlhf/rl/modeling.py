"""The models the learner trains, loaded from an HF model directory: the policy / frozen reference (a causal LM)
and the PPO critic (the policy's backbone with a scalar value head). Pure torch + transformers (no Ray); sharding
them is the learner's business."""
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
