"""Benchmark validity (docs/protocols.md section 5): does ranking reward models by benchmark accuracy rank them as their
downstream quality (best-of-k, GRPO/PPO reward) does?

- Spearman's rho between the two score lists (ties get average ranks).
- NDCG of the benchmark's ranking with the downstream quality as relevance (PRB publishes no formula; this one):
  order the RMs by benchmark accuracy (ties: the order the downstream would put them in last, i.e. pessimistic);
  DCG = sum_i rel_(i) / log2(i + 1) over positions i = 1..R; IDCG = the same with the RMs ordered by relevance;
  NDCG = DCG / IDCG. ``relevance="minmax"``: rel = (d - min d) / (max d - min d), NDCG in [0, 1];
  ``relevance="zscore"``: rel = (d - mean d) / std d, so an anti-correlated ranking can score below 0 (PRB's
  -0.07 for Chatbot-Arena-Personalized suggests a signed relevance).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np


def _pair(benchmark: Sequence[float], downstream: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    b = np.asarray(benchmark, dtype=np.float64).ravel()
    d = np.asarray(downstream, dtype=np.float64).ravel()
    if b.size != d.size:
        raise ValueError(f"{b.size} benchmark scores but {d.size} downstream scores")
    if b.size < 2:
        raise ValueError("rank agreement needs at least 2 reward models")
    if not (np.isfinite(b).all() and np.isfinite(d).all()):
        raise ValueError("benchmark and downstream scores must be finite")
    return b, d


def spearman_rho(benchmark: Sequence[float], downstream: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); nan when either list is constant."""
    from scipy.stats import spearmanr

    b, d = _pair(benchmark, downstream)
    if np.ptp(b) == 0 or np.ptp(d) == 0:
        return float("nan")
    return float(spearmanr(b, d).statistic)


def ndcg(benchmark: Sequence[float], downstream: Sequence[float],
         relevance: Literal["minmax", "zscore"] = "minmax") -> float:
    """NDCG of the benchmark's ranking of the RMs against their downstream quality (module docstring)."""
    b, d = _pair(benchmark, downstream)
    if np.ptp(d) == 0:
        return float("nan")   # every RM equally good downstream: no ranking to recover
    rel = (d - d.min()) / np.ptp(d) if relevance == "minmax" else (d - d.mean()) / d.std()
    discounts = 1.0 / np.log2(np.arange(2, b.size + 2))
    order = np.lexsort((d, -b))            # by benchmark descending; ties: worse downstream first
    ideal = np.sort(rel)[::-1]
    idcg = float((ideal * discounts).sum())
    return float((rel[order] * discounts).sum()) / idcg
