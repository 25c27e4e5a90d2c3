"""How the learner holds its models, the one place that tells strategy 'fsdp2' from 'none'.

``fsdp2``: every model is sharded with ``torch.distributed.fsdp.fully_shard`` (per decoder layer, then the root)
over a 1-D device mesh; mixed precision casts the parameters for compute and reduces gradients in float32.
``none``: a plain module on the device (one rank); a low-precision compute dtype runs under autocast.
Everything else (state dicts, optimizers, steps) is the same code for both.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

import torch
from torch import nn

from pr_rlhf.rl.modeling import decoder_layer_classes


class Strategy(Protocol):
    name: str
    reference_dtype: torch.dtype   # the frozen reference's parameters

    def wrap(self, model: nn.Module, frozen: bool = False) -> nn.Module:
        """Place (and shard) a freshly loaded model."""

    def autocast(self) -> AbstractContextManager:
        """The context a forward runs in."""

    def reshard(self, model: nn.Module) -> None:
        """Free any unsharded parameters (before state-dict I/O and after no-grad forwards)."""

    def set_gradient_sync(self, model: nn.Module, sync: bool) -> None:
        """Whether the next backward reduces gradients over the ranks (off while accumulating micro-batches)."""


class PlainModule:
    name = "none"

    def __init__(self, device: torch.device, compute_dtype: torch.dtype) -> None:
        self.device = device
        self.compute_dtype = compute_dtype
        self.reference_dtype = torch.float32

    def wrap(self, model: nn.Module, frozen: bool = False) -> nn.Module:
        return model.to(self.device)

    def autocast(self) -> AbstractContextManager:
        if self.compute_dtype != torch.float32:
            return torch.autocast(self.device.type, dtype=self.compute_dtype)
        return nullcontext()

    def reshard(self, model: nn.Module) -> None:
        return None

    def set_gradient_sync(self, model: nn.Module, sync: bool) -> None:
        return None


class Fsdp2:
    name = "fsdp2"

    def __init__(self, device: torch.device, compute_dtype: torch.dtype, world_size: int) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self.compute_dtype = compute_dtype
        self.reference_dtype = compute_dtype
        self.world_size = world_size
        self.mesh = init_device_mesh(device.type, (world_size,))

    def wrap(self, model: nn.Module, frozen: bool = False) -> nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy()
        if not frozen and self.compute_dtype != torch.float32:
            mp = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        layer_types = decoder_layer_classes(model)
        for module in model.modules():
            if isinstance(module, layer_types):
                fully_shard(module, mesh=self.mesh, mp_policy=mp)
        fully_shard(model, mesh=self.mesh, mp_policy=mp)
        return model

    def autocast(self) -> AbstractContextManager:
        return nullcontext()  # FSDP2 casts the parameters itself

    def reshard(self, model: nn.Module) -> None:
        """The root module keeps its parameters unsharded after a forward without backward (its
        reshard_after_forward defaults to False); state-dict loading and memory both want them sharded."""
        from torch.distributed.fsdp import FSDPModule

        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()

    def set_gradient_sync(self, model: nn.Module, sync: bool) -> None:
        if self.world_size > 1:
            model.set_requires_gradient_sync(sync)


def make_strategy(name: str, device: torch.device, compute_dtype: torch.dtype, world_size: int) -> Strategy:
    """The strategy ``LearnerConfig.strategy`` names (call after joining the process group)."""
    if name == "fsdp2":
        return Fsdp2(device, compute_dtype, world_size)
    if name == "none":
        return PlainModule(device, compute_dtype)
    raise ValueError(f"unknown learner strategy {name!r} (use 'fsdp2' or 'none')")
