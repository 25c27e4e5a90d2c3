"""Reward models measured: `pr-rlhf eval` (every input mode on benchmark shards), `scaling` (a trained GenRM at test
time), `bon` (Best-of-N against a downstream judge) and `leaderboard` (the field's personalized reward models on the
same pairs)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from pr_rlhf.cli.prologue import AddressOpt, OverridesOpt, RecipeCommand, console, fail, open_recipe, out_option
from pr_rlhf.configs.recipe import Recipe

EVAL = RecipeCommand("eval", out_field="eval.out", headline=lambda r: f"{r.eval.shards} -> {r.eval.out}")
SCALING = RecipeCommand("scaling", ("scaling",), "recipes/scaling_grid.yaml", "scaling.out",
                        lambda r: f"{r.scaling.model} -> {r.scaling.out}")
BON = RecipeCommand("bon", ("bon",), "recipes/bon_sweep.yaml", "bon.out",
                    lambda r: f"n={r.bon.n}, {r.bon.prompts} prompts -> {r.bon.out}")
LEADERBOARD = RecipeCommand("leaderboard", ("leaderboard",), "recipes/leaderboard.yaml", "leaderboard.out",
                            lambda r: f"{', '.join([*r.leaderboard.methods, *r.leaderboard.bt_rows()])} on worlds "
                                      f"{r.leaderboard.worlds} -> {r.leaderboard.out}")


def eval_cmd(recipe: Path = typer.Argument(..., help="recipe YAML with an eval: section"),
             overrides: Optional[List[str]] = OverridesOpt,
             out: Optional[Path] = out_option("run directory (eval.out)")) -> None:
    """Evaluate reward models on benchmark shards: pointwise and pairwise, w/o profile, w/ profile, w/ plan."""
    run_eval_stage(open_recipe(EVAL, recipe, overrides, out=out))


def run_eval_stage(recipe: Recipe):
    from pr_rlhf.eval.runner import EvalError, run_eval
    from pr_rlhf.shards import ShardError

    try:
        result = run_eval(recipe, on_stage=lambda s: console.print(f"[bold cyan]>[/] {s}", highlight=False))
    except (EvalError, ShardError) as exc:
        fail(str(exc))
    print_eval_table(result.report.summaries, title=f"{recipe.name}: {result.n_pairs} pairs")
    if result.model_rows:
        print_models_table(result.model_rows, recipe.eval.label, title=f"{recipe.name}: every model, same pairs")
    console.print(f"[green]wrote[/] {', '.join(str(p) for p in result.report.paths)} (full table: "
                  f"{result.report.markdown})")
    return result


def print_eval_table(summaries: dict, title: str) -> None:
    """The headline columns of the eval report; the markdown file has every column."""
    table = Table(title=title)
    for col, justify in (("mode/inputs", "left"), ("n", "right"), ("accuracy [95% CI]", "right"),
                         ("ties", "right"), ("failures", "right"), ("bias", "right")):
        table.add_column(col, justify=justify)
    for group, s in summaries.items():
        bias = "-" if s.get("position_bias") is None else f"{100 * s['position_bias']:.1f}"
        table.add_row(group, str(s["n"]), f"{100 * s['accuracy']:.1f} [{100 * s['ci_low']:.1f}, "
                      f"{100 * s['ci_high']:.1f}]", str(s["ties"]), str(s["failures"]), bias)
    console.print(table)


def print_models_table(rows: list[dict], floor: str, title: str) -> None:
    """eval.models' cells beside the section's own (pr_rlhf.eval.models.model_rows)."""
    from pr_rlhf.eval.report import fmt_paired_gain

    table = Table(title=title)
    for col, justify in (("model", "left"), ("mode/inputs", "left"), ("n", "right"),
                         ("accuracy [95% CI]", "right"), ("unparsed", "right"),
                         (f"vs {floor}, paired (unparsed = coin flip)", "right")):
        table.add_column(col, justify=justify, no_wrap=col in ("model", "mode/inputs"))
    for r in rows:
        s = r["summary"]
        table.add_row(r["model"], r["cell"], str(s["n"]), f"{100 * s['accuracy']:.1f} [{100 * s['ci_low']:.1f}, "
                      f"{100 * s['ci_high']:.1f}]", str(s["failures"]), fmt_paired_gain(r.get("vs_floor")))
    console.print(table)



def scaling(recipe: Path = typer.Argument(..., help="recipe YAML with a scaling: section"),
            overrides: Optional[List[str]] = OverridesOpt,
            out: Optional[Path] = out_option("run directory (scaling.out)"),
            address: Optional[str] = AddressOpt):
    """Test-time user-based scaling: accuracy of a trained GenRM at every (m chains, n neighbours) of the grid on
    seen and cold-start users, with the user prototypes built (or loaded) on the way."""
    run_scaling_stage(open_recipe(SCALING, recipe, overrides, out=out), address)


def run_scaling_stage(recipe: Recipe, address: Optional[str] = None) -> dict:
    from workers.scaling import run_scaling

    cfg = recipe.scaling
    if not Path(cfg.model).is_dir():
        fail(f"scaling.model {cfg.model!r} is not a model directory: train one with `pr-rlhf pgenrm "
             "recipes/pgenrm_pipeline.yaml`, or point scaling.model at a local GenRM")
    result = run_scaling(recipe, address, log=console.print)
    console.print(Path(result["markdown"]).read_text(), highlight=False)
    console.print(f"written: {result['markdown']}, {result['figure']}", highlight=False)
    return result


def bon(recipe: Path = typer.Argument(..., help="recipe YAML with a bon: section"),
        overrides: Optional[List[str]] = OverridesOpt,
        out: Optional[Path] = out_option("run directory (default: bon.out)"),
        address: Optional[str] = AddressOpt):
    """Best-of-N sweep: one pool of N samples per prompt, scored once by each reward model and the downstream
    judge; best-of-k curves for every k, the benchmark-validity report (resumes a killed sweep)."""
    run_bon_stage(open_recipe(BON, recipe, overrides, out=out), address)


def run_bon_stage(recipe: Recipe, address: Optional[str] = None) -> dict:
    from workers.bon import run_bon

    cfg = recipe.bon
    report = run_bon(recipe, address, log=lambda m: console.print(m, highlight=False))
    console.print(Path(cfg.out, "bon.md").read_text(), highlight=False)
    if "validity" in report:
        console.print(f"benchmark validity: {report['validity']}", highlight=False)
    return report


def leaderboard(recipe: Path = typer.Argument(..., help="recipe YAML with a leaderboard: section"),
                overrides: Optional[List[str]] = OverridesOpt,
                out: Optional[Path] = out_option("run directory (default: leaderboard.out)"),
                address: Optional[str] = AddressOpt):
    """The field's personalized reward models (global BT, PAL, LoRe, VPL, GPO on frozen embeddings; fine-tuned BT
    RMs on the learner) trained on the same pairs and evaluated on the same pairs as the world's references and
    reused results (P-GenRM's): accuracy with user-resampled CIs, seen and cold-start users, paired differences, per
    world and pooled (resumes)."""
    rec = open_recipe(LEADERBOARD, recipe, overrides, out=out)
    from workers.leaderboard import run_leaderboard

    result = run_leaderboard(rec, address, log=lambda m: console.print(m, highlight=False))
    for name in ("leaderboard", "development"):
        if name in result:
            console.print(Path(rec.leaderboard.out, f"{name}.md").read_text(), highlight=False)
