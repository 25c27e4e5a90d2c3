"""Best-of-k curves from scored pools: per k, the mean over prompts of each prompt's exact expected best-of-k
quality (``estimator.expected_best_of_k``) with a 95% bootstrap CI resampling users, per subset and overall; a PNG
plot; the rows that mlflow logs as ``bon/best_of_<k>``."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pr_rlhf.bon.estimator import expected_best_of_k, first_k_quality, powers_of_two
from pr_rlhf.report_files import new_figure, save_figure
from pr_rlhf.stats import mean_ci


@dataclass(frozen=True)
class ScoredPool:
    """One prompt's N samples: the RM's scores and the downstream quality of each (same order), and the user who
    asked (the CI's unit: a user's prompts share one taste)."""

    prompt_id: str
    subset: str
    scores: tuple[float, ...]
    quality: tuple[float, ...]
    user_id: str


def scored_pool(prompt_id: str, subset: str, user_id: str, scores: Sequence[float | None],
                quality: Sequence[float]) -> ScoredPool:
    """A prompt's pool from its samples' RM scores (None: the RM could not score it) and downstream quality; an
    unscored sample ranks below every scored one of its prompt, so an RM failure is never a lucky pick."""
    floor = min((v for v in scores if v is not None), default=0.0) - 1.0
    return ScoredPool(prompt_id, subset, tuple(floor if v is None else float(v) for v in scores),
                      tuple(float(q) for q in quality), user_id)


@dataclass(frozen=True)
class CurvePoint:
    subset: str          # "all" for every prompt
    k: int
    mean: float
    ci_low: float
    ci_high: float
    prompts: int
    first_k_mean: float  # the public protocol's estimate (first k samples), for comparison


def curve(pools: Sequence[ScoredPool], ks: Sequence[int] | None = None, n_bootstrap: int = 1000,
          seed: int = 0) -> list[CurvePoint]:
    """Points for every k (default: 1, 2, 4, ... up to the smallest pool) and subset, plus "all"."""
    if not pools:
        raise ValueError("no scored pools")
    smallest = min(len(p.scores) for p in pools)
    ks = list(ks) if ks is not None else powers_of_two(smallest)
    if max(ks) > smallest:
        raise ValueError(f"k={max(ks)} exceeds the smallest pool ({smallest} samples)")
    groups = {"all": list(pools)}
    for p in pools:
        groups.setdefault(p.subset, []).append(p)
    out = []
    for subset, members in groups.items():
        for k in ks:
            values = np.array([expected_best_of_k(p.scores, p.quality, k) for p in members])
            first = np.array([first_k_quality(p.scores, p.quality, k) for p in members])
            low, high = mean_ci(values, n_bootstrap=n_bootstrap, seed=seed, clusters=[p.user_id for p in members])
            out.append(CurvePoint(subset, int(k), float(values.mean()), low, high, len(members),
                                  float(first.mean())))
    return out


def _plot_lines(lines: Mapping[str, Sequence[CurvePoint]], path: Path, title: str, bold: str | None = None) -> Path:
    """Mean quality vs k (log2 axis) with its CI band, one line per entry of ``lines``."""
    fig = new_figure(figsize=(6.5, 4.2))
    ax = fig.subplots()
    for label, points in lines.items():
        rows = sorted(points, key=lambda p: p.k)
        ks = [p.k for p in rows]
        ax.plot(ks, [p.mean for p in rows], marker="o", label=label, lw=2 if label == bold else 1.5)
        ax.fill_between(ks, [p.ci_low for p in rows], [p.ci_high for p in rows], alpha=0.12)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples the reward model chooses from)")
    ax.set_ylabel("downstream quality of the pick")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(path, fig)


def plot_curves(points: Sequence[CurvePoint], path: Path, title: str = "Best-of-k") -> Path:
    """One reward model: a line per subset ("all" in bold)."""
    subsets = dict.fromkeys(p.subset for p in points)
    return _plot_lines({s: [p for p in points if p.subset == s] for s in subsets}, path, title, bold="all")


def mlflow_metrics(points: Sequence[CurvePoint], prefix: str = "bon") -> dict[str, float]:
    """``<prefix>/best_of_<k>`` (all prompts) and ``<prefix>/<subset>/best_of_<k>`` (a sweep uses
    ``bon/<reward model>`` so that several RMs' curves live side by side in one run)."""
    return {(f"{prefix}/best_of_{p.k}" if p.subset == "all" else f"{prefix}/{p.subset}/best_of_{p.k}"): p.mean
            for p in points}


def plot_reward_models(curves: Mapping[str, Sequence[CurvePoint]], path: Path,
                       title: str = "Best-of-k by reward model") -> Path:
    """Several reward models: a line per model (all prompts)."""
    return _plot_lines({name: [p for p in points if p.subset == "all"] for name, points in curves.items()},
                       path, title)
