"""The ``gloo`` weight transfer learner -> rollout engines, with vLLM's update protocol and an all-or-nothing commit.

vLLM's RL weight-transfer API (``LLM.init_weight_transfer_engine``, ``start_weight_update``, ``update_weights``,
``finish_weight_update``) ships an NCCL engine for GPUs; this module is the transport of the ``gloo`` engine that
``pr_rlhf.models.vllm_weight_transfer`` registers beside it (CPU runs, CI, and an engine sharing the learner's GPU,
which NCCL refuses), and of the HF rollout engine, which speaks the same protocol without vLLM. Pure torch.

Members: group rank 0 is the sender (learner rank 0); every receiving process (an HF engine, each tensor-parallel
worker of a vLLM engine) is one rank after it and takes the full tensors (vLLM's ``load_weights`` slices them). The
group is a ``TCPStore`` on the sender's node and a ``ProcessGroupGloo`` of its own, independent of the learner's and
vLLM's process groups; every collective on it has a timeout, so a lost member fails the sync instead of hanging it.

A sync of a :class:`TransferPlan` (names, wire dtypes, full shapes: plain lists, so it crosses vLLM's msgpack and
Ray unchanged) goes bucket by bucket (consecutive tensors of one dtype up to ``bucket_bytes``; both sides cut the
same buckets from the plan). Before each bucket the sender broadcasts a header: DATA, or ABORT when producing the
bucket failed (a tensor whose shape or dtype is not the plan's, a failed gather). A receiver that fails to load a
tensor keeps receiving (the group stays in step) without loading. At the end every member contributes its status to
one all-reduce, so all of them learn whether the sync succeeded everywhere: receivers that took new weights put the
previous ones back (:func:`snapshot` / :func:`restore`) unless every member succeeded, and the error raised names
the tensor. After a failed sync the group is still usable.
"""
from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

DEFAULT_BUCKET_BYTES = 256 << 20
DEFAULT_TIMEOUT_S = 120.0
_DATA, _ABORT = 0, 1
_OK, _FAILED = 0, 1
_ERROR_BYTES = 512   # of each member's error message, when a sync failed


class WeightTransferError(RuntimeError):
    """A weight sync failed; the receivers kept (or got back) the weights they had before it."""


@dataclass(frozen=True)
class TransferPlan:
    """What one sync sends, in order: the same fields as vLLM's NCCL update info."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(f"transfer plan: {len(self.names)} names, {len(self.dtype_names)} dtypes and "
                             f"{len(self.shapes)} shapes")

    @classmethod
    def of(cls, tensors: Iterable[tuple[str, torch.dtype | str, Iterable[int]]]) -> TransferPlan:
        names, dtypes, shapes = [], [], []
        for name, dtype, shape in tensors:
            names.append(name)
            dtypes.append(dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch."))
            shapes.append([int(d) for d in shape])
        return cls(names, dtypes, shapes)

    @classmethod
    def from_dict(cls, payload: Mapping) -> TransferPlan:
        return cls(list(payload["names"]), list(payload["dtype_names"]), [list(s) for s in payload["shapes"]])

    def as_dict(self) -> dict[str, list]:
        return {"names": list(self.names), "dtype_names": list(self.dtype_names),
                "shapes": [list(s) for s in self.shapes]}

    def numel(self, i: int) -> int:
        n = 1
        for d in self.shapes[i]:
            n *= d
        return n

    def nbytes(self) -> int:
        return sum(self.numel(i) * _itemsize(self.dtype_names[i]) for i in range(len(self.names)))

    def buckets(self, bucket_bytes: int) -> list[range]:
        """Consecutive index ranges of one dtype and at most ``bucket_bytes`` (a larger tensor goes alone)."""
        out: list[range] = []
        start, size = 0, 0
        for i, dtype in enumerate(self.dtype_names):
            nbytes = self.numel(i) * _itemsize(dtype)
            if i > start and (size + nbytes > bucket_bytes or dtype != self.dtype_names[start]):
                out.append(range(start, i))
                start, size = i, 0
            size += nbytes
        if start < len(self.names):
            out.append(range(start, len(self.names)))
        return out


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


class GlooGroup:
    """One member of a transfer group: rank 0 sends, every other rank receives. Joining blocks until every member
    has joined (or ``timeout_s`` passes)."""

    def __init__(self, host: str, port: int, rank: int, world_size: int,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        import torch.distributed as dist

        if not 0 <= rank < world_size:
            raise ValueError(f"weight transfer group: rank {rank} outside world size {world_size}")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self._store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout,
                                    wait_for_workers=False)
        self._pg = dist.ProcessGroupGloo(dist.PrefixStore("pr_rlhf_weight_transfer", self._store), rank,
                                         world_size, timeout)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's host ``tensor`` into every rank's."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self._pg.broadcast([tensor], opts).wait()

    def agree(self, error: str | None) -> list[str]:
        """Every member's error (``[]`` when no member failed): an all-reduce of the statuses, then, only when one
        failed, an all-gather of the messages (each cut to a few hundred bytes)."""
        import torch.distributed as dist

        status = torch.tensor([_FAILED if error else _OK], dtype=torch.int64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        self._pg.allreduce([status], opts).wait()
        if int(status.item()) == _OK:
            return []
        mine = torch.zeros(_ERROR_BYTES, dtype=torch.uint8)
        encoded = (error or "").encode()[:_ERROR_BYTES]
        mine[:len(encoded)] = torch.tensor(list(encoded), dtype=torch.uint8)
        gathered = [torch.empty(_ERROR_BYTES, dtype=torch.uint8) for _ in range(self.world_size)]
        self._pg.allgather([gathered], [mine]).wait()
        messages = (bytes(t.tolist()).rstrip(b"\0").decode(errors="replace") for t in gathered)
        return [f"member {rank}: {m}" for rank, m in enumerate(messages) if m]

    def close(self) -> None:
        self._pg = None
        self._store = None


def send(group: GlooGroup, plan: TransferPlan, tensors: Iterator[tuple[str, torch.Tensor]],
         bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
    """Rank 0: every tensor of ``tensors`` (in the plan's order), checked against the plan, in buckets. Returns the
    bytes sent. Raises :class:`WeightTransferError` naming the tensor when producing a bucket fails (the receivers
    were told to abort) or when a receiver failed (then its own error says which tensor)."""
    error: str | None = None
    header = torch.empty(1, dtype=torch.int64)
    sent = 0
    for b, bucket in enumerate(plan.buckets(bucket_bytes)):
        if error is None:
            try:
                flat = _pack(plan, bucket, tensors)
            except Exception as exc:  # noqa: BLE001 -- any failure to produce a bucket aborts the sync
                error = f"bucket {b + 1}: {exc}"
        header.fill_(_ABORT if error else _DATA)
        group.broadcast(header)
        if error:
            break
        group.broadcast(flat)
        sent += flat.numel() * flat.element_size()
    errors = group.agree(error)
    if errors:
        raise WeightTransferError(f"weight sync failed, the engines keep their previous weights: {'; '.join(errors)}")
    return sent


def _pack(plan: TransferPlan, bucket: range, tensors: Iterator[tuple[str, torch.Tensor]]) -> torch.Tensor:
    dtype = getattr(torch, plan.dtype_names[bucket.start])
    flat = torch.empty(sum(plan.numel(i) for i in bucket), dtype=dtype)
    offset = 0
    for i in bucket:
        name, tensor = next(tensors)
        expected = (plan.names[i], dtype, tuple(plan.shapes[i]))
        if (name, tensor.dtype, tuple(tensor.shape)) != expected:
            raise ValueError(f"{plan.names[i]}: the plan says {plan.dtype_names[i]} {tuple(plan.shapes[i])}, the "
                             f"source gave {name} {str(tensor.dtype).removeprefix('torch.')} {tuple(tensor.shape)}")
        n = plan.numel(i)
        flat[offset:offset + n].copy_(tensor.detach().reshape(-1))
        offset += n
    return flat


def receive(group: GlooGroup, plan: TransferPlan, load: Callable[[str, torch.Tensor], None],
            bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
    """A receiver: ``load(name, tensor)`` for every tensor of the plan (each bucket in a buffer of its own, so a
    loader may keep a tensor until its layer is complete). Returns the tensors loaded; raises
    :class:`WeightTransferError` when any member failed -- the caller then puts its previous weights back."""
    error: str | None = None
    header = torch.empty(1, dtype=torch.int64)
    loaded = 0
    buckets = plan.buckets(bucket_bytes)
    for b, bucket in enumerate(buckets):
        group.broadcast(header)
        if int(header.item()) == _ABORT:
            error = error or f"the sender aborted at bucket {b + 1} of {len(buckets)}"
            break
        flat = torch.empty(sum(plan.numel(i) for i in bucket), dtype=getattr(torch, plan.dtype_names[bucket.start]))
        group.broadcast(flat)
        if error:
            continue   # keep receiving: the group stays in step
        offset = 0
        for i in bucket:
            n = plan.numel(i)
            try:
                load(plan.names[i], flat[offset:offset + n].view(plan.shapes[i]))
                loaded += 1
            except Exception as exc:  # noqa: BLE001 -- a bad tensor fails the sync, never the group
                error = f"loading {plan.names[i]} {tuple(plan.shapes[i])}: {type(exc).__name__}: {exc}"
                break
            offset += n
    errors = group.agree(error)
    if errors:
        raise WeightTransferError(f"weight sync failed, previous weights kept: {'; '.join(errors)}")
    return loaded


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A host copy of ``module``'s state (parameters and persistent buffers), to :func:`restore` after a failed
    sync."""
    return {name: t.detach().to("cpu", copy=True) for name, t in module.state_dict().items()}


def restore(module: torch.nn.Module, saved: Mapping[str, torch.Tensor]) -> None:
    """``saved`` copied back into ``module``'s own tensors, in place (their storage is what compiled graphs and
    caches hold)."""
    with torch.no_grad():
        for name, tensor in module.state_dict(keep_vars=True).items():
            if name in saved:
                tensor.data.copy_(saved[name])


class ModuleReceiver:
    """The receiving side of a plain torch module (the HF rollout engine), with the calls of vLLM's worker engines:
    ``init`` (join the group), ``start`` (snapshot), ``update`` (receive and copy in place by name; on failure the
    snapshot goes back and ``error`` says why: the sender learns it through the group), ``finish``, ``shutdown``."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.group: GlooGroup | None = None
        self.bucket_bytes = DEFAULT_BUCKET_BYTES
        self._saved: dict[str, torch.Tensor] | None = None
        self.error: str | None = None

    def init(self, info: Mapping) -> None:
        if "packed" in info or "nccl_unique_id_b64" in info:
            raise ValueError("an hf rollout engine receives weights over gloo only (its device's memory is staged "
                             "through the host): use a vllm engine for nccl, or weight_transfer: gloo")
        self.bucket_bytes = int(info.get("bucket_bytes", DEFAULT_BUCKET_BYTES))
        self.group = GlooGroup(str(info["master_address"]), int(info["master_port"]), int(info["rank_offset"]),
                               int(info["world_size"]), float(info.get("timeout_s", DEFAULT_TIMEOUT_S)))

    def start(self) -> None:
        self.error = None
        self._saved = snapshot(self.module)

    def update(self, update_info: Mapping) -> None:
        if self.group is None:
            raise RuntimeError("weight transfer: init was never called")
        plan = TransferPlan.from_dict(update_info)
        params = dict(self.module.named_parameters(remove_duplicate=False))   # tied ones under each name
        left_out = sorted(set(params) - set(plan.names))

        def load(name: str, tensor: torch.Tensor) -> None:
            if left_out:
                raise ValueError(f"the sync would leave {len(left_out)} parameters unchanged ({left_out[:3]})")
            if name not in params:
                raise ValueError(f"{name} is not a parameter of this model")
            if tuple(params[name].shape) != tuple(tensor.shape):
                raise ValueError(f"{name} is {tuple(params[name].shape)} here")
            params[name].copy_(tensor)

        try:
            with torch.no_grad():
                receive(self.group, plan, load, self.bucket_bytes)
        except Exception as exc:  # noqa: BLE001 -- reported through the group and kept in `error`
            self.error = str(exc)
            if self._saved is not None:
                restore(self.module, self._saved)
            self._saved = None

    def finish(self) -> None:
        self._saved = None

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
