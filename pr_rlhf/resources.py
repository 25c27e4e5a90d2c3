"""Every actor a command starts, as the Ray resource bundle it asks for, checked against the recipe and the cluster
before any actor starts (each driver calls ``workers.ray_utils.check_resources`` right after joining Ray).

An actor that asks for more than any node offers, or a set of actors that together ask for more than the cluster
has, would otherwise wait forever as pending; a vLLM engine with tensor parallelism whose actor holds fewer GPUs
fails late, or (vLLM's Ray executor inside an actor that already holds the GPUs) hangs. Here each of these is an
error naming the recipe field to change.

Pure Python: no Ray (the driver passes its nodes' resources: ``ray.nodes()[i]["Resources"]``), no torch at import
(:func:`check` imports the learner's attention rule lazily). The groups mirror how the drivers start actors:

- ``train`` (``workers.controller``): the learner ranks (one placement group), the rollout workers (one placement
  group, PACK), the reward pool and the downstream pool, all alive together;
- ``rl-sweep``: the same once per reward arm, one arm after the other;
- ``pgenrm``: the learner ranks, with rollout workers when a GRPO stage runs; then the stage evaluations, one task
  at a time (the rollout workers' resources when ``eval.engine`` is 'rollout');
- ``bon``: the rollout workers; then each reward model's pool in turn, then the downstream judge's;
- ``train-rm``: the learner ranks; then the evaluation task (one GPU when ``eval.device`` is cuda).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

COMMANDS = ("train", "rl-sweep", "pgenrm", "bon", "train-rm", "leaderboard")
BUILTIN = ("CPU", "GPU")


class ResourceError(ValueError):
    """A recipe whose actors cannot run as configured; the message names the recipe field."""


class ClusterFitError(ResourceError):
    """A recipe whose actors do not fit the cluster (as it is now: a cluster still growing may fit later)."""


@dataclass(frozen=True)
class ActorGroup:
    """Actors started together with the same resources: ``len(bundles)`` of them, one bundle each."""

    name: str                                   # what they are, e.g. "train.learner"
    fields: Mapping[str, str]                   # resource -> the recipe field that sets it ("*": custom ones)
    bundles: tuple[dict[str, float], ...]       # {"CPU": .., "GPU": .., custom: ..} per actor
    phase: str                                  # groups of one phase are alive together; phases run in turn
    placement_group: str | None = None          # its placement-group strategy when reserved as one group
    engine_gpus: int = 0                        # GPUs one actor's engine spans (vLLM tensor parallelism)
    learner: Any = field(default=None, compare=False)   # the LearnerConfig of a learner group

    def field(self, resource: str | None = None) -> str:
        """The recipe field that sets ``resource`` (None: GPU if the group takes GPUs, else CPU)."""
        if resource is None:
            resource = "GPU" if any(b.get("GPU") for b in self.bundles) else "CPU"
        return self.fields.get(resource) or self.fields["*"]

    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for bundle in self.bundles:
            for key, value in bundle.items():
                out[key] = out.get(key, 0.0) + value
        return out


def _bundle(cpus: float, gpus: float, custom: Mapping[str, float] | None = None) -> dict[str, float]:
    return {"CPU": float(cpus), **({"GPU": float(gpus)} if gpus else {}), **{k: float(v) for k, v in
                                                                            (custom or {}).items()}}


def _fmt(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in resources.items()) or "nothing"


# ---------------------------------------------------------------------------------------------- engines
def _engine_gpus(engine: Any) -> int:
    """GPUs an engine spans when it runs on CUDA (0: none): vLLM's tensor parallelism, else one."""
    if engine is None or not str(getattr(engine, "device", "cpu")).startswith("cuda"):
        return 0
    return int(getattr(engine, "tensor_parallel_size", 1))


def _check_engine(engine: Any, engine_field: str, gpus: float, gpus_field: str, what: str) -> int:
    """The GPUs ``engine`` needs, checked against the ``gpus`` its actor holds; returns them."""
    need = _engine_gpus(engine)
    if need > 1 and gpus != need:
        raise ResourceError(f"{engine_field}.tensor_parallel_size is {need}: each {what} must hold exactly that many "
                            f"GPUs (one node's, all of its engine's workers), but {gpus_field} is {gpus:g}")
    if need == 1 and not 0 < gpus <= 1:
        raise ResourceError(f"{engine_field} runs on {engine.device}: each {what} needs a GPU (a share of one), but "
                            f"{gpus_field} is {gpus:g}")
    if getattr(engine, "backend", None) == "vllm" and need and engine.executor_backend() == "ray":
        raise ResourceError(f"{engine_field}.distributed_executor_backend 'ray': vLLM would ask Ray for {need} more "
                            f"GPU(s) while the {what} already holds its {gpus:g} (it waits forever); use 'mp', or "
                            f"leave it unset")
    return need


def _reward_engines(reward: Any, where: str) -> list[tuple[Any, str]]:
    """The engines a reward worker builds for scorer ``reward`` (at recipe path ``where``)."""
    engines = [(getattr(reward, "judge", None), f"{where}.judge")]
    planner = getattr(reward, "planner", None)
    if planner is not None and planner != engines[0][0]:   # an engine equal to the judge is shared
        engines.append((planner, f"{where}.planner"))
    scalar = getattr(reward, "scalar_rm", None)
    if scalar is not None and reward.kind == "scalar":
        engines.append((scalar, f"{where}.scalar_rm"))
    return [(e, f) for e, f in engines if e is not None]


# ---------------------------------------------------------------------------------------------- groups
def _fields(cpu: str, gpu: str, custom: str) -> dict[str, str]:
    return {"CPU": cpu, "GPU": gpu, "*": custom}


def _learner(cfg: Any, where: str, phase: str, cluster_gpus: float) -> ActorGroup:
    # as workers.learner.group.LearnerGroup: device 'auto' takes a GPU per rank when the cluster has any
    use_gpu = cfg.device == "cuda" or (cfg.device == "auto" and cluster_gpus > 0)
    bundle = _bundle(cfg.num_cpus_per_worker, cfg.num_gpus_per_worker if use_gpu else 0, cfg.resources)
    return ActorGroup(where, _fields(f"{where}.num_cpus_per_worker", f"{where}.num_gpus_per_worker",
                                     f"{where}.resources"),
                      tuple(dict(bundle) for _ in range(cfg.world_size)), phase,
                      placement_group=cfg.placement_strategy, learner=cfg)


def _rollout(section: Any, where: str, engine: Any, engine_field: str, phase: str,
             placement_group: str | None) -> ActorGroup:
    gpus = section.rollout_num_gpus
    need = _check_engine(engine, engine_field, gpus, f"{where}.rollout_num_gpus", "rollout worker")
    bundle = _bundle(section.rollout_num_cpus, gpus, getattr(section, "rollout_resources", None))
    return ActorGroup(f"{where}.rollout workers", _fields(f"{where}.rollout_num_cpus", f"{where}.rollout_num_gpus",
                                                         f"{where}.rollout_resources"),
                      tuple(dict(bundle) for _ in range(section.rollout_workers)), phase,
                      placement_group=placement_group, engine_gpus=need)


def _pool(reward: Any, where: str, phase: str) -> ActorGroup:
    pool = reward.pool
    need = max([_check_engine(e, f, pool.num_gpus, f"{where}.pool.num_gpus", "reward worker")
                for e, f in _reward_engines(reward, where)] or [0])
    bundle = _bundle(pool.num_cpus, pool.num_gpus, pool.resources)
    return ActorGroup(f"{where} pool", _fields(f"{where}.pool.num_cpus", f"{where}.pool.num_gpus",
                                               f"{where}.pool.resources"),
                      tuple(dict(bundle) for _ in range(pool.workers)), phase, engine_gpus=need)


def _train_groups(train: Any, reward: Any, reward_where: str, phase: str, cluster_gpus: float) -> list[ActorGroup]:
    groups = [_learner(train.learner, "train.learner", phase, cluster_gpus),
              _rollout(train, "train", train.rollout, "train.rollout", phase, "PACK"),
              _pool(reward, reward_where, phase)]
    if train.downstream is not None:
        groups.append(_pool(train.downstream, "train.downstream", phase))
    return groups


def actor_groups(recipe: Any, command: str, cluster_gpus: float = 0.0) -> list[ActorGroup]:
    """Every actor group ``command`` (one of :data:`COMMANDS`) starts for ``recipe``, checking each engine against
    the GPUs its actor holds (:class:`ResourceError`). ``cluster_gpus``: the cluster's GPUs (a learner with device
    'auto' takes GPUs when there are any)."""
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r} (one of {COMMANDS})")
    section = {"train": recipe.train, "rl-sweep": recipe.train, "pgenrm": recipe.pgenrm, "bon": recipe.bon,
               "train-rm": recipe.rm, "leaderboard": recipe.leaderboard}[command]
    if section is None:
        name = {"train": "train", "rl-sweep": "train", "pgenrm": "pgenrm", "bon": "bon", "train-rm": "rm",
                "leaderboard": "leaderboard"}[command]
        raise ResourceError(f"the recipe has no {name}: section")
    if command == "train":
        return _train_groups(section, recipe.reward, "reward", "rl", cluster_gpus)
    if command == "rl-sweep":
        if recipe.rl_sweep is None:
            raise ResourceError("the recipe has no rl_sweep: section")
        return [g for arm, reward in recipe.rl_sweep.arms.items()
                for g in _train_groups(section, reward, f"rl_sweep.arms.{arm}", f"arm {arm}", cluster_gpus)]
    if command == "pgenrm":
        from pr_rlhf.configs.pgenrm import GRPO_STAGES

        groups = [_learner(section.learner, "pgenrm.learner", "training", cluster_gpus)]
        if any(stage in GRPO_STAGES for stage in section.stages):
            groups.append(_rollout(section, "pgenrm", section.rollout, "pgenrm.rollout", "training", None))
        if section.eval.engine == "rollout":
            engine_gpus = _check_engine(section.rollout, "pgenrm.rollout", section.rollout_num_gpus,
                                        "pgenrm.rollout_num_gpus", "evaluation task (eval.engine 'rollout')")
            task = _bundle(section.rollout_num_cpus, section.rollout_num_gpus)
            fields = _fields("pgenrm.rollout_num_cpus", "pgenrm.rollout_num_gpus", "pgenrm.eval.engine")
        else:
            engine_gpus, task, fields = 0, _bundle(1, 0), _fields(*["pgenrm.eval.engine"] * 3)
        groups.append(ActorGroup("pgenrm evaluation task", fields, (task,), "evaluation", engine_gpus=engine_gpus))
        return groups
    if command == "bon":
        groups = [_rollout(section, "bon", section.policy, "bon.policy", "pool", None)]
        for name, reward in section.reward_models.items():
            groups.append(_pool(reward, f"bon.reward_models.{name}", f"score {name}"))
        groups.append(_pool(section.downstream, "bon.downstream", "score downstream"))
        return groups
    if command == "leaderboard":   # one training task per method (one CPU each), then the scoring pool
        pool = section.pool
        bundle = _bundle(pool.num_cpus, pool.num_gpus, pool.resources)
        return [ActorGroup("leaderboard training task", _fields(*["leaderboard.methods"] * 3), (_bundle(1, 0),),
                           "training"),
                ActorGroup("leaderboard pool", _fields("leaderboard.pool.num_cpus", "leaderboard.pool.num_gpus",
                                                       "leaderboard.pool.resources"),
                           tuple(dict(bundle) for _ in range(pool.workers)), "scoring")]
    # train-rm: the learner, then the evaluation task (its scalar RM, and the planner of mode 'plan')
    groups = [_learner(section.learner, "rm.learner", "training", cluster_gpus)]
    gpus = 1.0 if section.eval.device == "cuda" else 0.0
    if "plan" in section.input_modes:
        _check_engine(section.planner, "rm.planner", gpus, "rm.eval.device", "evaluation task")
    groups.append(ActorGroup("rm evaluation task", _fields(*["rm.eval.device"] * 3), (_bundle(1, gpus),),
                             "evaluation", engine_gpus=int(gpus)))
    return groups


# ---------------------------------------------------------------------------------------------- the cluster
def _fits(bundle: Mapping[str, float], node: Mapping[str, float]) -> bool:
    return all(node.get(k, 0.0) >= v for k, v in bundle.items() if v > 0)


def check_cluster(groups: Sequence[ActorGroup], nodes: Sequence[Mapping[str, float]]) -> None:
    """Each actor fits one node, each placement group its strategy, and each phase's actors the cluster's totals;
    :class:`ClusterFitError` naming the recipe field otherwise. ``nodes``: each live node's total resources."""
    if not nodes:
        raise ClusterFitError("the cluster has no live node")
    largest = {k: max(n.get(k, 0.0) for n in nodes) for k in {k for g in groups for b in g.bundles for k in b}}
    for g in groups:
        for bundle in g.bundles:
            if not any(_fits(bundle, n) for n in nodes):
                short = {k: v for k, v in bundle.items() if v > largest.get(k, 0.0)}
                why = (f"{_fmt(short)} > the largest node's {_fmt({k: largest.get(k, 0.0) for k in short})}" if short
                       else "no node offers all of it at once")
                raise ClusterFitError(f"{g.field(next(iter(short or bundle)))}: each actor of {g.name} asks for "
                                      f"{_fmt(bundle)}, and an actor runs on one node ({why})")
        if g.placement_group == "STRICT_PACK" and not any(_fits(g.total(), n) for n in nodes):
            raise ClusterFitError(f"{g.field()}: placement STRICT_PACK puts all {len(g.bundles)} actors of {g.name} on "
                                  f"one node ({_fmt(g.total())}), and no node offers that")
        if g.placement_group == "STRICT_SPREAD" and len(g.bundles) > sum(_fits(g.bundles[0], n) for n in nodes):
            raise ClusterFitError(f"{g.field()}: placement STRICT_SPREAD puts each of the {len(g.bundles)} actors of "
                                  f"{g.name} on its own node; {sum(_fits(g.bundles[0], n) for n in nodes)} node(s) "
                                  f"fit one")
    cluster: dict[str, float] = {}
    for node in nodes:
        for key, value in node.items():
            cluster[key] = cluster.get(key, 0.0) + value
    for phase in dict.fromkeys(g.phase for g in groups):
        members = [g for g in groups if g.phase == phase]
        need: dict[str, float] = {}
        for g in members:
            for key, value in g.total().items():
                need[key] = need.get(key, 0.0) + value
        for key, value in need.items():
            if value > cluster.get(key, 0.0) + 1e-9:
                parts = ", ".join(f"{g.field(key)}: {len(g.bundles)} x {g.bundles[0].get(key, 0.0):g}" for g in members
                                  if g.total().get(key))
                raise ClusterFitError(f"{phase}: the actors alive together ask for {key} {value:g} ({parts}), the "
                                      f"cluster has {cluster.get(key, 0.0):g}")


def check(recipe: Any, command: str, nodes: Sequence[Mapping[str, float]] | None = None) -> list[ActorGroup]:
    """The actor groups of ``command`` for ``recipe``, checked before anything starts: every engine against the
    GPUs of its actor (vLLM tensor parallelism == the actor's GPUs; no Ray executor inside an actor that holds the
    GPUs), the learners' attention kernel (``pr_rlhf.rl.modeling.check_attention_config``), and, given ``nodes``
    (each live node's total resources), every bundle and phase against the cluster (:func:`check_cluster`)."""
    cluster_gpus = sum(n.get("GPU", 0.0) for n in nodes or [])
    groups = actor_groups(recipe, command, cluster_gpus)
    learners = [g for g in groups if g.learner is not None]
    if learners:
        from pr_rlhf.rl.modeling import AttentionConfigError, check_attention_config

        for g in learners:
            try:
                check_attention_config(g.learner)
            except AttentionConfigError as exc:
                raise ResourceError(f"{g.name}: {exc}") from None
    if nodes is not None:
        check_cluster(groups, nodes)
    return groups
