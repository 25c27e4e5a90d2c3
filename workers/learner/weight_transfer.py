"""The learner's side of the weight sync (learner ranks -> rollout engines), through vLLM's weight-transfer API.

Every learner rank holds a ``TrainerWeightTransferEngine`` built by vLLM's ``WeightTransferTrainerFactory`` (``nccl``
from vLLM, ``gloo`` from :mod:`pr_rlhf.models.vllm_weight_transfer`) over a :class:`PolicySource`: each parameter
gathered whole (a collective of the learner ranks, one parameter at a time, so no rank holds the whole model) and
cast to the engines' dtype. Rank 0 sends and drives the engines through :class:`RolloutClient`, a
``VLLMWeightSyncClient`` over the ``RolloutWorker`` actors; the driver only starts the calls, and no model tensor
reaches it or Ray's object store. A failed sync fails on every learner rank with rank 0's error.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from workers.learner.ranks import Ranks


class RolloutClient:
    """vLLM's weight-sync control plane over ``RolloutWorker`` actors: each call fans out to every engine and waits
    (at most ``timeout_s``). Engine i's first worker takes group rank ``rank_offset`` + the receivers of the
    engines before it (vLLM's own clients give every engine the same offset, which fits one data-parallel
    deployment, not several independent engines)."""

    def __init__(self, rollouts: Sequence[Any], receivers: Sequence[int], timeout_s: float) -> None:
        self.rollouts, self.receivers, self.timeout_s = list(rollouts), list(receivers), timeout_s
        self.version: int | None = None   # the learner's step, set before each sync

    def _all(self, method: str, *args: Any) -> None:
        import ray

        ray.get([getattr(r, method).remote(*args) for r in self.rollouts], timeout=self.timeout_s)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        import ray

        calls, offset = [], int(init_info["rank_offset"])
        for rollout, n in zip(self.rollouts, self.receivers):
            calls.append(rollout.init_weight_transfer_engine.remote({**init_info, "rank_offset": offset}))
            offset += n
        ray.get(calls, timeout=self.timeout_s)

    def start_weight_update(self) -> None:
        self._all("start_weight_update")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._all("update_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish_weight_update", self.version)

    def abort_weight_update(self) -> None:
        """(not in vLLM's client protocol) End a failed update everywhere without committing it."""
        self._all("abort_weight_update")

    def shutdown_weight_transfer_engine(self) -> None:
        self._all("shutdown_weight_transfer_engine")


def policy_source(model: nn.Module, dtype: str) -> Any:
    """The policy as vLLM's ``WeightSource``: HF names (tied parameters under every name: vLLM's layerwise reload
    re-creates a layer's tensors, so a tied head left out would keep the old embedding), each parameter gathered
    whole when iterated and cast to ``dtype`` (the wire dtype: what the engines run)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    wire = getattr(torch, dtype)

    class PolicySource(WeightSource):
        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(name, wire, tuple(p.shape))
                    for name, p in model.named_parameters(remove_duplicate=False)]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            with torch.no_grad():
                for name, p in model.named_parameters(remove_duplicate=False):
                    p = p.detach()
                    yield name, (p.full_tensor() if hasattr(p, "full_tensor") else p).to(wire)

    return PolicySource()


class LearnerTransfer:
    """One learner rank's trainer engine and the client it drives (rank 0 only calls it)."""

    def __init__(self, source: Any, ranks: Ranks, rollouts: Sequence[Any], receivers: Sequence[int],
                 backend: str, host: str, port: int, bucket_bytes: int, timeout_s: float) -> None:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        from pr_rlhf.models.vllm_weight_transfer import GlooTrainerInitInfo, register

        register()
        world_size = 1 + sum(receivers)
        if backend == "gloo":
            info: Any = GlooTrainerInitInfo(host, port, world_size, bucket_bytes, timeout_s, rank=ranks.rank)
        elif backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            info = NCCLTrainerInitInfo(host, port, world_size, rank=ranks.rank)
        else:
            raise ValueError(f"weight transfer backend {backend!r}: use 'gloo' or 'nccl'")
        self.ranks = ranks
        self.client = RolloutClient(rollouts, receivers, timeout_s)
        self.engine = WeightTransferTrainerFactory.trainer_init(info, client=self.client, source=source)

    def send(self, version: int) -> None:
        """Collective over the learner ranks. Raises ``WeightTransferError`` on every rank when the sync failed on
        any (rank 0's message: it names the tensor or the engine that failed)."""
        from pr_rlhf.models.weight_transfer import WeightTransferError

        self.client.version = version
        error = None
        try:
            self.engine.send_weights()
        except Exception as exc:  # noqa: BLE001 -- every rank must learn of it, then it is raised again
            error = (str(exc) if isinstance(exc, WeightTransferError)
                     else f"weight sync failed: {type(exc).__name__}: {exc}")
        first = self.ranks.first_error(error)
        if first is not None:
            raise WeightTransferError(first)

    def close(self) -> None:
        """Release the group here and (rank 0) in the engines; the engines keep serving."""
        try:
            if self.engine.is_sender:
                self.client.shutdown_weight_transfer_engine()
        finally:
            self.engine.shutdown()
