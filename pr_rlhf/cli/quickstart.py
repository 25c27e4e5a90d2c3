"""`pr-rlhf quickstart`: the main job on the embedded default, each stage run and shown as its own command does."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from pr_rlhf.cli.data import run_data_stage
from pr_rlhf.cli.evaluation import BON, EVAL, SCALING, run_bon_stage, run_eval_stage, run_scaling_stage
from pr_rlhf.cli.pgenrm import PGENRM, run_pgenrm_stage
from pr_rlhf.cli.prologue import OverridesOpt, console, fail
from pr_rlhf.cli.training import TRAIN, run_train_stage
from pr_rlhf.configs.recipe import RecipeError


def quickstart(out: Path = typer.Option(Path("runs/quickstart"), "--out", "-o", help="run directory"),
               recipe: Path = typer.Option(Path("recipes/quickstart.yaml"), "--recipe", "-r"),
               overrides: Optional[List[str]] = OverridesOpt) -> None:
    """The main job on the embedded default (local Ray, CPU, no network): the synthetic world's shards, every
    reward-model evaluation mode, the P-GenRM stages (briefly), test-time scaling and Best-of-N with the shipped
    P-GenRM, GRPO with personalized rewards; a summary table, plots and mlflow runs under --out."""
    from pr_rlhf.tracking import ENV_URI
    from workers.quickstart import StageRunners, quickstart_recipe, run_quickstart

    try:   # the stages' folders are placed under --out by the quickstart, not by one section's field
        resolved = quickstart_recipe(recipe, out, list(overrides or []))
    except RecipeError as exc:
        fail(str(exc))
        raise
    summary = run_quickstart(resolved, out, StageRunners(
        rule=console.rule, data=run_data_stage, eval=EVAL.announced(run_eval_stage),
        pgenrm=PGENRM.announced(run_pgenrm_stage), scaling=SCALING.announced(run_scaling_stage),
        bon=BON.announced(run_bon_stage), train=TRAIN.announced(run_train_stage)))
    table = Table(title=f"quickstart summary ({summary.minutes:.1f} min, peak RSS {summary.peak_rss_gb:.2f} GB over "
                        f"the process tree)")
    for col in ("stage", "result", "minutes"):
        table.add_column(col)
    for stage in summary.stages:
        table.add_row(stage.stage, stage.result, f"{stage.seconds / 60:.1f}")
    console.rule("[bold green]done")
    console.print(table)
    console.print(f"everything under {out}/ (summary.json; reports and plots per stage; every stage's mlflow run "
                  f"in {resolved.tracking.mlflow_uri or '$' + ENV_URI})", highlight=False)
