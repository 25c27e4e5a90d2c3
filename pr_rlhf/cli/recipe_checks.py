"""`pr-rlhf check` and `pr-rlhf plan`: what a recipe resolves to, and whether its actors fit a cluster, without
running anything."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from pr_rlhf.cli.prologue import OverridesOpt, RecipeCommand, console, fail, open_recipe
from pr_rlhf.configs.recipe import dump_recipe

CHECK = RecipeCommand("check")
PLAN = RecipeCommand("plan")


def check(recipe: Path = typer.Argument(..., help="recipe YAML"), overrides: Optional[List[str]] = OverridesOpt,
          show: bool = typer.Option(False, help="print the fully resolved recipe")) -> None:
    """Validate a recipe (and overrides) without running anything."""
    resolved = open_recipe(CHECK, recipe, overrides)
    if show:
        console.print(dump_recipe(resolved), highlight=False)
    console.print(f"[green]ok[/] {recipe}")


def plan(recipe: Path = typer.Argument(..., help="recipe YAML (train:, rl_sweep:, pgenrm:, bon:, rm:, leaderboard:, "
                                                   "scaling: or serve:)"),
         nodes: int = typer.Option(..., "--nodes", help="GPU nodes (the head that runs the driver is extra)"),
         gpus_per_node: int = typer.Option(..., "--gpus-per-node"),
         gpu_mem_gb: float = typer.Option(..., "--gpu-mem-gb", help="memory of one GPU in GiB (an 80 GB H100: 80)"),
         host_mem_gb: float = typer.Option(..., "--host-mem-gb", help="host memory of one node in GiB"),
         model_config: Optional[List[str]] = typer.Option(
             None, "--model-config", help="MODEL=path/config.json (or its folder): the config of a model the recipe "
                                          "names, e.g. one not on this machine (repeatable)"),
         nvlink_gb_s: Optional[float] = typer.Option(None, "--nvlink-gb-s", help="assumed weight-sync bandwidth "
                                                     "inside a node, GB/s (default 100)"),
         network_gb_s: Optional[float] = typer.Option(None, "--network-gb-s", help="assumed weight-sync bandwidth "
                                                      "between nodes, GB/s (default 25)"),
         overrides: Optional[List[str]] = OverridesOpt) -> None:
    """Will the recipe's actors fit NODES x GPUS-PER-NODE GPUs? GPU and host memory of every actor per node, the
    weight sync per step; exit 2 naming the resource and the actor when they do not (pr_rlhf/planning.py)."""
    from pr_rlhf.planning import NETWORK_GB_S, NVLINK_GB_S, PlanError, make_plan, parse_model_configs

    resolved = open_recipe(PLAN, recipe, overrides)
    try:
        result = make_plan(resolved, str(recipe), nodes, gpus_per_node, gpu_mem_gb, host_mem_gb,
                           parse_model_configs(model_config), nvlink_gb_s or NVLINK_GB_S,
                           network_gb_s or NETWORK_GB_S)
    except PlanError as exc:
        fail(f"{recipe}: {exc}")
        raise
    print_plan(result)
    print_layouts(resolved, lambda run: make_plan(run, str(recipe), nodes, gpus_per_node, gpu_mem_gb, host_mem_gb,
                                                   parse_model_configs(model_config),
                                                   nvlink_gb_s or NVLINK_GB_S, network_gb_s or NETWORK_GB_S),
                  parse_model_configs(model_config))
    if not result.fits:
        fail(f"{recipe} does not fit {nodes} node(s) x {gpus_per_node} GPUs x {gpu_mem_gb:g} GiB, "
              f"{host_mem_gb:g} GiB host:\n  " + "\n  ".join(result.problems))
    console.print(f"[green]fits[/] {nodes} node(s) x {gpus_per_node} GPUs x {gpu_mem_gb:g} GiB, {host_mem_gb:g} GiB "
                  "host per node", highlight=False)


def print_layouts(recipe, plan_of, model_configs: dict[str, str]) -> None:
    """Each RL section whose rollout runs on GPUs (the RL run, the P-GenRM GRPO stages) in both layouts (split,
    colocated) on this cluster: per phase the GPUs busy, the memory per GPU at the phase's peak and an estimated time;
    the step, the share of held GPU time busy, and the layout chosen."""
    from pr_rlhf.planning import Models
    from pr_rlhf.planning.layouts import ASSUMPTIONS, choose, estimate, rl_sections

    models = Models(model_configs)
    sections = rl_sections(recipe)
    for rl in sections:
        estimates = [estimate(recipe, layout, plan_of, models, rl) for layout in ("split", "colocated")]
        console.print(f"[bold]{rl.title}, both layouts[/] (estimates; the reward pool's GPUs apart):", highlight=False)
        for e in estimates:
            phases = " | ".join(f"{p} {e.phases[p][0]:g} GPUs x {e.phases[p][1]:.1f} GiB, {e.phases[p][2]:.2f} s"
                                if e.phases[p][0] else f"{p} on no GPU (not timed)"
                                for p in ("rollout", "reward", "update"))
            console.print(f"  {e.layout}{' (the recipe)' if e.layout == rl.config.layout else ''}: {e.gpus:g} GPUs "
                          f"| {phases} | sync {e.phases['sync'][2]:.2f} s | step {e.step_s:.2f} s, "
                          f"{e.utilization:.0%} busy | {'fits' if e.fits else 'does not fit'}", highlight=False,
                          soft_wrap=True)
        best, why = choose(estimates)
        console.print(f"  layout: {why}" if best is None else f"  layout chosen: {why}", highlight=False,
                      soft_wrap=True)
    if sections:
        console.print(f"assumed (layouts): {ASSUMPTIONS}", highlight=False, soft_wrap=True)


def print_plan(result) -> None:
    """The plan per phase: a table of its GPU nodes (alike actors side by side in one row), the arithmetic behind
    each kind of actor, the weight sync; CPU-only phases one line each."""
    from pr_rlhf.planning import node_rows

    gib = 2 ** 30
    console.print(f"[bold]plan[/] {result.recipe}: {result.nodes} node(s) x {result.gpus_per_node} GPUs of "
                  f"{result.gpu_gib:g} GiB, {result.host_gib:g} GiB host per node", highlight=False)
    for spec, arch in result.models.items():
        size = f"{arch.params() / 1e9:.3f}B parameters ({arch.source})" if arch else "size unknown"
        console.print(f"  model {spec}: {size}", highlight=False, soft_wrap=True)
    for pp in result.phases:
        gpu_total = sum(p.actor.gpus for p in pp.placed if p.actor.gpus)
        if not gpu_total:
            host = max(pp.host_used) / gib
            workers = sum(not p.actor.driver for p in pp.placed)
            console.print(f"[bold]{pp.phase.name}[/]: CPU only, {workers} worker(s) besides the driver, at most "
                          f"{host:.1f} GiB host on a node", highlight=False)
            continue
        table = Table(title=f"{pp.phase.name}: {gpu_total:g} of {result.nodes * result.gpus_per_node} GPUs",
                      title_justify="left")
        for col, justify in (("node", "left"), ("actor", "left"), ("GPUs", "right"), ("GiB/GPU", "right"),
                             ("host GiB", "right")):
            table.add_column(col, justify=justify)
        for row in node_rows(result, pp):
            cells = (row.node, row.actors, row.gpus, row.gpu, row.host)
            table.add_row(*(f"[bold]{c}[/]" for c in cells) if row.total else cells, end_section=row.total)
        console.print(table)
        for group in pp.phase.groups:
            console.print(f"  {group.label}: {group.detail}", highlight=False, soft_wrap=True)
        if pp.sync_line:
            console.print(f"  {pp.sync_line}", highlight=False, soft_wrap=True)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    for assumption in result.assumptions:
        console.print(f"assumed: {assumption}", highlight=False, soft_wrap=True)

