"""The benchmark-validity report: reward models ranked by benchmark accuracy against the same models ranked by
downstream quality (best-of-k at every k of a sweep, and any other downstream measure such as a GRPO/PPO run's
final gold reward), with Spearman's rho and NDCG (``pr_rlhf.bon.validity``, whose docstring holds the formula).

Input: one or more ``bon.json`` files written by a sweep (``workers/bon.py``), each with its curves and the
benchmark accuracy of its reward models; optional extra downstream columns ({column: {rm: value}}).
Output: ``correlation.md``, ``correlation.json`` and ``correlation.png`` (benchmark accuracy vs best-of-N quality).
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pr_rlhf.bon.validity import ndcg, spearman_rho
from pr_rlhf.report_files import new_figure, write_report_files

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


@dataclass
class Agreement:
    """Rank agreement of benchmark accuracy with one downstream measure over the RMs that have both."""

    downstream: str                 # e.g. "best_of_32" or "ppo_gold_reward"
    reward_models: list[str]
    benchmark: list[float]
    quality: list[float]
    spearman_rho: float
    ndcg_minmax: float
    ndcg_zscore: float


@dataclass
class CorrelationReport:
    benchmark_accuracy: dict[str, float]
    agreements: list[Agreement] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)   # downstream columns with fewer than 2 RMs

    def as_dict(self) -> dict:
        return asdict(self)


def agreement(name: str, benchmark: Mapping[str, float], quality: Mapping[str, float]) -> Agreement | None:
    """None when fewer than two RMs have both a benchmark accuracy and a downstream value."""
    names = [n for n in benchmark if n in quality and math.isfinite(quality[n])]
    if len(names) < 2:
        return None
    b, q = [float(benchmark[n]) for n in names], [float(quality[n]) for n in names]
    return Agreement(name, names, b, q, spearman_rho(b, q), ndcg(b, q, "minmax"), ndcg(b, q, "zscore"))


def best_of_k_columns(bon: Mapping) -> dict[str, dict[str, float]]:
    """{"best_of_<k>": {rm: mean quality over all prompts}} from a sweep's bon.json."""
    columns: dict[str, dict[str, float]] = {}
    for rm, points in bon["curves"].items():
        for p in points:
            if p["subset"] == "all":
                columns.setdefault(f"best_of_{p['k']}", {})[rm] = float(p["mean"])
    return dict(sorted(columns.items(), key=lambda kv: int(kv[0].rsplit("_", 1)[1])))


def load_bon(path: Path) -> dict:
    path = Path(path)
    file = path / "bon.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no bon.json (run `pr-rlhf bon RECIPE` first)")
    data = json.loads(file.read_text())
    for key in ("curves", "benchmark_accuracy"):
        if key not in data:
            raise ValueError(f"{file}: field {key!r} missing (written by an older sweep? rerun `pr-rlhf bon`)")
    return data


def correlation_report(bons: Sequence[Mapping], extra: Mapping[str, Mapping[str, float]] | None = None,
                       labels: Sequence[str] | None = None,
                       benchmark: Mapping[str, float] | None = None) -> CorrelationReport:
    """Agreements for every best-of-k column of every sweep (prefixed by its label when several) and every extra
    column. Benchmark accuracies of all sweeps are merged (a later sweep's value for the same RM wins), then
    ``benchmark`` (e.g. an RL sweep's, without any Best-of-N sweep)."""
    bench: dict[str, float] = {}
    columns: dict[str, dict[str, float]] = {}
    for i, bon in enumerate(bons):
        bench.update({k: float(v) for k, v in bon["benchmark_accuracy"].items()})
        prefix = f"{labels[i]}/" if labels and len(bons) > 1 else ""
        columns.update({prefix + c: v for c, v in best_of_k_columns(bon).items()})
    bench.update({k: float(v) for k, v in (benchmark or {}).items()})
    columns.update({c: {k: float(v) for k, v in vals.items()} for c, vals in (extra or {}).items()})
    report = CorrelationReport(bench)
    for column, quality in columns.items():
        a = agreement(column, bench, quality)
        if a is None:
            report.skipped.append(column)
        else:
            report.agreements.append(a)
    return report


def _fmt(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:+.3f}"


def write_correlation_report(report: CorrelationReport, out: Path, title: str = "Benchmark validity") -> Path:
    """correlation.md / .json / .png in ``out``; returns the markdown path."""
    lines = [f"## {title}", "",
             "Reward models ranked by benchmark accuracy vs by downstream quality. Spearman's rho (average ranks "
             "for ties); NDCG of the benchmark's order with the downstream value as relevance (min-max: [0, 1]; "
             "z-score: signed, below 0 when the order is reversed); formula in `pr_rlhf/bon/validity.py`.", "",
             "| downstream | RMs | Spearman rho | NDCG (min-max) | NDCG (z-score) |", "|---|---|---|---|---|"]
    lines += [f"| {a.downstream} | {len(a.reward_models)} | {_fmt(a.spearman_rho)} | {_fmt(a.ndcg_minmax)} | "
              f"{_fmt(a.ndcg_zscore)} |" for a in report.agreements]
    figure = None
    if report.agreements:
        best_of = [a for a in report.agreements if "best_of_" in a.downstream]
        last = (best_of or report.agreements)[-1]   # the largest k: the headline column
        lines += ["", f"Per reward model ({last.downstream}):", "", "| reward model | benchmark accuracy | "
                  f"{last.downstream} |", "|---|---|---|"]
        order = sorted(range(len(last.reward_models)), key=lambda i: -last.benchmark[i])
        lines += [f"| {last.reward_models[i]} | {100 * last.benchmark[i]:.1f} | {last.quality[i]:.4f} |"
                  for i in order]
        figure = _figure(last)
    if report.skipped:
        lines += ["", f"Skipped (fewer than 2 RMs with a benchmark accuracy): {', '.join(report.skipped)}"]
    files = write_report_files(out, "correlation", markdown="\n".join(lines) + "\n", data=report.as_dict(),
                               figure=figure)
    return files.markdown


def _figure(a: Agreement) -> Figure:
    fig = new_figure(figsize=(5.5, 4))
    ax = fig.subplots()
    ax.scatter([100 * b for b in a.benchmark], a.quality)
    for name, b, q in zip(a.reward_models, a.benchmark, a.quality):
        ax.annotate(name, (100 * b, q), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("benchmark accuracy (%)")
    ax.set_ylabel(a.downstream.replace("_", " "))
    ax.set_title(f"rho {_fmt(a.spearman_rho)}, NDCG {_fmt(a.ndcg_minmax)}")
    fig.tight_layout()
    return fig
