"""The learner: policy / reference / critic training on Ray, one actor per rank (FSDP2 shards or a plain module).

``worker``: one rank (``LearnerWorker``); ``group``: the ranks as Ray actors, driven together (``LearnerGroup``);
``strategy``: FSDP2 vs a plain module; ``micro_batches``: micro-batching, gradient accumulation, steps and metrics
matched across ranks; ``checkpoint``: full state dicts, safetensors weights, RNG states, the checkpoint folder;
``ranks``: the process group. The batch format, losses and models are Ray-free, in ``pr_rlhf.rl``.
"""
from workers.learner.group import LearnerGroup
from workers.learner.worker import LearnerWorker

__all__ = ["LearnerGroup", "LearnerWorker"]
