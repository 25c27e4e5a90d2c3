"""P-GenRM on Ray: `pr-rlhf pgenrm` (PSI -> CRE -> curriculum, each stage evaluated, then the ablation report) and
`headroom` (what RL on the GenRM could gain, checked before it runs)."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from pr_rlhf.cli.prologue import AddressOpt, OverridesOpt, RecipeCommand, console, fail, open_recipe, out_option
from pr_rlhf.configs.recipe import Recipe


def _stages_headline(stages: Optional[List[str]]) -> Callable[[Recipe], str]:
    """The banner's "what -> where": the stages to run (default: the recipe's), and the run directory."""
    return lambda r: f"{' -> '.join(stages or r.pgenrm.stages)} -> {r.pgenrm.out}"


PGENRM = RecipeCommand("pgenrm", ("pgenrm",), out_field="pgenrm.out", headline=_stages_headline(None))
HEADROOM = RecipeCommand("headroom", ("pgenrm",), out_field="pgenrm.out")


def pgenrm(recipe: Path = typer.Argument(..., help="recipe YAML with a pgenrm: section"),
           stage: Optional[List[str]] = typer.Option(None, "--stage", help="run only this stage (repeatable): base, "
                                                     "psi, cre, curriculum, control, cre_no_pr, "
                                                     "cre_no_or, planner"),
           overrides: Optional[List[str]] = OverridesOpt,
           out: Optional[Path] = out_option("run directory (pgenrm.out)"),
           address: Optional[str] = AddressOpt) -> None:
    """Train P-GenRM on Ray: PSI (SFT on oracle chains) -> CRE (GRPO, process + outcome reward) -> hard-negative
    curriculum, each stage evaluated by `pr-rlhf eval` on seen and cold-start users; then the ablation report."""
    from pr_rlhf.configs.pgenrm import STAGE_PARENT

    stages = list(stage or []) or None
    for s in stages or []:
        if s not in STAGE_PARENT:
            fail(f"--stage {s!r}: expected one of {', '.join(STAGE_PARENT)}")
    resolved = open_recipe(PGENRM, recipe, overrides, out=out, headline=_stages_headline(stages))
    run_pgenrm_stage(resolved, stages, address)


def headroom(recipe: Path = typer.Argument(..., help="recipe YAML with a pgenrm: section"),
             model: Optional[Path] = typer.Option(None, "--model", help="also measure this trained GenRM (default: "
                                                  "the run's PSI model when that stage is complete)"),
             overrides: Optional[List[str]] = OverridesOpt,
             out: Optional[Path] = out_option("the P-GenRM run directory (pgenrm.out): headroom.json goes there, "
                                              "and its PSI model is the default --model")) -> None:
    """The headroom check before RL on the GenRM: on the evaluation pairs, the teacher's expected accuracy vs the
    best rule available from the student's inputs vs the Bayes oracle, per design, and the gate's verdict; on a
    trained model greedy, maj@k, pass@k, mixed decisions and the entropy at the decision token. Writes
    <pgenrm.out>/headroom.json (and headroom_model.json with a model)."""
    resolved = open_recipe(HEADROOM, recipe, overrides, out=out)
    from pr_rlhf.files import atomic_write_text, is_complete
    from pr_rlhf.pgenrm.headroom import headroom_markdown, pipeline_headroom, sampled_model_headroom
    from pr_rlhf.world.generator import build_world

    cfg = resolved.pgenrm
    if cfg.shards_world() is None:
        fail(f"{recipe}: headroom needs the synthetic world (pgenrm.psi.source: world); real data "
             f"(psi.source: {cfg.psi.source}) has no Bayes oracle to compare the teacher with")
    world = build_world(cfg.world)
    offline = pipeline_headroom(cfg, resolved.seed, world)
    run_dir = Path(cfg.out)
    atomic_write_text(run_dir / "headroom.json", json.dumps(offline, indent=1))
    psi_model = run_dir / "psi" / "model"
    model_dir = model or (psi_model if is_complete(run_dir / "psi") else None)
    measured = None
    if model_dir is not None:
        if not (Path(model_dir) / "config.json").is_file():
            fail(f"--model {model_dir}: not a model directory (no config.json)")
        console.print(f"sampling {cfg.headroom.prompts} prompts x {cfg.headroom.k} chains of {model_dir} ...")
        measured = sampled_model_headroom(str(model_dir), world, cfg, resolved.seed)
        atomic_write_text(run_dir / "headroom_model.json",
                          json.dumps({"model": str(model_dir), **measured}, indent=1))
    typer.echo(headroom_markdown(offline, measured))


def run_pgenrm_stage(recipe: Recipe, stages: Optional[List[str]] = None, address: Optional[str] = None):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from workers.pgenrm import HeadroomGateError, StageOrderError, run_pgenrm

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}"), console=console, transient=False) as progress:
        bars: dict[str, int] = {}

        def on_step(stage: str, done: int, total: int, m: dict) -> None:
            if stage not in bars:
                bars[stage] = progress.add_task(stage, total=total, info="")
            if "reward/mean" in m:
                info = (f"reward {m['reward/mean']:+.3f}  outcome {m['reward/outcome']:.2f}  "
                        f"process {m['reward/process']:.2f}  parsed {m['reward/parse_rate']:.0%}")
            else:
                info = f"nll {m.get('sft/nll', float('nan')):.3f}  lr {m.get('sft/lr', 0):.1e}"
            progress.update(bars[stage], completed=done, info=info)
            if not console.is_terminal and (done % max(1, total // 10) == 0 or done == total):
                progress.console.print(f"{stage} {done}/{total}  {info}", highlight=False)  # logs of ray jobs

        try:
            results, report = run_pgenrm(recipe, stages, address, on_step=on_step,
                                         on_event=lambda msg: progress.console.print(msg), log=console.print)
        except (StageOrderError, HeadroomGateError) as exc:
            fail(str(exc))
            raise
    print_pgenrm_table(results)
    if report is not None:
        console.print(f"ablation report: {report.markdown}, {report.figure}", highlight=False)
    return results


def print_pgenrm_table(results: dict) -> None:
    """Each stage's accuracies on seen, hard and cold-start pairs (the planner's aspect precision and recall)."""
    table = Table(title="P-GenRM stages (pairwise accuracy %, 95% CI)")
    for col in ("stage", "seen users", "hard pairs", "cold-start users", "unparsed seen / cold", "ties seen / cold",
                "minutes"):
        table.add_column(col)
    for name, r in results.items():
        if "planner" in r:
            for model, m in r["planner"].items():
                console.print(f"planner ({model}): aspect precision {m['precision']['mean']:.2f} "
                              f"[{m['precision']['ci_low']:.2f}, {m['precision']['ci_high']:.2f}], recall "
                              f"{m['recall']['mean']:.2f} [{m['recall']['ci_low']:.2f}, {m['recall']['ci_high']:.2f}] "
                              f"on {m['queries']} held-out queries; {m['parse_failures']} unparsed", highlight=False)
            continue
        seen, cold = r["seen"]["summary"], r["cold"]["summary"]
        hard = r["seen"].get("hardness", {}).get("hard", {})
        table.add_row(name, f"{100 * seen['accuracy']:.1f} [{100 * seen['ci_low']:.1f}, {100 * seen['ci_high']:.1f}]",
                      f"{100 * hard.get('accuracy', float('nan')):.1f}",
                      f"{100 * cold['accuracy']:.1f} [{100 * cold['ci_low']:.1f}, {100 * cold['ci_high']:.1f}]",
                      f"{seen['failures']} / {cold['failures']}", f"{seen.get('ties', 0)} / {cold.get('ties', 0)}",
                      f"{r['seconds'] / 60:.1f}")
    if table.row_count:   # a planner-only run has no GenRM stage rows
        console.print(table)

