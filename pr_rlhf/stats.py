"""Percentile-bootstrap confidence intervals of a mean: the one resampler behind every CI the project reports.

Plain (items resampled independently) or clustered (whole clusters resampled with all their items). The
project's reports cluster by **user** (docs/protocols.md section 3): a user's evaluation pairs share one history,
a user's RL prompts share one reward, so their outcomes move together and resampling pairs would understate the
uncertainty. A paired difference (new - old over the same items) resamples the differences the same way, and
takes its clusters as a required argument so that no report can forget them. Everything is deterministic in the
generator, or in a seed and names (:func:`seeded_rng`), so a report's CIs are the same on every rerun. numpy only.
"""
from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

CI_LEVEL = 0.95
_MAX_INDICES = 4_000_000   # resample indices drawn per chunk: bounds memory at ~32 MB


def seeded_rng(seed: int, *names: str) -> np.random.Generator:
    """A generator derived from ``seed`` and names, stable across processes (no Python ``hash``)."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF] + [zlib.crc32(n.encode()) for n in names])


def cluster_ids(labels: Sequence[Any] | np.ndarray) -> np.ndarray:
    """Dense integer ids (in order of first appearance) for arbitrary hashable cluster labels."""
    ids: dict[Any, int] = {}
    out = np.empty(len(labels), dtype=np.int64)
    for i, c in enumerate(labels):
        key = tuple(c) if isinstance(c, (list, np.ndarray)) else c
        out[i] = ids.setdefault(key, len(ids))
    return out


def bootstrap_ci(values: np.ndarray, rng: np.random.Generator, n_bootstrap: int, *,
                 clusters: np.ndarray | None = None, level: float = CI_LEVEL) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of ``values``, drawing from ``rng``.

    ``clusters``: a dense cluster index per item (0..k-1, see :func:`cluster_ids`); whole clusters are then
    resampled and the statistic is the pooled mean (sum of resampled items / their count), which matches the
    point estimate ``values.mean()``. Returns (nan, nan) for no items or no resamples.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or n_bootstrap < 1:
        return float("nan"), float("nan")
    if clusters is None:
        sums, counts = values, np.ones_like(values)
    else:
        n_clusters = int(clusters.max()) + 1
        sums = np.bincount(clusters, weights=values, minlength=n_clusters)
        counts = np.bincount(clusters, minlength=n_clusters).astype(np.float64)
    m = len(sums)
    means = np.empty(n_bootstrap, dtype=np.float64)
    chunk = max(1, min(n_bootstrap, _MAX_INDICES // m))
    for start in range(0, n_bootstrap, chunk):   # chunks draw the same stream as one (n_bootstrap, m) draw
        stop = min(n_bootstrap, start + chunk)
        idx = rng.integers(m, size=(stop - start, m))
        means[start:stop] = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def mean_ci(values: np.ndarray, n_bootstrap: int = 1000, seed: int = 0, clusters: Sequence[Any] | None = None,
            level: float = CI_LEVEL) -> tuple[float, float]:
    """Percentile bootstrap CI (default 95%) of the mean of ``values`` (0/1 verdicts, scores, rewards, ...).

    Without ``clusters`` items are resampled independently; with ``clusters`` (one label per item, e.g. the pair
    id for both-order judging) whole clusters are resampled (see :func:`bootstrap_ci`). Returns (nan, nan) for
    no items. Deterministic in ``seed``.
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    cid = None
    if clusters is not None:
        if len(clusters) != len(values):
            raise ValueError(f"clusters has {len(clusters)} labels for {len(values)} items")
        cid = cluster_ids(clusters)
    return bootstrap_ci(values, seeded_rng(seed), int(n_bootstrap), clusters=cid, level=level)


def paired_difference_ci(new: np.ndarray, old: np.ndarray, *, clusters: Sequence[Any] | None,
                         n_bootstrap: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, ci_low, ci_high) of ``new - old`` over the same items (aligned arrays). Pairing removes what the items
    differ in (hard vs easy pairs, users' attainable reward), which dominates two independent CIs.

    ``clusters``: one label per item, the unit the bootstrap resamples (the user the pair or prompt belongs to);
    ``None`` says, explicitly, that the items are independent. (nan, nan, nan) for no items."""
    diff = np.asarray(new, dtype=np.float64) - np.asarray(old, dtype=np.float64)
    if diff.size == 0:
        return float("nan"), float("nan"), float("nan")
    low, high = mean_ci(diff, n_bootstrap=n_bootstrap, seed=seed, clusters=clusters)
    return float(diff.mean()), low, high
