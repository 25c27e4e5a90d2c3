"""The report of an RL sweep (``pr-rlhf rl-sweep``): one RL run per reward arm, all on the same prompts, steps and
seed, compared on one downstream judge. Per arm: the downstream value of its policy's held-out answers at the last
evaluation (95% bootstrap CI resampling users), its paired difference from the baseline arm, overall and per
population-agreement group (:func:`pr_rlhf.rl.compare.compare_runs`), its rise from step 0, and the benchmark
accuracy of its reward (for the validity table, written by the caller)."""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pr_rlhf.report_files import ReportFiles, new_figure, write_report_files
from pr_rlhf.rl.compare import DOWNSTREAM, agreement_groups, compare_runs, heldout_users
from pr_rlhf.stats import mean_ci, paired_difference_ci


def arm_row(run_dir: Path, baseline_dir: Path, groups: dict[str, list[int]] | None, seed: int = 0) -> dict[str, Any]:
    """One arm's downstream mean [CI], rise since step 0 and paired difference from the baseline (per agreement
    group: ``groups``, the same held-out prompts for every arm)."""
    evals = json.loads((run_dir / "history.json").read_text())["evals"]
    if not evals:
        raise KeyError(f"{run_dir}/history.json: no held-out evaluation")
    first, last = evals[0], evals[-1]
    if DOWNSTREAM not in last:
        raise KeyError(f"{run_dir}/history.json: no downstream values (the sweep needs train.downstream)")
    values = np.asarray(last[DOWNSTREAM], dtype=float)
    users = heldout_users(run_dir, len(values))
    low, high = mean_ci(values, seed=seed, clusters=users)
    rise, rise_low, rise_high = paired_difference_ci(values, np.asarray(first[DOWNSTREAM], dtype=float),
                                                     clusters=users, seed=seed)
    row: dict[str, Any] = {"run": str(run_dir), "step": last["step"], "prompts": len(values),
                           "downstream": float(values.mean()), "ci_low": low, "ci_high": high,
                           "rise": {"gain": rise, "ci_low": rise_low, "ci_high": rise_high}}
    if run_dir != baseline_dir:
        row["vs_baseline"] = compare_runs(run_dir, baseline_dir, seed, groups=groups or {})
    return row


def sweep_rows(out: Path, arms: list[str], baseline: str, benchmark: Mapping[str, float],
               seed: int = 0) -> dict[str, dict[str, Any]]:
    groups = agreement_groups(out / baseline)   # one world build for the whole sweep
    rows = {name: arm_row(out / name, out / baseline, groups, seed) for name in arms}
    for name, row in rows.items():
        row["benchmark_accuracy"] = benchmark.get(name)
    return rows


def _ci(g: Mapping[str, float], digits: int = 3) -> str:
    return f"{g['gain']:+.{digits}f} [{g['ci_low']:+.{digits}f}, {g['ci_high']:+.{digits}f}]"


def _plot(rows: Mapping[str, dict], baseline: str) -> Any:
    figure = new_figure(figsize=(8.0, 3.6))
    left, right = figure.subplots(1, 2)
    names = list(rows)
    y = np.arange(len(names))
    means = [rows[n]["downstream"] for n in names]
    err = np.array([[rows[n]["downstream"] - rows[n]["ci_low"] for n in names],
                    [rows[n]["ci_high"] - rows[n]["downstream"] for n in names]])
    left.barh(y, means, xerr=err, color="tab:blue", alpha=0.8)
    left.set_yticks(y, names)
    left.set_xlabel("downstream (train.downstream on held-out users)")
    left.invert_yaxis()
    others = [n for n in names if n != baseline]
    width = 0.38
    for k, (group, colour) in enumerate((("agree", "tab:green"), ("disagree", "tab:red"))):
        gains = [rows[n]["vs_baseline"]["groups"].get(group, {}) for n in others]
        pos = np.arange(len(others)) + (k - 0.5) * width
        vals = [g.get("gain", math.nan) for g in gains]
        errs = np.array([[g.get("gain", 0) - g.get("ci_low", 0) for g in gains],
                         [g.get("ci_high", 0) - g.get("gain", 0) for g in gains]])
        right.barh(pos, vals, height=width, xerr=errs, color=colour, alpha=0.8, label=f"users who {group}")
    right.axvline(0.0, color="black", lw=0.8)
    right.set_yticks(np.arange(len(others)), others)
    right.invert_yaxis()
    right.set_xlabel(f"paired gain over {baseline}")
    right.legend(fontsize=7, title="with the population's taste", title_fontsize=7)
    figure.tight_layout()
    return figure


def write_sweep_report(out: Path, rows: Mapping[str, dict], baseline: str, title: str,
                       extra: Mapping[str, Any] | None = None) -> ReportFiles:
    """sweep.md / sweep.json / sweep.png in ``out``."""
    any_row = next(iter(rows.values()))
    lines = [f"## {title}", "",
             f"Downstream = the downstream judge's score (`train.downstream`) of the policy's answers to held-out "
             f"users at the last evaluation (step {any_row['step']}), mean over {any_row['prompts']} held-out "
             f"prompts [95% bootstrap CI resampling users]; gains are paired over the same prompts against "
             f"`{baseline}`; users who agree / disagree: cosine of their "
             "weights with the population's preference above / at most 0.", "",
             "| arm | benchmark acc. | downstream | rise since step 0 | vs baseline | users who agree | "
             "users who disagree |", "|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        acc = row.get("benchmark_accuracy")
        vs = row.get("vs_baseline")
        groups = (vs or {}).get("groups", {})
        cells = [name, "-" if acc is None else f"{100 * acc:.1f}",
                 f"{row['downstream']:+.3f} [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]", _ci(row["rise"]),
                 "(baseline)" if vs is None else _ci(vs)]
        cells += ["-" if g not in groups else f"{_ci(groups[g])} (n={groups[g]['prompts']})"
                  for g in ("agree", "disagree")]
        lines.append("| " + " | ".join(cells) + " |")
    return write_report_files(out, "sweep", markdown="\n".join(lines) + "\n",
                              data={"baseline": baseline, "arms": dict(rows), **(extra or {})},
                              figure=_plot(rows, baseline))
