"""The Bradley-Terry RMs' report: each input mode's held-out accuracy with its 95% CI, the gain of each mode
over the RM that sees nothing about the user *paired over the same pairs*, and the world's reference accuracies
beside them (markdown, JSON, PNG)."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pr_rlhf.eval.report import (
    accuracy_figure,
    correct_by_pair,
    fmt_accuracy_ci,
    fmt_paired_gain,
    normalize_references,
    paired_gain,
)
from pr_rlhf.report_files import ReportFiles, write_report_files

MODE_NAMES = {"none": "w/o profile", "profile": "w/ profile (top-k posts)", "plan": "w/ plan (planner rubric)"}
BASELINE = "none"


def mode_rows(evals: Mapping[str, Mapping[str, Any]], seed: int = 0) -> list[dict]:
    """One row per mode from ``evals`` (mode -> {"summary": its pointwise eval summary, "predictions": path}),
    with ``vs_none``: the paired gain over mode ``none`` when it was trained."""
    base = correct_by_pair(evals[BASELINE]["predictions"]) if BASELINE in evals else None
    rows = []
    for mode, result in evals.items():
        s = result["summary"]
        row = {"mode": mode, "n": s["n"], "accuracy": s["accuracy"], "ci_low": s["ci_low"], "ci_high": s["ci_high"],
               "failures": s["failures"], "model": result.get("model")}
        if base is not None and mode != BASELINE:
            row["vs_none"] = paired_gain(correct_by_pair(result["predictions"]), base, seed)
        rows.append(row)
    return rows


def _gain(row: dict) -> str:
    return fmt_paired_gain(row.get("vs_none"), with_changed=True)


def markdown(rows: list[dict], references: Mapping[str, Any], title: str) -> str:
    lines = [f"### {title}", "", "| scalar RM trained | pairs | accuracy % [95% CI] | vs w/o profile (paired) | "
             "failures |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {MODE_NAMES.get(r['mode'], r['mode'])} | {r['n']} | {fmt_accuracy_ci(r)} | {_gain(r)} | "
                     f"{r['failures']} |")
    refs = normalize_references(references)
    if refs:
        lines += ["", "World references on the same shards: " + ", ".join(
            f"{ref.name} {100 * ref.accuracy:.1f}" for ref in refs) + "."]
    return "\n".join(lines) + "\n"


def write_rm_report(folder: str | Path, evals: Mapping[str, Mapping[str, Any]], references: Mapping[str, Any],
                    title: str = "Bradley-Terry reward models", seed: int = 0) -> tuple[list[dict], ReportFiles]:
    """``report.md``, ``report.json`` and ``report.png`` in ``folder``; returns the rows and the files."""
    rows = mode_rows(evals, seed)
    summaries = {f"pointwise/{mode}": result["summary"] for mode, result in evals.items()}
    files = write_report_files(folder, "report", markdown=markdown(rows, references, title),
                               data={"rows": rows, "references": references},
                               figure=accuracy_figure(summaries, references, title))
    return rows, files
