"""The Bradley-Terry RMs' report: each input mode's held-out accuracy with its 95% CI, the gain of each mode
over the RM that sees nothing about the user *paired over the same pairs*, the same for seen and cold-start users
apart when the shards say which users are which, and the world's reference accuracies beside them (markdown,
JSON, PNG)."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from pr_rlhf.eval.report import (
    PairOutcomes,
    accuracy_figure,
    correct_by_pair,
    fmt_accuracy_ci,
    fmt_paired_gain,
    normalize_references,
    paired_gain,
)
from pr_rlhf.report_files import ReportFiles, write_report_files
from pr_rlhf.shards import ShardReader
from pr_rlhf.stats import mean_ci

MODE_NAMES = {"none": "w/o profile", "profile": "w/ profile (top-k posts)", "plan": "w/ plan (planner rubric)",
              "history": "w/ history (top-k history pairs)"}
BASELINE = "none"


def user_groups(shards: str | Path, predictions: str | Path) -> dict[str, set[str]]:
    """"seen" / "cold-start" -> the evaluated pair ids of those users (the shards' profiles say who is which);
    empty when the shards mark no cold-start users."""
    cold = ShardReader(shards).cold_start_users()
    if not cold:
        return {}
    groups: dict[str, set[str]] = {"seen": set(), "cold-start": set()}
    for r in pq.read_table(predictions, columns=["pair_id", "user_id", "subset"]).to_pylist():
        groups["cold-start" if (r["user_id"], r["subset"]) in cold else "seen"].add(r["pair_id"])
    return {name: ids for name, ids in groups.items() if ids}


def _group_accuracy(correct: PairOutcomes, ids: set[str], seed: int) -> dict:
    pairs = sorted(ids & set(correct))
    values = np.array([correct[p] for p in pairs])
    low, high = mean_ci(values, seed=seed, clusters=[correct.user(p) for p in pairs])
    return {"n": int(values.size), "accuracy": float(values.mean()) if values.size else float("nan"),
            "ci_low": low, "ci_high": high}


def mode_rows(evals: Mapping[str, Mapping[str, Any]], seed: int = 0,
              groups: Mapping[str, set[str]] | None = None) -> list[dict]:
    """One row per mode from ``evals`` (mode -> {"summary": its pointwise eval summary, "predictions": path}),
    with ``vs_none``: the paired gain over mode ``none`` when it was trained, and per group of ``groups`` (name ->
    pair ids, e.g. :func:`user_groups`) the mode's accuracy and its paired gain on those pairs."""
    base = correct_by_pair(evals[BASELINE]["predictions"]) if BASELINE in evals else None
    rows = []
    for mode, result in evals.items():
        s = result["summary"]
        correct = correct_by_pair(result["predictions"])
        row = {"mode": mode, "n": s["n"], "accuracy": s["accuracy"], "ci_low": s["ci_low"], "ci_high": s["ci_high"],
               "failures": s["failures"], "model": result.get("model")}
        if base is not None and mode != BASELINE:
            row["vs_none"] = paired_gain(correct, base, seed)
        if groups:
            row["groups"] = {name: {**_group_accuracy(correct, ids, seed),
                                    **({"vs_none": paired_gain(correct, base, seed, only=ids)}
                                       if base is not None and mode != BASELINE else {})}
                             for name, ids in groups.items()}
        rows.append(row)
    return rows


def _gain(row: dict) -> str:
    return fmt_paired_gain(row.get("vs_none"), with_changed=True)


def markdown(rows: list[dict], references: Mapping[str, Any], title: str) -> str:
    groups = list(rows[0].get("groups", {})) if rows else []
    lines = [f"### {title}", "", "| scalar RM trained | pairs | accuracy % [95% CI] | vs w/o profile (paired) | "
             "failures |" + "".join(f" {g} users: accuracy (vs w/o profile) |" for g in groups),
             "|---|---|---|---|---|" + "---|" * len(groups)]
    for r in rows:
        cells = "".join(f" {fmt_accuracy_ci(g)} ({fmt_paired_gain(g.get('vs_none'))}), {g['n']} pairs |"
                        for g in (r["groups"][name] for name in groups))
        lines.append(f"| {MODE_NAMES.get(r['mode'], r['mode'])} | {r['n']} | {fmt_accuracy_ci(r)} | {_gain(r)} | "
                     f"{r['failures']} |{cells}")
    lines += ["", "95% CIs resample users (a user's pairs together), the paired gains too."]
    refs = normalize_references(references)
    if refs:
        lines += ["", "World references on the same shards: " + ", ".join(
            f"{ref.name} {100 * ref.accuracy:.1f}" for ref in refs) + "."]
    return "\n".join(lines) + "\n"


def write_rm_report(folder: str | Path, evals: Mapping[str, Mapping[str, Any]], references: Mapping[str, Any],
                    title: str = "Bradley-Terry reward models", seed: int = 0,
                    groups: Mapping[str, set[str]] | None = None) -> tuple[list[dict], ReportFiles]:
    """``report.md``, ``report.json`` and ``report.png`` in ``folder``; returns the rows and the files."""
    rows = mode_rows(evals, seed, groups)
    summaries = {f"pointwise/{mode}": result["summary"] for mode, result in evals.items()}
    files = write_report_files(folder, "report", markdown=markdown(rows, references, title),
                               data={"rows": rows, "references": references},
                               figure=accuracy_figure(summaries, references, title))
    return rows, files
