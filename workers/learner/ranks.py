"""The learner's ranks as a torch process group: joining it (gloo on CPU, nccl on GPU) and the few collectives the
learner itself runs (barrier, sum / max of numbers, union of names). A lone rank needs no collective."""
from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_endpoint() -> tuple[str, int, str]:
    """(this node's IP, a free port, the Ray node id): rank 0 offers the first two as MASTER_ADDR / PORT."""
    from workers.ray_utils import current_node_id

    node = current_node_id()   # "local" outside Ray (asking Ray's runtime context would start a Ray)
    if node == "local":
        return "127.0.0.1", free_port(), node
    import ray

    return ray.util.get_node_ip_address(), free_port(), node


@dataclass(frozen=True)
class Ranks:
    """This rank in a process group of ``world_size`` (``device``: where collectives' tensors live)."""

    rank: int
    world_size: int
    device: torch.device

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 and dist.is_initialized()

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def reduce(self, values: Sequence[float], op: str = "sum") -> list[float]:
        """Element-wise sum (or max) over the ranks, in float64."""
        if not self.distributed:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t.tolist()

    def first_error(self, error: str | None) -> str | None:
        """The error of the lowest rank that had one, on every rank (None when no rank had one)."""
        if not self.distributed:
            return error
        gathered: list[str | None] = [None] * self.world_size
        dist.all_gather_object(gathered, error)
        return next((e for e in gathered if e is not None), None)

    def union(self, names: Sequence[str]) -> list[str]:
        """The sorted union of every rank's ``names``."""
        if not self.distributed:
            return sorted(names)
        gathered: list[list[str]] = [[] for _ in range(self.world_size)]
        dist.all_gather_object(gathered, sorted(names))
        return sorted({n for g in gathered for n in g})


NOSET_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


def cuda_index_for(environ: dict[str, str], ray_gpu_ids: Sequence[int | str]) -> int | None:
    """The CUDA index of this rank's GPU, or None for the current device. Ray normally narrows
    ``CUDA_VISIBLE_DEVICES`` to the actor's GPU (index 0 inside it); with
    ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` set (as some clusters and colocated trainers do) every GPU
    stays visible, and the rank must take the one Ray gave it, else every rank lands on cuda:0."""
    if environ.get(NOSET_VISIBLE_DEVICES, "") not in ("", "0") and ray_gpu_ids:
        return int(ray_gpu_ids[0])
    return None


def own_cuda_index() -> int:
    """This rank's GPU (see :func:`cuda_index_for`), made the current device."""
    ids: list = []
    if os.environ.get(NOSET_VISIBLE_DEVICES):
        import ray

        ids = ray.get_gpu_ids() if ray.is_initialized() else []
    index = cuda_index_for(dict(os.environ), ids)
    if index is not None:
        torch.cuda.set_device(index)
    return torch.cuda.current_device()


def join_process_group(rank: int, world_size: int, device_choice: str, master_addr: str | None,
                       master_port: int | None) -> tuple[Ranks, bool]:
    """Set the torch.distributed environment and join (or check) the process group. ``device_choice``: 'cuda',
    'cpu' or 'auto' (cuda when this process sees a GPU). Returns the ranks and whether this call created the
    group (then the learner destroys it at shutdown)."""
    os.environ["MASTER_ADDR"] = master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    # a lone rank outside a group takes a fresh port (a stale MASTER_PORT in the environment may be taken)
    inherited = os.environ.get("MASTER_PORT") if world_size > 1 else None
    os.environ["MASTER_PORT"] = str(master_port or inherited or free_port())
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("LOCAL_RANK", "0")
    use_cuda = device_choice == "cuda" or (device_choice == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but this worker sees no GPU")
    device = torch.device("cuda", own_cuda_index()) if use_cuda else torch.device("cpu")
    owns = False
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)
        owns = True
    elif dist.get_world_size() != world_size:
        raise RuntimeError(f"a process group of size {dist.get_world_size()} already exists; this learner "
                           f"needs {world_size}")
    return Ranks(rank, world_size, device), owns
