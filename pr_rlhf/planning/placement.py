"""`pr-rlhf plan`'s placement: each phase's sized actors on ``nodes x gpus_per_node`` GPUs (an idealised Ray), the
per-node tables, the weight sync per step, and the plan itself (:func:`make_plan`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from pr_rlhf.configs.recipe import Recipe
from pr_rlhf.planning.models import DTYPE_BYTES, GIB, Arch, Models, PlanError
from pr_rlhf.planning.sizing import (
    CUDA_RESERVE_GIB,
    DRIVER_HOST_GIB,
    PROCESS_HOST_GIB,
    VLLM_HOST_GIB,
    Actor,
    Phase,
    _gib,
    recipe_phases,
)

NVLINK_GB_S = 100.0        # NCCL broadcast inside a node (H100 NVLink: ~450 GB/s per direction; conservative)
NETWORK_GB_S = 25.0        # between nodes: one 200 Gb/s InfiniBand / RoCE link per GPU


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
    pending_host: dict[str, float] = {}   # and their host memory: a node short of it comes after those with room
    for a in order:
        if a.gpus >= 1:
            pending[_base(a.name)] = pending.get(_base(a.name), 0) + math.ceil(a.gpus)
            pending_host[_base(a.name)] = pending_host.get(_base(a.name), 0.0) + a.host_bytes
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
            rest, rest_host = pending[_base(actor.name)], pending_host[_base(actor.name)]
            pending[_base(actor.name)] -= k
            pending_host[_base(actor.name)] -= actor.host_bytes
            home = homes.get(_base(actor.name))     # PACK: the group's node, else one that holds the whole rest
            for n in sorted(range(nodes), key=lambda n: (n != home, len(whole(n)) < rest,
                                                         host_used[n] + rest_host > host_gib * GIB)):
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
                   "activations for the longest sequence; the formulas: pr_rlhf/planning/__init__.py"]
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
