"""The vLLM worker extension that receives weight updates (``LLM(worker_extension_cls=...)``): its methods run in
every vLLM worker process (one per tensor-parallel rank) through ``LLM.collective_rpc``, join the weight-update
group (``pr_rlhf.models.weight_sync``) as one receiver each, and load the received buckets through the worker's
in-place ``reload_weights`` (the model's ``load_weights`` slices full tensors for the worker's tensor-parallel
rank). The ``gpu`` extra pins the vLLM version whose worker has this ``reload_weights``.

Method names carry a ``pr_weights_`` prefix: vLLM refuses an extension whose names clash with the worker's.
"""
from __future__ import annotations

from typing import Any

EXTENSION = "pr_rlhf.models.vllm_weight_receiver.WeightReceiver"


class WeightReceiver:
    def pr_weights_join(self, host: str, port: int, first_rank: int, world_size: int, backend: str) -> int:
        """Join as group rank ``first_rank`` + this worker's rank inside its engine; returns that rank."""
        from pr_rlhf.models.weight_sync import WeightUpdateGroup

        rank = first_rank + int(getattr(self, "rank", 0))
        self._pr_weights_group = WeightUpdateGroup(host, port, rank, world_size, backend=backend,
                                                   device=self._pr_weights_device())
        return rank

    def _pr_weights_device(self) -> Any:
        import torch

        device = getattr(self, "device", None)
        return device if isinstance(device, torch.device) else torch.device("cpu")

    def pr_weights_receive(self, buckets: list) -> int:
        """Receive every bucket into the model through the worker's in-place ``reload_weights`` (vLLM 0.32: it
        wraps the model's ``load_weights`` in a layer-wise reload that re-applies post-load processing), fed by a
        generator that takes each bucket off the group as the loader asks for it. Returns the tensors loaded."""
        from pr_rlhf.models.weight_sync import receive_buckets

        group = getattr(self, "_pr_weights_group", None)
        if group is None:
            raise RuntimeError("weight receiver: pr_weights_join was never called")
        count = 0

        def stream():
            nonlocal count
            for tensors in receive_buckets(group, buckets, self._pr_weights_device()):
                for name, tensor in tensors:
                    count += 1
                    # a copy: the loader may hold a layer's tensors until the layer is complete, and the bucket's
                    # buffer is reused for the next bucket
                    yield name, tensor.clone()

        self.reload_weights(weights_iterator=stream(), is_checkpoint_format=True)
        return count

    def pr_weights_close(self) -> None:
        group = getattr(self, "_pr_weights_group", None)
        if group is not None:
            group.close()
            self._pr_weights_group = None
