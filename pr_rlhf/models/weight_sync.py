"""Weight transport learner -> rollout engines over a process group of their own, never through the Ray driver.

The group holds learner rank 0 (group rank 0, the only sender) and every receiving process of every rollout engine
(an HF engine is one receiver; a vLLM engine one per tensor-parallel worker, each taking the full tensors: vLLM's
own ``load_weights`` slices them for its rank). It is built from a ``TCPStore`` on learner rank 0's node and a
backend-specific ``ProcessGroup`` object (gloo on CPU, NCCL on GPU), so it is independent of the learner's
default group and of vLLM's: nothing else is initialized or torn down by joining it.

A sync sends the policy's parameters in *buckets*: flat tensors of the rollout dtype of at most ``bucket_bytes``
(a parameter larger than that goes alone), described by a plan of names and shapes that the driver passes along
(metadata only). The learner gathers one parameter at a time (``DTensor.full_tensor``, a collective of the
learner ranks), so no rank ever holds the whole model; on GPU the gathered tensors and buckets stay on the
device. Receivers rebuild each bucket's tensors as views of the flat buffer and hand them to the engine's loader.

Pure torch: importable by vLLM's worker processes (``pr_rlhf.models.vllm_weight_receiver``) and the learner.
"""
from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

DEFAULT_BUCKET_BYTES = 256 << 20


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Bucket:
    """Tensors sent as one flat broadcast, in this order."""

    dtype: str               # torch dtype name, e.g. "bfloat16"
    tensors: tuple[TensorSpec, ...]

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


def plan_buckets(shapes: Iterable[tuple[str, tuple[int, ...]]], dtype: str,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Bucket]:
    """Consecutive tensors grouped into buckets of at most ``bucket_bytes`` in ``dtype`` (one larger tensor goes
    alone). Order is kept: receivers load in the sender's order."""
    item = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    buckets: list[Bucket] = []
    current: list[TensorSpec] = []
    size = 0
    for name, shape in shapes:
        spec = TensorSpec(name, tuple(int(d) for d in shape))
        if current and size + spec.numel * item > bucket_bytes:
            buckets.append(Bucket(dtype, tuple(current)))
            current, size = [], 0
        current.append(spec)
        size += spec.numel * item
    if current:
        buckets.append(Bucket(dtype, tuple(current)))
    return buckets


class WeightUpdateGroup:
    """One member of a weight-update group: rank 0 sends, every other rank receives."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, *, backend: str = "gloo",
                 device: str | torch.device = "cpu", timeout_s: float = 600.0) -> None:
        import torch.distributed as dist

        if not 0 <= rank < world_size:
            raise ValueError(f"weight-update group: rank {rank} outside world size {world_size}")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
        self._store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout,
                                    wait_for_workers=False)
        store = dist.PrefixStore("pr_rlhf_weight_sync", self._store)
        if backend == "gloo":
            self._pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        elif backend == "nccl":
            self._pg = dist.ProcessGroupNCCL(store, rank, world_size)
        else:
            raise ValueError(f"weight-update group: backend {backend!r} (use 'gloo' or 'nccl')")
        self.backend = backend

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's ``tensor`` into every rank's ``tensor`` (same shape and dtype everywhere)."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        if self.backend == "gloo" and tensor.device.type != "cpu":   # gloo moves host memory: one bucket staged
            host = tensor.cpu() if self.rank == 0 else torch.empty(tensor.shape, dtype=tensor.dtype)
            self._pg.broadcast([host], opts).wait()
            tensor.copy_(host)
            return
        self._pg.broadcast([tensor], opts).wait()

    def close(self) -> None:
        self._pg = None
        self._store = None


def send_buckets(group: WeightUpdateGroup | None, buckets: list[Bucket],
                 full_tensor: Callable[[str], torch.Tensor], device: torch.device) -> int:
    """Fill and broadcast every bucket. ``full_tensor(name)`` returns the parameter whole (a collective on the
    learner ranks: every rank calls this function, only the one holding ``group`` sends). Returns bytes sent."""
    sent = 0
    for bucket in buckets:
        flat = torch.empty(bucket.numel, dtype=getattr(torch, bucket.dtype), device=device) if group else None
        offset = 0
        for spec in bucket.tensors:
            full = full_tensor(spec.name)
            if tuple(full.shape) != spec.shape:
                raise RuntimeError(f"weight sync: {spec.name} has shape {tuple(full.shape)}, the plan says "
                                   f"{spec.shape}")
            if flat is not None:
                flat[offset:offset + spec.numel].copy_(full.reshape(-1))
            offset += spec.numel
            del full
        if group is not None:
            group.broadcast(flat)
            sent += bucket.nbytes
    return sent


def receive_buckets(group: WeightUpdateGroup, buckets: list[Bucket],
                    device: torch.device) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Each bucket's tensors (views of one received flat buffer, valid until the next bucket arrives)."""
    buffers: dict[str, torch.Tensor] = {}
    for bucket in buckets:
        largest = max(b.numel for b in buckets if b.dtype == bucket.dtype)
        buf = buffers.get(bucket.dtype)
        if buf is None:
            buf = buffers[bucket.dtype] = torch.empty(largest, dtype=getattr(torch, bucket.dtype), device=device)
        flat = buf[:bucket.numel]
        group.broadcast(flat)
        out, offset = [], 0
        for spec in bucket.tensors:
            out.append((spec.name, flat[offset:offset + spec.numel].view(spec.shape)))
            offset += spec.numel
        yield out
