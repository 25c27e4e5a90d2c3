"""`pr-rlhf plan`'s actors: every group a command declares (:mod:`pr_rlhf.actors`) sized in GPU and host memory,
phase by phase (the formulas: the package docstring, :mod:`pr_rlhf.planning`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pr_rlhf.actors import ActorGroup, commands_of, declare, phases, uses_gpu
from pr_rlhf.configs.base import EngineBase, ScalarRMConfig
from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.configs.recipe import Recipe
from pr_rlhf.planning.models import DTYPE_BYTES, GIB, Arch, Models, PlanError

# Assumptions (rough, stated in the output where they decide a figure).
CUDA_RESERVE_GIB = 2.0     # CUDA context, NCCL buffers and allocator fragmentation of one GPU process
PROCESS_HOST_GIB = 4.0     # host RSS of a Python process with torch + CUDA (+ NCCL) loaded
CPU_PROCESS_HOST_GIB = 2.0  # the same without CUDA
VLLM_HOST_GIB = 4.0        # vLLM's engine-core process, besides one PROCESS_HOST_GIB per tensor-parallel worker
DRIVER_HOST_GIB = 4.0      # the job's driver: controller state, batches of token ids, metrics
ENGINE_SLACK = 1.2         # a transformers engine's KV cache and activations over its weights


@dataclass
class Actor:
    name: str                 # "learner rank 3"
    gpus: float               # Ray GPUs: whole GPUs on one node (>= 1), a share of one GPU (< 1), or 0
    gpu_bytes: float          # on each GPU it uses
    host_bytes: float
    driver: bool = False      # runs in the job's driver process
    resident_bytes: float = 0.0   # a learner rank: what stays on its GPU between updates (states, reserve)
    phase_bytes: dict[str, float] = field(default_factory=dict)   # colocated: its GPU at each phase's peak


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


def _gib(x: float) -> str:
    return f"{x / GIB:.1f}"


class _Builder:
    """Sizes the actors of one recipe's commands on a cluster of ``cluster_gpus`` GPUs (default: one node's)."""

    def __init__(self, models: Models, gpu_gib: float, gpus_per_node: int, cluster_gpus: float | None = None) -> None:
        self.models = models
        self.gpu_bytes = gpu_gib * GIB
        self.gpus_per_node = gpus_per_node
        self.cluster_gpus = float(gpus_per_node if cluster_gpus is None else cluster_gpus)
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
        on_gpu = uses_gpu(cfg.device, self.cluster_gpus)   # the rule the declaration's bundle follows
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
                actors.append(Actor(f"{label} {r}", cfg.num_gpus_per_worker, gpu, host + extra,
                                    resident_bytes=policy + ref + critic + reserve))
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


    # declared groups -------------------------------------------------------------------------------------
    def group(self, g: ActorGroup) -> tuple[list[Actor], Group]:
        """The actors of a declared group, sized: learner ranks by what they train, the others by the engines each
        builds (a scalar RM beside them), asking Ray for the group's GPUs."""
        if g.learner is not None:
            job = g.learner
            return self.learner(job.config, job.config.model, job.model_field, job.seq_len, job.response_len,
                                job.reference, label=g.actor)
        engines = [(ref.config, ref.field) for ref in g.engines if not isinstance(ref.config, ScalarRMConfig)]
        extra_gpu = extra_host = 0.0
        details = []
        for ref in g.engines:
            if isinstance(ref.config, ScalarRMConfig):
                gpu, host, detail = self.scalar_rm(ref.config, ref.field)
                extra_gpu, extra_host = extra_gpu + gpu, extra_host + host
                details.append(detail)
        if not g.engines:
            details.append(f"{g.note or g.actor} on CPU")
        built = self.engine_actors(g.actor, g.count, engines, g.gpus, g.field("GPU"), extra_gpu, extra_host,
                                   "; ".join(details), driver=g.role == "driver",
                                   numbered=g.count > 1 or g.role in ("rollout", "reward", "replica"))
        gpus = built[0][0].gpus
        if g.role == "driver" and gpus:
            self.warn(f"{g.phase}: the job's driver runs {', '.join(ref.field for ref in g.engines)}: submit the job "
                      f"with --entrypoint-num-gpus {gpus:g} (KubeRay: entrypointNumGpus) so that the driver lands on a "
                      "GPU node; the plan places it there")
        return built

    def sync(self, members: list[ActorGroup]) -> dict[str, Any] | None:
        """A phase's weight sync: the learner's policy into every rollout engine (None: no such pair)."""
        learner = next((g for g in members if g.learner is not None), None)
        rollout = next((g for g in members if g.role == "rollout"), None)
        if learner is None or rollout is None:
            return None
        engine, model = rollout.engines[0].config, learner.learner.config.model
        arch = self.models.get(model)
        if engine.backend == "openai" or arch is None:
            return None
        return {"model": model, "params": arch.params(), "dtype": engine.dtype, "engines": rollout.count,
                "rollout": rollout.actor, "learner": learner.actor}


def colocate(phase: Phase, built: tuple[list[Actor], Group], host_actor: str) -> tuple[list[Actor], Group]:
    """Engines colocated with the learner ranks (the hybrid engine): engine i joins rank i's GPU, which holds at
    its peak the larger of the update (the rank's peak, the sleeping engine's CUDA context) and the rollout (the
    rank's resident states, the awake engine's budget). Returns what is left to add: no actor of its own."""
    engines, group = built
    ranks = [a for a in phase.actors if a.name.startswith(host_actor + " ")]
    merged = []
    for i, (rank, engine) in enumerate(zip(ranks, engines)):
        asleep = CUDA_RESERVE_GIB * GIB if engine.gpus else 0.0
        update, rollout = rank.gpu_bytes + asleep, rank.resident_bytes + engine.gpu_bytes
        rank.gpu_bytes = max(update, rollout)
        rank.phase_bytes = {"update": update, "rollout": rollout}
        rank.host_bytes += engine.host_bytes
        rank.name = f"{host_actor} + {engine.name.rpartition(' ')[0]} {i}"   # one group: "learner rank + ... 0-3"
        merged.append((update, rollout))
    if merged:
        update, rollout = merged[0]
        group = Group(group.label, f"{group.detail}; colocated on the {host_actor}s' GPUs: update "
                                   f"{_gib(update)} GiB (the rank's peak + the engine asleep, {CUDA_RESERVE_GIB:.1f}), "
                                   f"rollout {_gib(rollout)} GiB (the rank's states and reserve + the engine awake)")
    return [], group


def _add(phase: Phase, built: tuple[list[Actor], Group]) -> None:
    phase.actors += built[0]
    phase.groups.append(built[1])


def recipe_phases(recipe: Recipe, models: Models, gpu_gib: float, gpus_per_node: int, nodes: int = 1
                  ) -> tuple[list[Phase], list[str], list[str]]:
    """The phases of every command the recipe has a section for (:func:`pr_rlhf.actors.commands_of`), each with the
    job's driver; the problems found while sizing; warnings."""
    b = _Builder(models, gpu_gib, gpus_per_node, nodes * gpus_per_node)
    out: list[Phase] = []
    for command in commands_of(recipe):
        for name, members in phases(declare(recipe, command, b.cluster_gpus)).items():
            phase = Phase(name)
            _add(phase, b.driver())
            for g in members:
                built = b.group(g)
                if g.colocated_with:
                    host = next(h for h in members if h.name == g.colocated_with)
                    built = colocate(phase, built, host.actor)
                _add(phase, built)
            phase.sync = b.sync(members)
            out.append(phase)
    if not out:
        raise PlanError("nothing to plan: the recipe has none of train:, rl_sweep:, pgenrm:, bon:, rm:, leaderboard:, "
                        "scaling:, serve: (the Ray jobs that place actors)")
    return out, b.problems, b.warnings
