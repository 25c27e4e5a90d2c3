"""Evaluation reports: predictions parquet, metrics JSON, a markdown table and an accuracy bar chart.

:func:`write_report` writes everything for one evaluation into a run directory::

    <run_dir>/predictions.parquet   one row per verdict (the Prediction fields)
    <run_dir>/metrics.json          {"groups": {"mode/inputs": summary}, "references": {...}, ...}
    <run_dir>/report.md             rows = (mode, inputs); accuracy [95% CI], ties, failures, acc A / acc B,
                                    position bias, per-subset accuracies, macro averages, consistency
    <run_dir>/accuracy.png          accuracy with CI error bars per (mode, inputs) next to reference lines

Reference lines (e.g. the synthetic world's oracle / logistic regression / chance) are passed in as a mapping
name -> accuracy, where the accuracy is a float, an (accuracy, ci_low, ci_high) tuple, a dict with those keys,
or any object with those attributes (``pr_rlhf.world.reference.Estimate``).

Every file is written atomically through ``pr_rlhf.report_files`` (figures on the Agg canvas, outside pyplot).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pr_rlhf.eval.metrics import Prediction, flatten_summary, group_key, summarize_groups
from pr_rlhf.files import atomic_write, atomic_write_text
from pr_rlhf.report_files import new_figure, save_figure, write_json
from pr_rlhf.stats import paired_difference_ci

PREDICTIONS_FILE = "predictions.parquet"
METRICS_FILE = "metrics.json"
MARKDOWN_FILE = "report.md"
FIGURE_FILE = "accuracy.png"

PREDICTION_SCHEMA = pa.schema([
    ("pair_id", pa.string()),
    ("user_id", pa.string()),
    ("subset", pa.string()),
    ("mode", pa.string()),
    ("inputs", pa.string()),
    ("correct", pa.bool_()),
    ("tie", pa.bool_()),
    ("error", pa.string()),
    ("order", pa.int8()),
    ("chosen_slot", pa.string()),
    ("predicted", pa.string()),
    ("score_chosen", pa.float64()),
    ("score_rejected", pa.float64()),
    ("raw", pa.string()),
])


# --------------------------------------------------------------------------------------------------------------
# Predictions
# --------------------------------------------------------------------------------------------------------------

def predictions_table(preds: Iterable[Prediction]) -> pa.Table:
    rows = [p.as_dict() for p in preds]
    return pa.Table.from_pylist(rows, schema=PREDICTION_SCHEMA)


def write_predictions(preds: Iterable[Prediction], path: str | Path) -> Path:
    table = predictions_table(preds)
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))


def read_predictions(path: str | Path) -> list[Prediction]:
    """Read a predictions parquet back into validated :class:`Prediction` records."""
    return [Prediction.from_dict(row) for row in pq.read_table(path).to_pylist()]


class PairOutcomes(Mapping[str, float]):
    """pair id -> 1.0 / 0.0 (a pair's last verdict), with each pair's user: the unit every CI resamples. Reads as
    the plain mapping of outcomes; ``user(pair_id)`` names the cluster."""

    def __init__(self, correct: Mapping[str, float], users: Mapping[str, str]):
        missing = [p for p in correct if p not in users]
        if missing:
            raise ValueError(f"pair outcomes without a user: {missing[:5]}")
        self._correct, self._users = dict(correct), {p: str(users[p]) for p in correct}

    def __getitem__(self, pair_id: str) -> float:
        return self._correct[pair_id]

    def __iter__(self):
        return iter(self._correct)

    def __len__(self) -> int:
        return len(self._correct)

    def user(self, pair_id: str) -> str:
        return self._users[pair_id]

    @property
    def users(self) -> dict[str, str]:
        return dict(self._users)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], unresolved: float | None = None) -> PairOutcomes:
        """From prediction rows (``pair_id``, ``user_id``, ``correct``; a later verdict of a pair wins).
        ``unresolved``: the outcome of a failure or a tie (rows with ``error`` / ``tie``), e.g. 0.5 to score them
        as coin flips; None counts them wrong, as ``correct`` does."""
        correct, users = {}, {}
        for r in rows:
            undecided = unresolved is not None and (r.get("error") is not None or r.get("tie"))
            correct[r["pair_id"]] = unresolved if undecided else float(r["correct"])
            users[r["pair_id"]] = r["user_id"]
        return cls(correct, users)


def correct_by_cell(predictions: str | Path, unresolved: float | None = None) -> dict[str, PairOutcomes]:
    """(mode/inputs) -> :class:`PairOutcomes` from an eval's predictions parquet (a pair's last verdict;
    ``unresolved`` as in :meth:`PairOutcomes.from_rows`)."""
    rows: dict[str, list[dict]] = {}
    columns = ["mode", "inputs", "pair_id", "user_id", "correct", "tie", "error"]
    for r in pq.read_table(predictions, columns=columns).to_pylist():
        rows.setdefault(group_key(r["mode"], r["inputs"]), []).append(r)
    return {cell: PairOutcomes.from_rows(cell_rows, unresolved) for cell, cell_rows in rows.items()}


def correct_by_pair(predictions: str | Path) -> PairOutcomes:
    """:class:`PairOutcomes` from an eval's predictions parquet of one cell (one verdict per pair);
    :func:`correct_by_cell` for a file of several cells."""
    return PairOutcomes.from_rows(pq.read_table(predictions, columns=["pair_id", "user_id", "correct"]).to_pylist())


def paired_gain(new: PairOutcomes, old: PairOutcomes, seed: int = 0,
                only: set[str] | None = None) -> dict[str, float]:
    """Mean over the shared pairs (those in ``only`` when given) of (new correct - old correct), with a 95%
    bootstrap CI resampling users (a user's pairs together), the number of pairs whose verdict changed and the
    number of users they sit in."""
    shared = sorted((set(new) & set(old)) if only is None else (set(new) & set(old) & only))
    if not shared:
        return {"gain": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"), "pairs": 0, "users": 0,
                "changed": 0, "changed_users": 0}
    clash = [p for p in shared if new.user(p) != old.user(p)]
    if clash:
        raise ValueError(f"paired_gain: pair {clash[0]!r} belongs to user {new.user(clash[0])!r} in one result "
                         f"and {old.user(clash[0])!r} in the other: not the same pairs")
    users = [new.user(p) for p in shared]
    gain, low, high = paired_difference_ci(np.array([new[p] for p in shared]), np.array([old[p] for p in shared]),
                                           clusters=users, seed=seed)
    changed = [p for p in shared if new[p] != old[p]]
    return {"gain": gain, "ci_low": low, "ci_high": high, "pairs": len(shared), "users": len(set(users)),
            "changed": len(changed), "changed_users": len({new.user(p) for p in changed})}


def fmt_paired_gain(g: Mapping[str, Any] | None, with_changed: bool = False) -> str:
    """A :func:`paired_gain` in points, ``+4.1 [+1.4, +6.4]`` (and its changed verdicts); '-' for none."""
    if not g:
        return "-"
    text = f"{100 * g['gain']:+.1f} [{100 * g['ci_low']:+.1f}, {100 * g['ci_high']:+.1f}]"
    return f"{text} ({g['changed']} changed)" if with_changed else text


# --------------------------------------------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reference:
    name: str
    accuracy: float
    ci_low: float | None = None
    ci_high: float | None = None

    def as_dict(self) -> dict:
        return {"accuracy": self.accuracy, "ci_low": self.ci_low, "ci_high": self.ci_high}


def normalize_references(references: Mapping[str, Any] | None) -> list[Reference]:
    """name -> float | (acc, lo, hi) | {"accuracy", "ci_low", "ci_high"} | object with those attributes."""
    out = []
    for name, value in (references or {}).items():
        if isinstance(value, Reference):
            out.append(Reference(str(name), value.accuracy, value.ci_low, value.ci_high))
        elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            out.append(Reference(str(name), float(value)))
        elif isinstance(value, (tuple, list)) and len(value) == 3:
            out.append(Reference(str(name), float(value[0]), _opt(value[1]), _opt(value[2])))
        elif isinstance(value, Mapping) and "accuracy" in value:
            out.append(Reference(str(name), float(value["accuracy"]), _opt(value.get("ci_low")),
                                 _opt(value.get("ci_high"))))
        elif hasattr(value, "accuracy"):
            out.append(Reference(str(name), float(value.accuracy), _opt(getattr(value, "ci_low", None)),
                                 _opt(getattr(value, "ci_high", None))))
        else:
            raise TypeError(f"reference {name!r}: cannot read an accuracy from {type(value).__name__}")
    return out


def _opt(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


# --------------------------------------------------------------------------------------------------------------
# Metrics JSON
# --------------------------------------------------------------------------------------------------------------

def write_metrics(summaries: Mapping[str, dict], path: str | Path, references: Mapping[str, Any] | None = None,
                  extra: Mapping[str, Any] | None = None) -> Path:
    """``{"groups": summaries, "references": {name: {accuracy, ci_low, ci_high}}, **extra}`` as strict JSON
    (NaN written as null)."""
    doc = {"groups": dict(summaries),
           "references": {r.name: r.as_dict() for r in normalize_references(references)}}
    doc.update(extra or {})
    return write_json(path, doc, indent=2, strict=True)


def metrics_for_tracking(summaries: Mapping[str, dict], prefix: str = "eval") -> dict[str, float]:
    """Flat numeric metrics for the tracker: ``eval/pairwise/plan/accuracy``,
    ``eval/pairwise/plan/subsets/<subset>/accuracy``, ... (no ``@``; None dropped)."""
    out: dict[str, float] = {}
    for key, summary in summaries.items():
        out.update(flatten_summary(summary, f"{prefix}/{key}" if prefix else key))
    return out


# --------------------------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------------------------

def fmt_pct(x: float | None, digits: int = 2) -> str:
    """A fraction as a percentage, e.g. 0.7268 -> '72.68'; '-' for None."""
    return "-" if x is None else f"{100.0 * x:.{digits}f}"


def fmt_accuracy_ci(summary: Mapping[str, Any]) -> str:
    acc = fmt_pct(summary.get("accuracy"))
    if summary.get("ci_low") is None or summary.get("ci_high") is None:
        return acc
    return f"{acc} [{fmt_pct(summary['ci_low'])}, {fmt_pct(summary['ci_high'])}]"


def _fmt_count(count: int, rate: float) -> str:
    return f"{count} ({fmt_pct(rate, 1)}%)"


def _fmt_failures(s: Mapping[str, Any]) -> str:
    cell = _fmt_count(s["failures"], s["failure_rate"])
    kinds = s.get("failures_by_kind") or {}
    if kinds:
        cell += ": " + ", ".join(f"{k} {v['count']}" for k, v in kinds.items())
    return cell


def markdown_table(summaries: Mapping[str, dict], references: Mapping[str, Any] | None = None,
                   title: str | None = None) -> str:
    """A markdown report: the main table (one row per (mode, inputs)), then the reference accuracies.
    Accuracies are percentages with 2 decimals; rates percentages with 1 decimal."""
    subsets = sorted({name for s in summaries.values() for name in s.get("subsets", {})})
    header = (["mode", "inputs", "n", "accuracy [95% CI]", "ties", "failures", "acc A / acc B", "bias"]
              + [f"{name}" for name in subsets]
              + ["subset macro", "user macro", "consistency"])
    lines = []
    if title:
        lines += [f"# {title}", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for s in summaries.values():
        n = str(s["n"]) if s["n"] == s["n_pairs"] else f"{s['n']} ({s['n_pairs']} pairs)"
        slot = ("-" if s.get("accuracy_chosen_a") is None and s.get("accuracy_chosen_b") is None
                else f"{fmt_pct(s.get('accuracy_chosen_a'))} / {fmt_pct(s.get('accuracy_chosen_b'))}")
        row = [s["mode"], s["inputs"], n, fmt_accuracy_ci(s), _fmt_count(s["ties"], s["tie_rate"]),
               _fmt_failures(s), slot, fmt_pct(s.get("position_bias"))]
        row += [fmt_accuracy_ci(s["subsets"][name]) if name in s.get("subsets", {}) else "-" for name in subsets]
        row += [fmt_pct(s.get("subset_macro_accuracy")), fmt_pct(s.get("user_macro_accuracy")),
                fmt_pct(s.get("consistency_rate"))]
        lines.append("| " + " | ".join(row) + " |")
    first = next(iter(summaries.values()), None)
    lines += ["", "Accuracy in %. Ties and failures (parse / engine errors) count as wrong and are also listed "
                  "separately. 95% percentile bootstrap CI resampling users (all verdicts of a user together"
              + (f"; {first['n_bootstrap']} resamples, seed {first['seed']}" if first else "") + "). "
              "acc A / acc B: accuracy when the chosen answer is in slot A / B; bias = |acc A - acc B|. "
              "Subset macro: mean of per-subset accuracies; user macro: mean of per-user accuracies; "
              "consistency: share of pairs judged in both orders whose two verdicts agree."]
    refs = normalize_references(references)
    if refs:
        lines += ["", "| reference | accuracy [95% CI] |", "|---|---|"]
        for r in refs:
            lines.append(f"| {r.name} | {fmt_accuracy_ci(r.as_dict())} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------------
# Figure
# --------------------------------------------------------------------------------------------------------------

def accuracy_figure(summaries: Mapping[str, dict], references: Mapping[str, Any] | None = None,
                    title: str | None = None):
    """A matplotlib Figure (Agg canvas): accuracy bars with 95% CI error bars per (mode, inputs), and one
    horizontal line per reference (shaded band for its CI when given)."""
    keys = list(summaries)
    accs = np.array([np.nan if summaries[k]["accuracy"] is None else summaries[k]["accuracy"] for k in keys])
    lo = np.array([summaries[k]["ci_low"] if summaries[k]["ci_low"] is not None else np.nan for k in keys])
    hi = np.array([summaries[k]["ci_high"] if summaries[k]["ci_high"] is not None else np.nan for k in keys])
    err = np.vstack([np.nan_to_num(accs - lo), np.nan_to_num(hi - accs)]).clip(min=0)

    fig = new_figure(figsize=(max(5.5, 1.1 * len(keys) + 4.0), 4.0), dpi=120)
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(keys))
    colors = ["#4C72B0" if summaries[k]["mode"] == "pointwise" else "#DD8452" for k in keys]
    ax.bar(x, np.nan_to_num(accs), yerr=err, color=colors, capsize=4, width=0.6, zorder=2)
    for xi, a in zip(x, accs):
        if not np.isnan(a):
            ax.text(xi, 0.015, f"{100 * a:.1f}", ha="center", va="bottom", fontsize=8, color="white",
                    fontweight="bold", zorder=3)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{summaries[k]['mode']}\n{summaries[k]['inputs']}" for k in keys], fontsize=8)
    ax.set_ylabel("accuracy (ties and failures wrong)")
    ax.set_ylim(0.0, 1.05)
    ax.grid(axis="y", alpha=0.3, zorder=0)
    line_styles = ["--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1))]
    cmap = ["#2ca02c", "#9467bd", "#7f7f7f", "#8c564b", "#e377c2", "#17becf"]
    for i, r in enumerate(normalize_references(references)):
        color = cmap[i % len(cmap)]
        ax.axhline(r.accuracy, color=color, linestyle=line_styles[i % len(line_styles)], linewidth=1.2,
                   label=f"{r.name} {100 * r.accuracy:.1f}", zorder=1)
        if r.ci_low is not None and r.ci_high is not None:
            ax.axhspan(r.ci_low, r.ci_high, color=color, alpha=0.12, zorder=0)
    if references:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_accuracy(summaries: Mapping[str, dict], path: str | Path, references: Mapping[str, Any] | None = None,
                  title: str | None = None) -> Path:
    return save_figure(path, accuracy_figure(summaries, references, title))


# --------------------------------------------------------------------------------------------------------------
# Everything
# --------------------------------------------------------------------------------------------------------------

@dataclass
class Report:
    summaries: dict[str, dict]
    predictions: Path
    metrics: Path
    markdown: Path
    figure: Path
    paths: list[Path] = field(default_factory=list)


def write_report(run_dir: str | Path, preds: Sequence[Prediction], *, n_bootstrap: int = 1000, seed: int = 0,
                 references: Mapping[str, Any] | None = None, title: str | None = None,
                 extra: Mapping[str, Any] | None = None) -> Report:
    """Summarize ``preds`` per (mode, inputs) and write the four report files into ``run_dir``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    preds = list(preds)
    summaries = summarize_groups(preds, n_bootstrap=n_bootstrap, seed=seed)
    p = write_predictions(preds, run_dir / PREDICTIONS_FILE)
    m = write_metrics(summaries, run_dir / METRICS_FILE, references, extra)
    md = atomic_write_text(run_dir / MARKDOWN_FILE, markdown_table(summaries, references, title))
    fig = plot_accuracy(summaries, run_dir / FIGURE_FILE, references, title)
    return Report(summaries, p, m, md, fig, [p, m, md, fig])
