"""The learner: policy / reference / critic training on Ray, one actor per rank (FSDP2 shards or a plain module).

``worker``: one rank (``LearnerWorker``); ``group``: the ranks as Ray actors, driven together (``LearnerGroup``);
``strategy``: FSDP2 vs a plain module; ``micro_batches``: micro-batching, gradient accumulation, steps and metrics
matched across ranks; ``checkpoint``: sharded checkpoints (every rank its shard), the streamed HF export, RNG states;
``ranks``: the process group. The batch format, losses and models are Ray-free, in ``pr_rlhf.rl``.
"""
from workers.learner.group import LearnerGroup
from workers.learner.worker import LearnerWorker

__all__ = ["LearnerGroup", "LearnerWorker"]
