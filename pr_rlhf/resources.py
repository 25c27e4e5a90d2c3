"""The pre-flight check: every actor a command starts (declared once, in :mod:`pr_rlhf.actors`), checked against
the recipe and the cluster before any actor starts (each driver calls ``workers.ray_utils.check_resources`` right
after joining Ray).

An actor that asks for more than any node offers, or a set of actors that together ask for more than the cluster
has, would otherwise wait forever as pending; a vLLM engine with tensor parallelism whose actor holds fewer GPUs
fails late, or (vLLM's Ray executor inside an actor that already holds the GPUs) hangs. Here each of these is an
error naming the recipe field to change.

Pure Python: no Ray (the driver passes its nodes' resources: ``ray.nodes()[i]["Resources"]``), no torch at import
(:func:`check` imports the learner's attention rule lazily).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pr_rlhf.actors import COMMANDS, ActorGroup, declare, phases
from pr_rlhf.configs.base import OpenAIEngineConfig, VLLMEngineConfig
from pr_rlhf.configs.reward import EngineRef

__all__ = ["COMMANDS", "ActorGroup", "ClusterFitError", "ResourceError", "check", "check_cluster", "check_groups"]


class ResourceError(ValueError):
    """A recipe whose actors cannot run as configured; the message names the recipe field."""


class ClusterFitError(ResourceError):
    """A recipe whose actors do not fit the cluster (as it is now: a cluster still growing may fit later)."""


def _fmt(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in resources.items()) or "nothing"


# ---------------------------------------------------------------------------------------------- engines
def _check_engine(ref: EngineRef, gpus: float, gpus_field: str, what: str) -> None:
    """The GPUs engine ``ref`` needs against the ``gpus`` its actor holds."""
    need = ref.gpus
    if need > 1 and gpus != need:
        raise ResourceError(f"{ref.field}.tensor_parallel_size is {need}: each {what} must hold exactly that many "
                            f"GPUs (one node's, all of its engine's workers), but {gpus_field} is {gpus:g}")
    if need == 1 and not 0 < gpus <= 1:
        raise ResourceError(f"{ref.field} runs on {ref.config.device}: each {what} needs a GPU (a share of one), but "
                            f"{gpus_field} is {gpus:g}")
    if isinstance(ref.config, VLLMEngineConfig) and need and ref.config.executor_backend() == "ray":
        raise ResourceError(f"{ref.field}.distributed_executor_backend 'ray': vLLM would ask Ray for {need} more "
                            f"GPU(s) while the {what} already holds its {gpus:g} (it waits forever); use 'mp', or "
                            f"leave it unset")


def check_engines(groups: Sequence[ActorGroup]) -> None:
    """Every engine against the GPUs of the actor that builds it (:class:`ResourceError` naming the field)."""
    for g in groups:
        if g.role == "driver":   # the driver's GPUs come with the job's submission, not from Ray
            continue
        for ref in g.engines:
            if not isinstance(ref.config, OpenAIEngineConfig):
                _check_engine(ref, g.gpus, g.field("GPU"), g.actor)


# ---------------------------------------------------------------------------------------------- the cluster
def _fits(bundle: Mapping[str, float], node: Mapping[str, float]) -> bool:
    return all(node.get(k, 0.0) >= v for k, v in bundle.items() if v > 0)


def check_cluster(groups: Sequence[ActorGroup], nodes: Sequence[Mapping[str, float]]) -> None:
    """Each actor fits one node, each placement group its strategy, and each phase's actors the cluster's totals;
    :class:`ClusterFitError` naming the recipe field otherwise. ``nodes``: each live node's total resources."""
    if not nodes:
        raise ClusterFitError("the cluster has no live node")
    groups = [g for g in groups if g.role != "driver"]   # the driver is no Ray actor
    largest = {k: max(n.get(k, 0.0) for n in nodes) for k in {k for g in groups for k in g.bundle}}
    for g in groups:
        if not any(_fits(g.bundle, n) for n in nodes):
            short = {k: v for k, v in g.bundle.items() if v > largest.get(k, 0.0)}
            why = (f"{_fmt(short)} > the largest node's {_fmt({k: largest.get(k, 0.0) for k in short})}" if short
                   else "no node offers all of it at once")
            raise ClusterFitError(f"{g.field(next(iter(short or g.bundle)))}: each actor of {g.name} asks for "
                                  f"{_fmt(g.bundle)}, and an actor runs on one node ({why})")
        if g.placement_group == "STRICT_PACK" and not any(_fits(g.total(), n) for n in nodes):
            raise ClusterFitError(f"{g.field()}: placement STRICT_PACK puts all {g.count} actors of {g.name} on "
                                  f"one node ({_fmt(g.total())}), and no node offers that")
        if g.placement_group == "STRICT_SPREAD" and g.count > sum(_fits(g.bundle, n) for n in nodes):
            raise ClusterFitError(f"{g.field()}: placement STRICT_SPREAD puts each of the {g.count} actors of "
                                  f"{g.name} on its own node; {sum(_fits(g.bundle, n) for n in nodes)} node(s) "
                                  f"fit one")
    cluster: dict[str, float] = {}
    for node in nodes:
        for key, value in node.items():
            cluster[key] = cluster.get(key, 0.0) + value
    for phase, members in phases(groups).items():
        need: dict[str, float] = {}
        for g in members:
            for key, value in g.total().items():
                need[key] = need.get(key, 0.0) + value
        for key, value in need.items():
            if value > cluster.get(key, 0.0) + 1e-9:
                parts = ", ".join(f"{g.field(key)}: {1 if g.queued else g.count} x {g.bundle.get(key, 0.0):g}"
                                  for g in members if g.total().get(key))
                raise ClusterFitError(f"{phase}: the actors alive together ask for {key} {value:g} ({parts}), the "
                                      f"cluster has {cluster.get(key, 0.0):g}")


def check_groups(groups: list[ActorGroup], nodes: Sequence[Mapping[str, float]] | None = None) -> list[ActorGroup]:
    """``groups`` checked before anything starts: every engine against the GPUs of its actor (vLLM tensor
    parallelism == the actor's GPUs; no Ray executor inside an actor that holds the GPUs), the learners' attention
    kernel (``pr_rlhf.rl.modeling.check_attention_config``), and, given ``nodes`` (each live node's total
    resources), every bundle and phase against the cluster (:func:`check_cluster`)."""
    check_engines(groups)
    learners = [g for g in groups if g.learner is not None]
    if learners:
        from pr_rlhf.rl.modeling import AttentionConfigError, check_attention_config

        for g in learners:
            try:
                check_attention_config(g.learner.config)
            except AttentionConfigError as exc:
                raise ResourceError(f"{g.name}: {exc}") from None
    if nodes is not None:
        check_cluster(groups, nodes)
    return groups


def check(recipe: Any, command: str, nodes: Sequence[Mapping[str, float]] | None = None) -> list[ActorGroup]:
    """The actor groups ``command`` starts for ``recipe`` (:func:`pr_rlhf.actors.declare`, a learner with device
    'auto' on GPUs where ``nodes`` have any), checked by :func:`check_groups`."""
    try:
        groups = declare(recipe, command, sum(n.get("GPU", 0.0) for n in nodes or []))
    except ValueError as exc:   # no such section
        raise ResourceError(str(exc)) from None
    return check_groups(groups, nodes)
