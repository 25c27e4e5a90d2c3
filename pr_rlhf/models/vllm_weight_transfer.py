"""The ``gloo`` backend of vLLM's weight-transfer API, registered through its factories (a vLLM general plugin).

vLLM (0.32) transfers RL weights through ``WeightTransferEngine`` subclasses chosen by
``LLM(weight_transfer_config={"backend": ...})`` and built inside every worker process; the trainer drives them with
a ``TrainerWeightTransferEngine`` and a client (``init_weight_transfer_engine``, ``start_weight_update``,
``update_weights``, ``finish_weight_update``). vLLM ships ``nccl`` (GPUs, across nodes) and ``ipc``; this module
adds ``gloo`` (host memory: CPU engines, CI, and an engine sharing the learner's GPU), whose transport and commit
rule are :mod:`pr_rlhf.models.weight_transfer`:

- the worker engine takes a host snapshot of its model at ``start_weight_update`` and loads each received tensor
  through vLLM's layerwise reload (``load_weights`` slices it for the worker's tensor-parallel rank); when the sync
  fails anywhere in the group it finalizes the reload and puts the snapshot back before raising, so the engine
  serves the previous weights and the next sync starts clean;
- the trainer engine sends from any ``WeightSource`` (FSDP2 shards gathered one parameter at a time), drives the
  clients' update concurrently with its broadcast, and finishes the update only when every member succeeded.

``register()`` is the plugin (``setup.py``: entry point group ``vllm.general_plugins``): vLLM calls it in every
process it starts (engine core, tensor-parallel workers), before building a worker's transfer engine. It also asks
Linux for AMX tile state there (bf16 on CPU crashes intermittently in vLLM's worker processes otherwise).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from pr_rlhf.models import weight_transfer as wt

BACKEND = "gloo"


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """Worker side: where the group forms and which rank this engine's first worker takes."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    bucket_bytes: int = wt.DEFAULT_BUCKET_BYTES
    timeout_s: float = wt.DEFAULT_TIMEOUT_S


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = BACKEND

    master_address: str
    master_port: int
    world_size: int
    bucket_bytes: int = wt.DEFAULT_BUCKET_BYTES
    timeout_s: float = wt.DEFAULT_TIMEOUT_S


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group: wt.GlooGroup | None = None
        self.bucket_bytes = wt.DEFAULT_BUCKET_BYTES
        self.error: str | None = None          # the last update's failure (the sender learns it through the group)
        self._saved: dict[str, torch.Tensor] | None = None
        self._reloading = False

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        parallel = self.parallel_config
        worker = parallel.data_parallel_index * parallel.world_size + parallel.rank
        self.bucket_bytes = init_info.bucket_bytes
        self.group = wt.GlooGroup(init_info.master_address, init_info.master_port, init_info.rank_offset + worker,
                                  init_info.world_size, init_info.timeout_s)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self.error = None
        self._saved = wt.snapshot(self.model)
        initialize_layerwise_reload(self.model)
        self._reloading = True

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """Never raises: a failure is rolled back here and kept in ``error``; the sender learns it through the
        group. In vLLM 0.32 a worker that raises in a collective RPC of a multi-worker engine leaves its peers'
        replies queued, and every later RPC of that engine then reads the reply of the one before."""
        try:
            self.receive_weights(self.parse_update_info(update_info))
        except Exception as exc:  # noqa: BLE001 -- see above
            self.error = str(exc) if isinstance(exc, wt.WeightTransferError) else f"{type(exc).__name__}: {exc}"
            self._roll_back()

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer: init_weight_transfer_engine was never called")
        plan = wt.TransferPlan(update_info.names, update_info.dtype_names, update_info.shapes)
        wt.receive(self.group, plan, lambda name, tensor: self.model.load_weights([(name, tensor)]),
                   self.bucket_bytes)

    def _finalize(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        if self._reloading:
            finalize_layerwise_reload(self.model, self.model_config)
        self._reloading = False

    def _roll_back(self) -> None:
        # finalizing puts every layer's own tensors back in place (a layer still waiting for weights would stay on
        # the meta device); the snapshot then overwrites whatever part of the update had landed
        self._finalize()
        if self._saved is not None:
            wt.restore(self.model, self._saved)
        self._saved = None

    def finish_weight_update(self) -> None:
        """Commits a successful update; after a failed one (already rolled back) it only ends the session."""
        self._finalize()
        self._saved = None

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Called on every learner rank; rank 0 sends and drives the engines through ``client``, the others only take
    part in gathering each parameter (``source`` iteration is a collective of the learner ranks)."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: VLLMWeightSyncClient, source: WeightSource | None, is_sender: bool,
                 info: GlooTrainerInitInfo) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.info = info
        self.group: wt.GlooGroup | None = None

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client: VLLMWeightSyncClient,
                     source: WeightSource | None = None) -> GlooTrainerWeightTransferEngine:
        if source is None:
            raise ValueError("gloo trainer weight transfer needs a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, info=init_info)
        if not engine.is_sender:
            return engine
        worker_info = GlooInitInfo(init_info.master_address, init_info.master_port, 1, init_info.world_size,
                                   init_info.bucket_bytes, init_info.timeout_s)
        # the workers block in their join until every member has joined: join the sender's side meanwhile
        with ThreadPoolExecutor(max_workers=1) as pool:
            joined = pool.submit(client.init_weight_transfer_engine, asdict(worker_info))
            engine.group = wt.GlooGroup(init_info.master_address, init_info.master_port, 0, init_info.world_size,
                                        init_info.timeout_s)
            joined.result()
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        tensors = iter(self.source)
        if not self.is_sender:
            for _ in tensors:
                pass
            return
        assert self.group is not None
        plan = wt.TransferPlan.of((m.name, m.dtype, m.shape) for m in self.source.metadata())
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            received = pool.submit(self.client.update_weights, plan.as_dict())
            try:
                wt.send(self.group, plan, tensors, self.info.bucket_bytes)
            except wt.WeightTransferError:
                # every engine already holds its previous weights again: end their update sessions, uncommitted
                with suppress(Exception):
                    received.result(timeout=self.info.timeout_s)
                self.client.abort_weight_update()
                raise
            finally:
                for _ in tensors:   # the other learner ranks gather every parameter: stay in step with them
                    pass
            received.result(timeout=self.info.timeout_s)
        finally:
            pool.shutdown(wait=False)
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


def register() -> None:
    """The vLLM general plugin: the gloo engines in vLLM's factories (idempotent: vLLM may call it more than once
    per process), and AMX permission for this process."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    from pr_rlhf.models.cpu_features import request_amx_permission

    request_amx_permission()
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, GlooTrainerWeightTransferEngine)
