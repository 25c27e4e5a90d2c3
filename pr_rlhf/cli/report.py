"""`pr-rlhf report correlation | ablation | compare-rl | compare`: reports from finished runs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from pr_rlhf.cli.prologue import console, fail


def report_correlation(
        runs: List[Path] = typer.Argument(..., help="`pr-rlhf bon` output directories (bon.out) or bon.json files"),
        extra: Optional[List[Path]] = typer.Option(None, help="JSON {column: {reward model: downstream value}}, "
                                                              "e.g. each RM's GRPO/PPO final gold reward"),
        out: Optional[Path] = typer.Option(None, help="where correlation.md/.json/.png go (default: the first run)")
) -> None:
    """Benchmark validity: Spearman rho and NDCG between the RMs' benchmark accuracy and their downstream quality
    (best-of-k at every k of each sweep, plus any extra columns)."""
    from pr_rlhf.bon.correlation import correlation_report, load_bon, write_correlation_report

    try:
        bons = [load_bon(r) for r in runs]
        columns: dict = {}
        for path in extra or []:
            columns.update(json.loads(Path(path).read_text()))
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
        raise
    report = correlation_report(bons, columns, labels=[Path(r).name for r in runs])
    folder = out or (runs[0] if Path(runs[0]).is_dir() else Path(runs[0]).parent)
    md = write_correlation_report(report, folder)
    console.print(md.read_text(), highlight=False)
    console.print(f"written: {md}, {md.with_suffix('.json')}, {md.with_suffix('.png')}", highlight=False)


def report_ablation(run_dir: Path = typer.Argument(..., help="a `pr-rlhf pgenrm` run directory (pgenrm.out)"),
                    seed: int = typer.Option(0, help="bootstrap seed")) -> None:
    """The P-GenRM ablation table (full; w/o curriculum; w/o PR; w/o OR; w/o RL; base) as markdown + PNG."""
    from pr_rlhf.pgenrm.report import write_ablation_report

    try:
        report = write_ablation_report(run_dir, title=f"{run_dir}: P-GenRM ablation", seed=seed)
    except FileNotFoundError as exc:
        fail(str(exc))
        raise
    console.print(report.markdown.read_text(), highlight=False)
    console.print(f"written: {report.markdown}, {report.figure}, {report.json}", highlight=False)


def report_compare_rl(new: Path = typer.Argument(..., help="a finished `pr-rlhf train` run directory"),
                      old: Path = typer.Argument(..., help="the run it is compared with (same held-out prompts)"),
                      seed: int = typer.Option(0, help="bootstrap seed")) -> None:
    """Paired difference of two RL runs' last held-out evaluations over the same prompts (95% bootstrap CI): on
    the downstream scorer (train.downstream) when both have it, else on their own rewards."""
    from pr_rlhf.rl.compare import compare_runs

    try:
        row = compare_runs(new, old, seed)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        fail(str(exc))
        raise
    console.print(f"{row['measure']} on {row['prompts']} held-out prompts: {row['new_mean']:.4f} (step "
                  f"{row['new_step']}) vs {row['old_mean']:.4f} (step {row['old_step']}): {row['gain']:+.4f} "
                  f"[95% CI {row['ci_low']:+.4f}, {row['ci_high']:+.4f}]", highlight=False)
    console.print(json.dumps(row, indent=1), highlight=False, soft_wrap=True)


def report_compare(new: Path = typer.Argument(..., help="a finished stage directory, e.g. runs/pgenrm_b/cre"),
                   old: Path = typer.Argument(..., help="the stage it is compared with, e.g. runs/pgenrm/psi"),
                   contested: Optional[Path] = typer.Option(
                       None, help="contested.json splitting the pairs (default: the one beside OLD, if any)"),
                   seed: int = typer.Option(0, help="bootstrap seed")) -> None:
    """Paired gain of one P-GenRM stage over another on the same held-out pairs (95% bootstrap CI, changed
    verdicts), on all pairs and on contested / other pairs; the stages may come from different runs."""
    from pr_rlhf.pgenrm.report import compare_stage_dirs, comparisons_markdown, contested_split, type_choice_markdown

    if contested is not None and not contested.is_file():
        fail(f"{contested}: no such file")
    split = contested_split(contested or old.parent)
    try:
        row = compare_stage_dirs(new, old, split, seed, with_type_choice=True)
    except (FileNotFoundError, KeyError) as exc:
        fail(str(exc))
        raise
    console.print(comparisons_markdown([row]), highlight=False, soft_wrap=True)
    console.print("How each vote chain chose Type among the latest pair's candidates"
                  + (" (contested pairs):" if split else ":"), highlight=False)
    console.print(type_choice_markdown(row), highlight=False, soft_wrap=True)
    console.print(json.dumps(row, indent=1), highlight=False, soft_wrap=True)

