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

**Phases** are the actors alive together: ``train`` (and each ``rl_sweep`` arm) is one (rollout workers, learner
ranks, reward and downstream pools); ``pgenrm`` has its SFT stages, its GRPO stages (learners + rollout workers)
and its evaluation task, never overlapping; ``bon`` generates, then runs one scorer's pool after the other;
``train-rm`` plans rubrics (in the driver), trains, evaluates.

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
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pr_rlhf.configs.base import EngineBase, ScalarRMConfig
from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.configs.recipe import Recipe
from pr_rlhf.configs.reward import RewardBase
from pr_rlhf.models.sources import TINY_COMMON, TINY_SIZES, TINY_VOCAB_SIZE

GIB = float(2 ** 30)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "auto": 2}   # auto: the configs below ship bfloat16

# Assumptions (rough, stated in the output where they decide a figure).
CUDA_RESERVE_GIB = 2.0     # CUDA context, NCCL buffers and allocator fragmentation of one GPU process
PROCESS_HOST_GIB = 4.0     # host RSS of a Python process with torch + CUDA (+ NCCL) loaded
CPU_PROCESS_HOST_GIB = 2.0  # the same without CUDA
VLLM_HOST_GIB = 4.0        # vLLM's engine-core process, besides one PROCESS_HOST_GIB per tensor-parallel worker
DRIVER_HOST_GIB = 4.0      # the job's driver: controller state, batches of token ids, metrics
ENGINE_SLACK = 1.2         # a transformers engine's KV cache and activations over its weights
NVLINK_GB_S = 100.0        # NCCL broadcast inside a node (H100 NVLink: ~450 GB/s per direction; conservative)
NETWORK_GB_S = 25.0        # between nodes: one 200 Gb/s InfiniBand / RoCE link per GPU

# Public config.json values (the fields the count reads) of the hub models recipes/gpu/*.yaml name, so that a
# machine without the weights plans them; SmolLM2 is the shipped 'smollm2'.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16"},
    "Qwen/Qwen3-8B": {
        "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
        "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16"},
    "meta-llama/Llama-3.1-8B-Instruct": {
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False,
        "attention_bias": False, "torch_dtype": "bfloat16"},
    "HuggingFaceTB/SmolLM2-135M-Instruct": {
        "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
        "attention_bias": False, "torch_dtype": "bfloat16"},
}
ALIASES = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
           "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}


class PlanError(ValueError):
    """Input the plan cannot use (a model config, a recipe with nothing to plan); the message names the file or
    field."""


# ---------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Arch:
    """The sizes of a dense decoder, as its config.json gives them."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    source: str

    @property
    def layer_params(self) -> int:
        attn = (self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
                + self.heads * self.head_dim * self.hidden)
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return attn + bias + 3 * self.hidden * self.intermediate + norms

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    def params(self, head: str = "lm") -> int:
        """All parameters with an lm head (``"lm"``) or a scalar head (``"score"``: a reward model, a critic)."""
        body = self.embed_params + self.layers * self.layer_params + self.hidden
        if head == "score":
            return body + self.hidden
        return body + (0 if self.tied else self.embed_params)


def _int_field(cfg: dict, name: str, source: str, default: int | None = None) -> int:
    value = cfg.get(name, default)
    if value is None:
        raise PlanError(f"{source}: field {name!r} missing")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlanError(f"{source}: field {name!r} must be a positive integer, got {value!r}")
    return value


def arch_from_config(cfg: Any, source: str) -> Arch:
    """The :class:`Arch` of a config.json mapping (a multimodal config's ``text_config`` when the top has no
    ``hidden_size``). ``source`` names the file in errors."""
    if not isinstance(cfg, dict):
        raise PlanError(f"{source}: a config.json must be a JSON object, got {type(cfg).__name__}")
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    for moe in ("num_experts", "num_local_experts", "n_routed_experts"):
        if cfg.get(moe):
            raise PlanError(f"{source}: field {moe!r}: mixture-of-experts models are not sized by the plan (it counts "
                            "dense decoders)")
    hidden = _int_field(cfg, "hidden_size", source)
    heads = _int_field(cfg, "num_attention_heads", source)
    model_type = str(cfg.get("model_type", ""))
    return Arch(hidden=hidden, layers=_int_field(cfg, "num_hidden_layers", source), heads=heads,
                kv_heads=_int_field(cfg, "num_key_value_heads", source, heads),
                head_dim=_int_field(cfg, "head_dim", source, hidden // heads),
                intermediate=_int_field(cfg, "intermediate_size", source), vocab=_int_field(cfg, "vocab_size", source),
                tied=bool(cfg.get("tie_word_embeddings", False)),
                qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")), qk_norm=model_type == "qwen3",
                source=source)


def read_config_file(path: str | Path, what: str) -> Arch:
    """The :class:`Arch` of a config.json file (or a folder holding one); ``what`` names where it was given."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise PlanError(f"{what}: {p} not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{what}: {p} is not a readable JSON file: {exc}") from None
    return arch_from_config(cfg, str(p))


class Models:
    """Model spec -> :class:`Arch` (None: unknown), resolved once each; ``overrides``: spec -> config.json path."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self.overrides = dict(overrides or {})
        self.found: dict[str, Arch | None] = {}

    def get(self, spec: str) -> Arch | None:
        if spec not in self.found:
            self.found[spec] = self._resolve(spec)
        return self.found[spec]

    def _resolve(self, spec: str) -> Arch | None:
        if spec in self.overrides:
            return read_config_file(self.overrides[spec], f"--model-config {spec}")
        base, _, extra = spec.partition(":")
        if base in TINY_SIZES:
            try:
                overrides = json.loads(extra) if extra else {}
            except json.JSONDecodeError as exc:
                raise PlanError(f"model {spec!r}: the overrides after ':' are not JSON: {exc}") from None
            cfg = {"model_type": "qwen2", "vocab_size": TINY_VOCAB_SIZE, **TINY_COMMON, **TINY_SIZES[base],
                   **overrides}
            return arch_from_config(cfg, f"tiny spec {spec!r} (pr_rlhf.models.sources)")
        if spec.lower() in ALIASES:
            hub = ALIASES[spec.lower()]
            return arch_from_config(KNOWN_CONFIGS[hub], f"built-in table of {hub}'s config.json")
        path = Path(spec).expanduser()
        if (path / "config.json").is_file():
            return read_config_file(path, f"model {spec}")
        if spec in KNOWN_CONFIGS:
            return arch_from_config(KNOWN_CONFIGS[spec], "built-in table of the hub's config.json")
        by_name = [hub for hub in KNOWN_CONFIGS if hub.rsplit("/", 1)[-1].lower() == path.name.lower()]
        if by_name:
            return arch_from_config(KNOWN_CONFIGS[by_name[0]], f"built-in table, by the folder's name ({by_name[0]})")
        return None


# ---------------------------------------------------------------------------------------------------------------
# Actors and phases
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Actor:
    name: str                 # "learner rank 3"
    gpus: float               # Ray GPUs: whole GPUs on one node (>= 1), a share of one GPU (< 1), or 0
    gpu_bytes: float          # on each GPU it uses
    host_bytes: float
    driver: bool = False      # runs in the job's driver process


@dataclass
class Group:
    """Actors built alike, with the arithmetic behind their figures (one line of the output)."""

    label: str
    detail: str


@dataclass
class Phase:
    name: str
    actors: list[Actor] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    sync: dict[str, Any] | None = None   # {model, params, dtype, engines, rollout / learner: their actors' group}


@dataclass
class Placed:
    actor: Actor
    node: int | None          # None: the head (a driver without GPUs) or not placed
    gpu_ids: list[int]


@dataclass
class PhasePlan:
    phase: Phase
    placed: list[Placed]
    gpu_used: list[list[float]]     # node -> GPU -> bytes
    host_used: list[float]          # node -> bytes
    sync_line: str | None = None


@dataclass
class Plan:
    recipe: str
    nodes: int
    gpus_per_node: int
    gpu_gib: float
    host_gib: float
    models: dict[str, Arch | None]
    phases: list[PhasePlan]
    problems: list[str]
    warnings: list[str]
    assumptions: list[str]

    @property
    def fits(self) -> bool:
        return not self.problems


def _gib(x: float) -> str:
    return f"{x / GIB:.1f}"


class _Builder:
    """Sizes the actors of one recipe's commands."""

    def __init__(self, models: Models, gpu_gib: float, gpus_per_node: int) -> None:
        self.models = models
        self.gpu_bytes = gpu_gib * GIB
        self.gpus_per_node = gpus_per_node
        self.warnings: list[str] = []
        self.problems: list[str] = []

    # models ------------------------------------------------------------------------------------------------
    def arch(self, spec: str, where: str, needed: bool) -> Arch | None:
        arch = self.models.get(spec)
        if arch is None:
            hint = (f"model {spec!r} ({where}): no config.json there and not a known hub id; pass --model-config "
                    f"{spec}=path/to/config.json")
            if needed:
                raise PlanError(hint)
            self.warn(f"{hint} (its CPU workers are counted as process overhead only)")
        return arch

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    # engines -----------------------------------------------------------------------------------------------
    def engine(self, cfg: EngineBase, where: str) -> dict[str, Any]:
        """What an engine takes inside the actor that hosts it: {gpus (needed on one node), gpu (bytes per GPU),
        host (bytes), detail}."""
        backend = cfg.backend
        if backend == "openai":
            return {"gpus": 0, "gpu": 0.0, "host": 0.0, "detail": f"{where}: OpenAI-compatible server (not placed)"}
        on_gpu = getattr(cfg, "device", "cpu").startswith("cuda")
        arch = self.arch(cfg.model, f"{where}.model", needed=on_gpu)
        b = DTYPE_BYTES[cfg.dtype]
        weights = arch.params() * b if arch else 0.0
        name = cfg.model.rsplit("/", 1)[-1]
        if backend == "vllm" and on_gpu:
            tp = cfg.tensor_parallel_size
            budget = cfg.gpu_memory_utilization * self.gpu_bytes
            if weights / tp > budget:
                self.problems.append(f"{where}: vLLM weights {_gib(weights / tp)} GiB per GPU ({name} {cfg.dtype} / "
                                     f"TP {tp}) exceed its budget {cfg.gpu_memory_utilization} x "
                                     f"{_gib(self.gpu_bytes)} GiB = {_gib(budget)} GiB (field "
                                     f"{where}.gpu_memory_utilization)")
            return {"gpus": tp, "gpu": budget, "host": (VLLM_HOST_GIB + tp * PROCESS_HOST_GIB) * GIB,
                    "detail": f"vLLM {name} {cfg.dtype} TP{tp}: {cfg.gpu_memory_utilization} x {_gib(self.gpu_bytes)} "
                              f"= {_gib(budget)} GiB per GPU (weights {_gib(weights / tp)}, KV cache "
                              f"{_gib(max(budget - weights / tp, 0))})"}
        if on_gpu:
            need = weights * ENGINE_SLACK + CUDA_RESERVE_GIB * GIB
            return {"gpus": 1, "gpu": need, "host": PROCESS_HOST_GIB * GIB + weights,
                    "detail": f"{backend} {name} {cfg.dtype} on one GPU: weights {_gib(weights)} x {ENGINE_SLACK} + "
                              f"reserve = {_gib(need)} GiB"}
        host = weights * ENGINE_SLACK
        return {"gpus": 0, "gpu": 0.0, "host": host,
                "detail": f"{backend} {name} {cfg.dtype} on CPU: {_gib(host)} GiB host" if arch else
                          f"{backend} {name} on CPU: size unknown"}

    def engine_actors(self, label: str, count: int, engines: list[tuple[EngineBase, str]], num_gpus: float,
                      gpus_field: str, extra_gpu: float = 0.0, extra_host: float = 0.0, extra_detail: str = "",
                      driver: bool = False, numbered: bool = True) -> tuple[list[Actor], Group]:
        """``count`` actors, each hosting ``engines`` (on the actor's GPUs, side by side) and ``extra_gpu`` /
        ``extra_host`` bytes of something else (a scalar RM), asking Ray for ``num_gpus`` GPUs each."""
        needs = [self.engine(cfg, where) for cfg, where in engines]
        widest = max(needs, key=lambda n: n["gpus"], default={"gpus": 0})
        need_gpus = max(widest["gpus"], 1 if extra_gpu else 0)
        gpus = 0.0
        if need_gpus:
            tp_field = engines[needs.index(widest)][1] + ".tensor_parallel_size" if widest["gpus"] else gpus_field
            if need_gpus > self.gpus_per_node:
                self.problems.append(f"{label}: a tensor-parallel group of {need_gpus} GPUs must sit on one node; "
                                     f"nodes have {self.gpus_per_node} GPUs (field {tp_field})")
            if driver:   # the driver asks for its GPUs at submission (--entrypoint-num-gpus)
                gpus = float(need_gpus)
            elif not num_gpus:
                self.problems.append(f"{label}: runs on cuda but asks Ray for no GPU, so Ray hides the GPUs from it "
                                     f"(field {gpus_field})")
                gpus = float(need_gpus)
            elif num_gpus < need_gpus and not (num_gpus < 1 and need_gpus == 1):
                self.warn(f"{label}: its engine uses {need_gpus} GPUs but the actor asks Ray for {num_gpus:g} "
                          f"(field {gpus_field}); planned with {need_gpus}")
                gpus = float(need_gpus)
            else:
                gpus = float(num_gpus)
        per_gpu = sum(n["gpu"] for n in needs) + extra_gpu
        host = ((PROCESS_HOST_GIB if need_gpus else CPU_PROCESS_HOST_GIB) * GIB + sum(n["host"] for n in needs)
                + extra_host)
        actors = [Actor(f"{label} {i}" if numbered else label, gpus, per_gpu, host, driver)
                  for i in range(count)]
        detail = "; ".join([n["detail"] for n in needs] + ([extra_detail] if extra_detail else []))
        return actors, Group(f"{label} x{count}" if count > 1 else label, detail)

    def reward_pool(self, cfg: RewardBase, where: str, label: str) -> tuple[list[Actor], Group]:
        engines: list[tuple[EngineBase, str]] = []
        judge = getattr(cfg, "judge", None)
        if judge is not None:
            engines.append((judge, f"{where}.judge"))
        planner = getattr(cfg, "planner", None)
        if planner is not None and planner != judge:   # an equal engine is shared (pr_rlhf.scorers)
            engines.append((planner, f"{where}.planner"))
        extra_gpu = extra_host = 0.0
        detail = ""
        if cfg.kind == "scalar":
            extra_gpu, extra_host, detail = self.scalar_rm(cfg.scalar_rm, f"{where}.scalar_rm")
        if not engines and not detail:
            detail = f"{cfg.kind} scorer on CPU"
        return self.engine_actors(label, cfg.pool.workers, engines, cfg.pool.num_gpus, f"{where}.pool.num_gpus",
                                  extra_gpu, extra_host, detail)

    def scalar_rm(self, cfg: ScalarRMConfig, where: str) -> tuple[float, float, str]:
        """(GPU bytes, host bytes, detail) of a sequence-classification RM (pr_rlhf.reward.scalar)."""
        on_gpu = cfg.device.startswith("cuda")
        arch = self.arch(cfg.model, f"{where}.model", needed=on_gpu)
        if arch is None:
            return 0.0, 0.0, f"scalar RM {cfg.model}: size unknown"
        b = DTYPE_BYTES[cfg.dtype]
        weights = arch.params("score") * b
        t = cfg.batch_size * cfg.max_length
        act = t * (10 * arch.hidden + 4 * arch.intermediate) * b      # one layer's forward, no gradient
        name = cfg.model.rsplit("/", 1)[-1]
        if on_gpu:
            need = weights + act + CUDA_RESERVE_GIB * GIB
            return need, weights, (f"scalar RM {name} {cfg.dtype}: weights {_gib(weights)} + forward of {t} tokens "
                                   f"{_gib(act)} + reserve = {_gib(need)} GiB")
        return 0.0, weights + act, f"scalar RM {name} {cfg.dtype} on CPU: {_gib(weights + act)} GiB host"

    # learners ----------------------------------------------------------------------------------------------
    def learner(self, cfg: LearnerConfig, model: str, where: str, seq_len: int, response_len: int,
                reference: bool, label: str = "learner rank") -> tuple[list[Actor], Group]:
        on_gpu = cfg.device != "cpu"
        arch = self.arch(model, where, needed=True)
        assert arch is not None
        w = cfg.world_size if cfg.strategy == "fsdp2" else 1
        b = DTYPE_BYTES[cfg.dtype]
        rm = cfg.trains == "reward_model"
        p = arch.params("score" if rm else "lm")
        policy = 16 * p / w
        ref = b * arch.params() / w if reference else 0.0
        critic = 16 * arch.params("score") / w if cfg.critic.enabled else 0.0
        root = p - arch.layers * arch.layer_params   # embeddings, lm_head (untied) or score head, final norm
        if cfg.strategy == "fsdp2":
            # the root group stays unsharded from forward to backward (FSDP2 does not reshard the root after its
            # forward); one layer computing and the next prefetched
            unshard = (root + 2 * arch.layer_params) * b
            # a unit's unsharded gradient in the compute dtype and, in 16-bit, its fp32 copy for the reduce-scatter
            # (reduce_dtype float32); the root's is the largest
            reduce = max(root, arch.layer_params) * (b + (4 if b < 4 else 0))
        else:
            unshard = p * b if b < 4 else 0.0
            reduce = 0.0
        seqs = cfg.micro_batch_size * (2 if rm else 1)        # a reward model's micro-batch counts pairs
        t = seqs * seq_len
        layer_act = t * (10 * arch.hidden + 4 * arch.intermediate) * b
        act = (t * arch.hidden * b * arch.layers + layer_act) if cfg.gradient_checkpointing else layer_act * arch.layers
        # the response tokens' logits in fp32 and their gradient; packed (shared_prefix) the model returns every
        # position's logits in the compute dtype (at most t), else only the response's (logits_to_keep)
        response_logits = seqs * (response_len + 1) * arch.vocab
        packed = cfg.shared_prefix and not rm
        returned = t * arch.vocab if packed else response_logits
        logits = 0.0 if rm else response_logits * 8 + returned * b
        reserve = CUDA_RESERVE_GIB * GIB if on_gpu else 0.0
        gpu = policy + ref + critic + unshard + reduce + act + logits + reserve
        # rank 0's full copy at load, one model after the other: the policy (or RM) and the critic in fp32 (their
        # master weights), the reference in the compute dtype
        load = max(4 * p, 4 * arch.params("score") if cfg.critic.enabled else 0, b * arch.params() if reference else 0)
        every_rank = cfg.load_weights_on == "every_rank"
        host = PROCESS_HOST_GIB * GIB + cfg.weight_sync_bucket_mb * 2 ** 20
        actors = []
        for r in range(cfg.world_size):
            extra = load if r == 0 or every_rank else 0.0
            if on_gpu:
                actors.append(Actor(f"{label} {r}", cfg.num_gpus_per_worker, gpu, host + extra))
            else:   # on CPU the whole GPU figure lives on the host
                actors.append(Actor(f"{label} {r}", 0.0, 0.0, host + extra + gpu))
        name = model.rsplit("/", 1)[-1]
        parts = [f"{'RM' if rm else 'policy'} {name} {p / 1e9:.2f}B x 16 B / {w} = {_gib(policy)}"]
        if ref:
            parts.append(f"reference {_gib(ref)}")
        if critic:
            parts.append(f"critic {_gib(critic)}")
        parts += [f"unshard {_gib(unshard)}", f"gradient reduce {_gib(reduce)}",
                  f"activations {_gib(act)} ({seqs} x {seq_len} tokens"
                  f"{', checkpointed' if cfg.gradient_checkpointing else ''})"]
        if logits:
            parts.append(f"logits {_gib(logits)} ({seqs} x {response_len + 1} x {arch.vocab}"
                         f"{f', packed: {t} positions' if packed else ''})")
        parts.append(f"reserve {_gib(reserve)} = {_gib(gpu)} GiB per GPU; {'every rank' if every_rank else 'rank 0'}"
                     f" host +{_gib(load)} GiB (full fp32 copy at load)")
        return actors, Group(f"{label} x{cfg.world_size}", ", ".join(parts))

    def driver(self) -> tuple[list[Actor], Group]:
        return ([Actor("driver", 0.0, 0.0, DRIVER_HOST_GIB * GIB, driver=True)],
                Group("driver", f"on the head: {DRIVER_HOST_GIB:.1f} GiB host (weights never pass through it)"))


def _add(phase: Phase, built: tuple[list[Actor], Group]) -> None:
    phase.actors += built[0]
    phase.groups.append(built[1])


# ---------------------------------------------------------------------------------------------------------------
# The commands' phases
# ---------------------------------------------------------------------------------------------------------------

def _train_phase(b: _Builder, recipe: Recipe, name: str, reward: RewardBase, reward_field: str) -> Phase:
    cfg = recipe.train
    assert cfg is not None
    phase = Phase(name)
    _add(phase, b.driver())
    rollouts = b.engine_actors("rollout", cfg.rollout_workers, [(cfg.rollout, "train.rollout")],
                               cfg.rollout_num_gpus, "train.rollout_num_gpus")
    _add(phase, rollouts)
    lcfg = cfg.learner
    seq = cfg.rollout.max_model_len
    _add(phase, b.learner(lcfg, lcfg.model, "train.learner.model", seq, cfg.max_tokens,
                          reference=lcfg.kl.coef > 0))
    _add(phase, b.reward_pool(reward, reward_field, "reward worker"))
    if cfg.downstream is not None:
        _add(phase, b.reward_pool(cfg.downstream, "train.downstream", "downstream worker"))
    arch = b.models.get(lcfg.model)
    if cfg.rollout.backend != "openai" and arch is not None:
        phase.sync = {"model": lcfg.model, "params": arch.params(), "dtype": cfg.rollout.dtype,
                      "engines": cfg.rollout_workers, "rollout": "rollout", "learner": "learner rank"}
    return phase


def _pgenrm_phases(b: _Builder, recipe: Recipe) -> list[Phase]:
    from pr_rlhf.configs.pgenrm import GRPO_STAGES

    cfg = recipe.pgenrm
    assert cfg is not None
    phases = []
    grpo = [s for s in cfg.stages if s in GRPO_STAGES]
    response = max([cfg.stage_config(s).max_tokens for s in grpo] + [cfg.eval.max_tokens])
    seq = cfg.rollout.max_model_len
    driver_engines = [(e, f) for e, f in ((cfg.psi.teacher, "pgenrm.psi.teacher"), (cfg.pr_judge, "pgenrm.pr_judge"))
                      if isinstance(e, EngineBase) and e.backend != "openai"]
    sft = [s for s in cfg.stages if s == "planner" or (s == "psi" and cfg.psi.steps > 0)]
    for stage in sft:
        phase = Phase(f"pgenrm {stage} (SFT)")
        _add(phase, b.driver())
        model = cfg.planner.model if stage == "planner" else cfg.model
        _add(phase, b.learner(cfg.learner, model, "pgenrm.model" if stage == "psi" else "pgenrm.planner.model",
                              seq, response, reference=False))
        phases.append(phase)
    if grpo:
        phase = Phase(f"pgenrm GRPO ({', '.join(grpo)})")
        _add(phase, b.driver())
        kl = max(cfg.stage_config(s).kl.coef for s in grpo)
        _add(phase, b.learner(cfg.learner, cfg.model, "pgenrm.model", seq, response, reference=kl > 0))
        rollout = cfg.rollout.model_copy(update={"model": cfg.model})
        _add(phase, b.engine_actors("rollout", cfg.rollout_workers, [(rollout, "pgenrm.rollout")],
                                    cfg.rollout_num_gpus, "pgenrm.rollout_num_gpus"))
        if driver_engines:
            _add(phase, b.engine_actors("driver engines", 1, driver_engines, 0, "<job entrypoint>", driver=True,
                                        numbered=False))
        arch = b.models.get(cfg.model)
        if cfg.rollout.backend != "openai" and arch is not None:
            phase.sync = {"model": cfg.model, "params": arch.params(), "dtype": cfg.rollout.dtype,
                          "engines": cfg.rollout_workers, "rollout": "rollout", "learner": "learner rank"}
        phases.append(phase)
    if any(s != "planner" for s in cfg.stages):
        phase = Phase("pgenrm evaluation")
        _add(phase, b.driver())
        engine = cfg.eval_engine(cfg.model)
        res = cfg.eval_resources()
        _add(phase, b.engine_actors("evaluation task", 1, [(engine, "pgenrm.rollout" if cfg.eval.engine == "rollout"
                                                             else "pgenrm.eval")],
                                    res.get("num_gpus", 0), "pgenrm.rollout_num_gpus", numbered=False))
        phases.append(phase)
    return phases


def _bon_phases(b: _Builder, recipe: Recipe) -> list[Phase]:
    cfg = recipe.bon
    assert cfg is not None
    gen = Phase("bon generate")
    _add(gen, b.driver())
    _add(gen, b.engine_actors("rollout", cfg.rollout_workers, [(cfg.policy, "bon.policy")], cfg.rollout_num_gpus,
                              "bon.rollout_num_gpus"))
    phases = [gen]
    for name, rcfg in [("downstream", cfg.downstream), *cfg.reward_models.items()]:   # one pool after the other
        where = "bon.downstream" if name == "downstream" else f"bon.reward_models.{name}"
        phase = Phase(f"bon score {name}")
        _add(phase, b.driver())
        _add(phase, b.reward_pool(rcfg, where, f"{name} worker"))
        phases.append(phase)
    return phases


def _rm_phases(b: _Builder, recipe: Recipe) -> list[Phase]:
    cfg = recipe.rm
    assert cfg is not None
    phases = []
    plans = "plan" in cfg.input_modes and cfg.planner is not None
    if plans and cfg.planner.backend != "openai":
        phase = Phase("rm planner (training rubrics)")
        built = b.engine_actors("driver (rm.planner)", 1, [(cfg.planner, "rm.planner")], 0, "<job entrypoint>",
                                driver=True, numbered=False)
        _add(phase, built)
        if built[0][0].gpus:
            b.warn(f"pr-rlhf train-rm runs rm.planner in the job's driver: submit it with --entrypoint-num-gpus "
                   f"{built[0][0].gpus:g} (KubeRay: entrypointNumGpus) so that the driver lands on a GPU node; the "
                   "plan places it there")
        phases.append(phase)
    train = Phase("rm training")
    _add(train, b.driver())
    learner = cfg.learner.model_copy(update={"model": cfg.model})
    _add(train, b.learner(learner, cfg.model, "rm.model", cfg.max_length, 0, reference=False))
    phases.append(train)
    ecfg = cfg.eval
    scalar = ScalarRMConfig(model=cfg.model, max_length=cfg.max_length, batch_size=ecfg.batch_size,
                            device=ecfg.device, dtype=ecfg.dtype)    # as workers.rm_training.eval_recipe builds it
    gpu, host, detail = b.scalar_rm(scalar, "rm")
    num_gpus = 1 if ecfg.device == "cuda" else 0
    for modes in (["none", "profile"], ["plan"]):
        if not set(modes) & set(cfg.input_modes):
            continue
        phase = Phase(f"rm evaluation ({'plan' if modes == ['plan'] else 'other modes'})")
        _add(phase, b.driver())
        engines = [(cfg.planner, "rm.planner")] if modes == ["plan"] and plans else []
        _add(phase, b.engine_actors("rm eval task", 1, engines, num_gpus, "rm.eval.device", extra_gpu=gpu,
                                    extra_host=host, extra_detail=detail, numbered=False))
        phases.append(phase)
    return phases


def recipe_phases(recipe: Recipe, models: Models, gpu_gib: float, gpus_per_node: int
                  ) -> tuple[list[Phase], list[str], list[str]]:
    """The phases of every Ray command the recipe has a section for, the problems found while sizing, warnings."""
    b = _Builder(models, gpu_gib, gpus_per_node)
    phases: list[Phase] = []
    if recipe.train is not None:
        if recipe.rl_sweep is not None:
            for arm, reward in recipe.rl_sweep.arms.items():
                phases.append(_train_phase(b, recipe, f"rl-sweep arm {arm}", reward, f"rl_sweep.arms.{arm}"))
        else:
            phases.append(_train_phase(b, recipe, "train", recipe.reward, "reward"))
    if recipe.pgenrm is not None:
        phases += _pgenrm_phases(b, recipe)
    if recipe.bon is not None:
        phases += _bon_phases(b, recipe)
    if recipe.rm is not None:
        phases += _rm_phases(b, recipe)
    if not phases:
        raise PlanError("nothing to plan: the recipe has none of train:, rl_sweep:, pgenrm:, bon:, rm: (the Ray jobs "
                        "that place GPU actors)")
    return phases, b.problems, b.warnings


# ---------------------------------------------------------------------------------------------------------------
# Placement
# ---------------------------------------------------------------------------------------------------------------

def place(phase: Phase, nodes: int, gpus_per_node: int, gpu_gib: float, host_gib: float) -> tuple[PhasePlan,
                                                                                               list[str]]:
    """The phase's actors on the nodes (see the module docstring), and the problems: unplaced actors, GPU memory
    per GPU, host memory per node."""
    share = [[0.0] * gpus_per_node for _ in range(nodes)]
    gpu_used = [[0.0] * gpus_per_node for _ in range(nodes)]
    host_used = [0.0] * nodes
    owners: list[list[list[str]]] = [[[] for _ in range(gpus_per_node)] for _ in range(nodes)]
    placed: list[Placed] = []
    unplaced: list[Actor] = []
    problems: list[str] = []

    def whole(n: int) -> list[int]:
        return [g for g in range(gpus_per_node) if share[n][g] == 0.0]

    order = sorted(phase.actors, key=lambda a: (-(a.gpus >= 1), -a.gpus))   # stable: the phase's own order within
    homes: dict[str, int] = {}
    pending = {}   # whole GPUs the unplaced actors of each group still need: a group is packed on one node if it can
    for a in order:
        if a.gpus >= 1:
            pending[_base(a.name)] = pending.get(_base(a.name), 0) + math.ceil(a.gpus)
    for actor in order:
        if actor.gpus == 0:
            if actor.driver:
                placed.append(Placed(actor, None, []))
                continue
            n = max(range(nodes), key=lambda i: host_gib * GIB - host_used[i])
            placed.append(Placed(actor, n, []))
            host_used[n] += actor.host_bytes
            continue
        spot = None
        if actor.gpus >= 1:
            k = math.ceil(actor.gpus)
            rest = pending[_base(actor.name)]
            pending[_base(actor.name)] -= k
            home = homes.get(_base(actor.name))     # PACK: the group's node, else one that holds the whole rest
            for n in sorted(range(nodes), key=lambda n: (n != home, len(whole(n)) < rest)):
                free = whole(n)
                if len(free) >= k:
                    spot = (n, free[:k])
                    break
        else:   # a share: the fullest GPU it still fits, so that shares pair up
            fits = [(share[n][g], n, g) for n in range(nodes) for g in range(gpus_per_node)
                    if share[n][g] + actor.gpus <= 1.0 + 1e-9]
            if fits:
                _, n, g = max(fits, key=lambda f: (f[0], -f[1], -f[2]))
                spot = (n, [g])
        if spot is None:
            unplaced.append(actor)
            placed.append(Placed(actor, None, []))
            continue
        n, ids = spot
        homes.setdefault(_base(actor.name), n)
        for g in ids:
            share[n][g] += min(actor.gpus, 1.0)
            gpu_used[n][g] += actor.gpu_bytes
            owners[n][g].append(actor.name)
        host_used[n] += actor.host_bytes
        placed.append(Placed(actor, n, ids))
    if unplaced:
        need = sum(math.ceil(a.gpus) if a.gpus >= 1 else a.gpus for a in phase.actors if a.gpus)
        free = [len(whole(n)) for n in range(nodes)]
        by_group: dict[tuple[str, float], list[str]] = {}
        for a in unplaced:
            by_group.setdefault((_base(a.name), a.gpus), []).append(a.name)
        names = ", ".join(f"{compact_names(n)} ({g:g} GPU{'s' if g != 1 else ''}{' each' if len(n) > 1 else ''})"
                          for (_, g), n in by_group.items())
        problems.append(f"GPUs: {phase.name} needs {need:g} GPUs on {nodes} node(s) x {gpus_per_node}; not placed: "
                        f"{names} (whole GPUs left per node: {free})")
    limit = gpu_gib * GIB
    for n in range(nodes):
        over: dict[tuple[str, str], list[int]] = {}   # (who, GiB) -> GPUs: alike actors in one message
        for g in range(gpus_per_node):
            if gpu_used[n][g] > limit * (1 + 1e-9):
                over.setdefault((" + ".join(owners[n][g]), _gib(gpu_used[n][g])), []).append(g)
        merged: dict[tuple[str, str], tuple[list[str], list[int]]] = {}
        for (who, gib), ids in over.items():   # one actor per GPU with the same need: "learner rank 0-7"
            names, gids = merged.setdefault((who if " + " in who else _base(who), gib), ([], []))
            names.append(who)
            gids += ids
        for (_, gib), (names, ids) in merged.items():
            many = len(names) > 1
            problems.append(f"node {n}: GPU memory: {compact_names(names)} need{'' if many else 's'} {gib} GiB"
                            f"{' each' if many else ''} > {gpu_gib:g} GiB (GPU{'s' if len(ids) > 1 else ''} "
                            f"{id_ranges(ids)}; {phase.name})")
        if host_used[n] > host_gib * GIB * (1 + 1e-9):
            biggest = sorted((p for p in placed if p.node == n), key=lambda p: -p.actor.host_bytes)[:3]
            top = ", ".join(f"{p.actor.name} {_gib(p.actor.host_bytes)}" for p in biggest)
            problems.append(f"node {n}: host memory: {_gib(host_used[n])} GiB > {host_gib:g} GiB ({phase.name}; "
                            f"largest: {top})")
    return PhasePlan(phase, placed, gpu_used, host_used), problems


def _base(name: str) -> str:
    """An actor's group: 'learner rank 3' -> 'learner rank'."""
    base, _, index = name.rpartition(" ")
    return base if index.isdigit() else name


def id_ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out: list[list[int]] = []
    for i in ids:
        if out and out[-1][-1] == i - 1:
            out[-1].append(i)
        else:
            out.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out) or "-"


def compact_names(names: list[str]) -> str:
    """['learner rank 0', 'learner rank 1', 'learner rank 2'] -> 'learner rank 0-2' (other lists joined)."""
    parts = [n.rpartition(" ") for n in names]
    bases = {b for b, _, _ in parts}
    numbers = [int(i) for _, _, i in parts if i.isdigit()]
    if len(names) > 1 and len(bases) == 1 and len(numbers) == len(names) and \
            numbers == list(range(numbers[0], numbers[0] + len(numbers))):
        return f"{parts[0][0]} {numbers[0]}-{numbers[-1]}"
    return ", ".join(names)


@dataclass
class Row:
    """One row of a phase's per-node table."""

    node: str        # "0", "head" (the driver), "-" (not placed)
    actors: str      # "learner rank 1-3", "node total", "(idle)"
    gpus: str        # GPU ids; used/all on a total row
    gpu: str         # GiB per GPU; the fullest GPU / its memory on a total row
    host: str        # GiB; used/all on a total row
    total: bool = False


def node_rows(plan: Plan, pp: PhasePlan) -> list[Row]:
    """The phase's table: per node its actors (alike actors of one group with consecutive indices in one row), then
    the node's total; the head's driver and unplaced actors last."""
    rows: list[Row] = []
    for n in [*range(plan.nodes), None]:
        here = sorted((p for p in pp.placed if p.node == n), key=lambda p: p.gpu_ids or [plan.gpus_per_node])
        runs: list[list[Placed]] = []
        for p in here:
            last = runs[-1][-1].actor if runs else None
            index, previous = p.actor.name.rpartition(" ")[2], last.name.rpartition(" ")[2] if last else ""
            if (last is not None and _base(p.actor.name) == _base(last.name) != p.actor.name and index.isdigit()
                    and previous.isdigit() and int(index) == int(previous) + 1
                    and (p.actor.gpu_bytes, p.actor.host_bytes) == (last.gpu_bytes, last.host_bytes)):
                runs[-1].append(p)
            else:
                runs.append([p])
        for run in runs:
            actor = run[0].actor
            node = str(n) if n is not None else ("head" if actor.driver else "-")
            ids = [g for p in run for g in p.gpu_ids]
            rows.append(Row(node, compact_names([p.actor.name for p in run]),
                            id_ranges(ids) if ids else ("not placed" if node == "-" else "-"),
                            _gib(actor.gpu_bytes) if actor.gpus else "-", _gib(actor.host_bytes)))
        if n is None:
            continue
        if not here:
            rows.append(Row(str(n), "(idle)", "-", "-", "0.0", total=True))
            continue
        used = sum(1 for g in pp.gpu_used[n] if g > 0)
        rows.append(Row(str(n), "node total", f"{used}/{plan.gpus_per_node}",
                        f"max {_gib(max(pp.gpu_used[n]))}/{plan.gpu_gib:g}",
                        f"{_gib(pp.host_used[n])}/{plan.host_gib:g}", total=True))
    return rows


def _sync_line(pp: PhasePlan, nvlink_gb_s: float, network_gb_s: float) -> str | None:
    sync = pp.phase.sync
    if not sync:
        return None
    per_engine = sync["params"] * DTYPE_BYTES[sync["dtype"]]
    total = per_engine * sync["engines"]
    ends = {p.node for p in pp.placed if p.actor.gpus and p.node is not None
            and (p.actor.name.startswith(sync["rollout"]) or p.actor.name.startswith(sync["learner"]))}
    one_node = len(ends) == 1
    bw, link = (nvlink_gb_s, "NVLink inside one node") if one_node else (network_gb_s, "network between nodes")
    where = f"node(s) {', '.join(map(str, sorted(ends)))}" if ends else "not placed"
    return (f"weight sync per step: {sync['model']} {sync['params'] / 1e9:.2f}B params x {DTYPE_BYTES[sync['dtype']]} "
            f"B ({sync['dtype']}) = {per_engine / 1e9:.2f} GB per engine x {sync['engines']} engine(s) = "
            f"{total / 1e9:.2f} GB; ~{total / (bw * 1e9):.2f} s at {bw:g} GB/s (assumed: {link}; learner ranks and "
            f"rollout engines on {where})")


def make_plan(recipe: Recipe, recipe_name: str, nodes: int, gpus_per_node: int, gpu_gib: float, host_gib: float,
              model_configs: dict[str, str] | None = None, nvlink_gb_s: float = NVLINK_GB_S,
              network_gb_s: float = NETWORK_GB_S) -> Plan:
    """The plan of ``recipe`` on ``nodes x gpus_per_node`` GPUs of ``gpu_gib`` GiB with ``host_gib`` GiB of host
    memory per node. Raises :class:`PlanError` for input it cannot use; a recipe that does not fit is a plan with
    ``problems``."""
    for name, value in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node), ("--gpu-mem-gb", gpu_gib),
                        ("--host-mem-gb", host_gib), ("--nvlink-gb-s", nvlink_gb_s),
                        ("--network-gb-s", network_gb_s)):
        if not value > 0:
            raise PlanError(f"{name} must be positive, got {value}")
    models = Models(model_configs)
    for spec in models.overrides:   # a given config must be readable even when no section names the model
        models.get(spec)
    phases, problems, warnings = recipe_phases(recipe, models, gpu_gib, gpus_per_node)
    plans = []
    for phase in phases:
        pp, found = place(phase, nodes, gpus_per_node, gpu_gib, host_gib)
        pp.sync_line = _sync_line(pp, nvlink_gb_s, network_gb_s)
        problems += [p for p in found if p not in problems]
        plans.append(pp)
    assumptions = [f"GiB = 2^30 bytes; per GPU process {CUDA_RESERVE_GIB:g} GiB reserved (CUDA context, NCCL, "
                   f"fragmentation); host {PROCESS_HOST_GIB:g} GiB per GPU process, vLLM +{VLLM_HOST_GIB:g} GiB, "
                   f"driver {DRIVER_HOST_GIB:g} GiB on the head (not a GPU node)",
                   "learners: rank 0 alone loads the weights, FSDP2 broadcasts the shards (load_weights_on: rank0); "
                   "activations for the longest sequence; the formulas: pr_rlhf/planning.py"]
    return Plan(recipe_name, nodes, gpus_per_node, gpu_gib, host_gib, dict(models.found), plans, problems, warnings,
                assumptions)


def parse_model_configs(items: list[str] | None) -> dict[str, str]:
    """``--model-config SPEC=path`` options -> {spec: path}."""
    out: dict[str, str] = {}
    for item in items or []:
        spec, sep, path = item.partition("=")
        if not sep or not spec or not path:
            raise PlanError(f"--model-config {item!r}: expected MODEL=path/to/config.json (MODEL as the recipe "
                            "names it)")
        out[spec] = path
    return out
