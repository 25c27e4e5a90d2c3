"""`pr-rlhf plan`: will a recipe's Ray actors fit a GPU cluster, and what does the weight sync cost per step?

Pure Python + json (no torch, no Ray): it reads the resolved recipe and each model's ``config.json``, sizes every
actor the command would start, places the actors onto ``nodes x gpus_per_node`` GPUs and checks GPU and host
memory, all before a cluster exists.

**Models.** Parameters are counted from the config (dense decoder: embeddings, per layer q/k/v/o projections with
Qwen2's q/k/v bias and Qwen3's q/k norms, the gated MLP ``3 x hidden x intermediate``, two RMSNorms; the final
norm; an lm_head unless ``tie_word_embeddings``; a reward model or critic swaps the lm_head for a ``hidden x 1``
head). The config comes from, in order: ``--model-config SPEC=path`` (a config.json or its folder), the tiny specs
of :mod:`pr_rlhf.models.sources`, a local model folder, :data:`KNOWN_CONFIGS` (the public config.json values of
the hub ids the GPU recipes name, so that a machine without the weights still plans), or a missing path whose last
component names one of those hub ids (``/models/Qwen3-8B``: said in the output). A model none of these sizes is
refused where it would take GPU memory, and counted as process overhead only (with a warning) on a CPU worker.

**Memory per actor** (P: parameters; b: bytes of a dtype, float32 4, bfloat16 2, ``auto`` 2; W: learner ranks;
GiB = 2^30 bytes, as nvidia-smi and Kubernetes' ``Gi`` count; ``--gpu-mem-gb 80`` is an "80 GB" H100):

- learner rank (FSDP2), GPU = ``16 P / W`` (fp32 master 4 + fp32 gradient 4 + AdamW's two moments 8 per
  parameter, sharded) + reference ``b P / W`` when it is built (KL coefficient > 0) + critic ``16 P_critic / W``
  when enabled + what FSDP2 holds unsharded: the root group (embeddings, an untied lm_head, the final norm: FSDP2
  keeps the root unsharded from forward to backward) and two layers (the one computing, the next prefetched),
  ``(root + 2 layer) x b`` (strategy ``none``: autocast's cached ``b P`` copy instead) + the gradient reduce of the
  largest unit, its unsharded gradient in the compute dtype plus, in 16-bit, the fp32 copy the reduce-scatter takes
  (``reduce_dtype`` float32): ``max(root, layer) x (b + 4)`` + activations +
  :data:`CUDA_RESERVE_GIB`. Activations for ``t = micro_batch x sequence length`` tokens: with gradient
  checkpointing each layer keeps its input, ``t x hidden x b x layers``, plus one layer recomputed in full,
  ``t x (10 hidden + 4 intermediate) x b`` (norm/attention inputs and outputs, q/k/v, and the gated MLP's gate, up,
  product and down input; flash/sdpa attention keeps no ``t^2`` scores); without it that full layer times the
  layers. Logits: the response tokens' in fp32 and their gradient, ``micro_batch x (response + 1) x vocab x 8``,
  plus what the model returns in the compute dtype: the response's only (``logits_to_keep``), ``micro_batch x
  (response + 1) x vocab x b``, or, with ``shared_prefix`` packing a group's prompt once, every packed position's,
  at most ``t x vocab x b``. A reward model has no logits.
- learner host = :data:`PROCESS_HOST_GIB` + one weight-sync bucket (``weight_sync_bucket_mb``): only rank 0 loads
  the weights and FSDP2 broadcasts the shards (meta device elsewhere; ``load_weights_on: rank0``), so rank 0 alone
  briefly holds a full fp32 copy (its load dtype: the master weights), ``4 P``, one model after the other
  (``every_rank``: every rank does).
- vLLM engine, GPU = ``gpu_memory_utilization x GPU memory`` on each of its ``tensor_parallel_size`` GPUs (vLLM
  pre-allocates it); its weights ``b P / TP`` must fit inside, the rest is KV cache. Host = the engine process +
  one worker process per TP rank (:data:`VLLM_HOST_GIB`, :data:`PROCESS_HOST_GIB`): weights stream from disk by
  mmap and updates arrive on the GPU over the weight-update group, no host copy.
- transformers engine on a GPU: ``b P x 1.2`` (KV cache, activations) + the reserve; host: the process + ``b P``
  (loaded on the host, then moved). On the CPU: host = the process + ``b P x 1.2``. A scalar RM on a GPU: ``b P`` +
  one layer's forward of ``batch_size x max_length`` tokens (as above, no gradient) + the reserve.
- the driver: :data:`DRIVER_HOST_GIB` on the head (model weights never pass through it), except where the code
  runs an engine in the driver itself (`pr-rlhf train-rm`'s planner): then the driver needs that engine's GPUs.

**Phases** are the actors alive together, as each command declares them (:mod:`pr_rlhf.actors`, which the
pre-flight check and the drivers read too): ``train`` (and each ``rl_sweep`` arm) is one (rollout workers, learner
ranks, reward and downstream pools); ``pgenrm`` has its SFT stages, its GRPO stages (learners + rollout workers)
and its evaluation tasks, never overlapping; ``bon`` generates, then runs one scorer's pool after the other;
``train-rm`` plans rubrics (in the driver), trains, evaluates; ``leaderboard``, ``scaling`` and ``serve-reward``
their tasks, pools and replicas. A learner with ``device: auto`` is planned on GPUs (the plan's cluster has them:
:func:`pr_rlhf.actors.uses_gpu`).

**Placement** is an idealised Ray, per phase: bundles largest first, each actor's GPUs on one node (a
tensor-parallel group never spans nodes), the actors of one group (the learner ranks, the rollout workers) packed on
one node where they fit (Ray's PACK), else first fit over the nodes in order; fractional GPUs share a GPU whose
shares still add up to at most 1; CPU-only actors go to the node with the most host memory left. The driver runs
on a separate head (as in ``cluster/kuberay_rayjob.yaml`` and ``cluster/ray_cluster_gpu.yaml``) and is not counted
against the GPU nodes.

**Weight sync per step** = policy parameters x the rollout dtype's bytes, once per rollout engine; seconds =
those bytes / the link's bandwidth, the engines served one after the other (an upper bound; one broadcast to all
engines pipelines towards the per-engine figure). The link is NVLink (``nvlink_gb_s``, default
:data:`NVLINK_GB_S`) when every learner rank and every engine sits on one node, else the network
(``network_gb_s``, default :data:`NETWORK_GB_S`). Both are assumptions, printed with the figure.

Problems that refuse a recipe name the resource, the node and the actor (``node 1: GPU memory: learner rank 3 needs
97.3 GiB > 80 GiB``): too few GPUs, a tensor-parallel group larger than a node, GPU memory per GPU, host memory per
node, vLLM weights larger than the engine's budget, an engine on cuda in an actor that asks Ray for no GPU.

The package: :mod:`~pr_rlhf.planning.models` (model sizes), :mod:`~pr_rlhf.planning.sizing` (each declared group's
memory, the phases), :mod:`~pr_rlhf.planning.placement` (the placement, the tables, :func:`make_plan`).
"""
from __future__ import annotations

from pr_rlhf.planning.models import (
    ALIASES,
    DTYPE_BYTES,
    GIB,
    KNOWN_CONFIGS,
    Arch,
    Models,
    PlanError,
    arch_from_config,
    read_config_file,
)
from pr_rlhf.planning.placement import (
    NETWORK_GB_S,
    NVLINK_GB_S,
    PhasePlan,
    Placed,
    Plan,
    Row,
    compact_names,
    id_ranges,
    make_plan,
    node_rows,
    parse_model_configs,
    place,
)
from pr_rlhf.planning.sizing import (
    CPU_PROCESS_HOST_GIB,
    CUDA_RESERVE_GIB,
    DRIVER_HOST_GIB,
    ENGINE_SLACK,
    PROCESS_HOST_GIB,
    VLLM_HOST_GIB,
    Actor,
    Group,
    Phase,
    recipe_phases,
)

__all__ = ["ALIASES", "CPU_PROCESS_HOST_GIB", "CUDA_RESERVE_GIB", "DRIVER_HOST_GIB", "DTYPE_BYTES", "ENGINE_SLACK",
           "GIB", "KNOWN_CONFIGS", "NETWORK_GB_S", "NVLINK_GB_S", "PROCESS_HOST_GIB", "VLLM_HOST_GIB", "Actor", "Arch",
           "Group", "Models", "Phase", "PhasePlan", "Placed", "Plan", "PlanError", "Row", "arch_from_config",
           "compact_names", "id_ranges", "make_plan", "node_rows", "parse_model_configs", "place",
           "read_config_file", "recipe_phases"]
