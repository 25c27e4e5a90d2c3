"""Best-of-k from one pool of N samples per prompt (docs/protocols.md section 5).

The reward model's pick among k samples is the one it scores highest. This module computes, for every k, the
*exact* expected downstream quality of that pick over all C(N, k) equally likely k-subsets of the pool, so a single
pool of N serves every k <= N without the bias of reusing its first k samples:

    sort the pool by RM score; group equal scores. A k-subset's maximum lies in tie group g iff it holds none of
    the a_g samples scored above g and at least one of g's t_g samples:
        P(g) = [C(N - a_g, k) - C(N - a_g - t_g, k)] / C(N, k)
    and, given that, the pick is uniform over the subset's members of g, which by symmetry makes every member of
    g equally likely: E[quality | g] = mean quality of g.  E_k = sum_g P(g) * mean_q(g).

Binomials are exact Python integers (N = 128, k = 64: C ~ 2.4e37), divided once. The public PRB code's protocol
(the first k samples, ties to the earliest) is :func:`first_k_quality`, for comparison.
"""
from __future__ import annotations

from collections.abc import Sequence
from math import comb

import numpy as np


def _check(scores: Sequence[float], quality: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).ravel()
    q = np.asarray(quality, dtype=np.float64).ravel()
    if s.size != q.size:
        raise ValueError(f"{s.size} scores but {q.size} quality values")
    if s.size == 0:
        raise ValueError("an empty pool has no best-of-k")
    if not (np.isfinite(s).all() and np.isfinite(q).all()):
        raise ValueError("scores and quality must be finite (drop or impute unscored samples first)")
    return s, q


def expected_best_of_k(scores: Sequence[float], quality: Sequence[float], k: int) -> float:
    """Exact expected quality of the top-scored sample of a uniformly random k-subset (ties: uniform pick)."""
    s, q = _check(scores, quality)
    n = s.size
    if not 1 <= k <= n:
        raise ValueError(f"k={k} outside 1..{n} (the pool size)")
    values, inverse = np.unique(-s, return_inverse=True)   # groups in descending score order
    total = comb(n, k)
    above = 0
    acc = 0.0
    for g in range(values.size):
        members = inverse == g
        t = int(members.sum())
        ways = comb(n - above, k) - comb(n - above - t, k)
        if ways:
            acc += (ways / total) * float(q[members].mean())
        above += t
        if n - above < k:   # every later group needs k samples from fewer than k: impossible
            break
    return acc


def best_of_k_curve(scores: Sequence[float], quality: Sequence[float], ks: Sequence[int]) -> dict[int, float]:
    """{k: expected best-of-k quality} for each k (each <= the pool size)."""
    return {int(k): expected_best_of_k(scores, quality, int(k)) for k in ks}


def first_k_quality(scores: Sequence[float], quality: Sequence[float], k: int) -> float:
    """The public PRB protocol: the best-scored of the FIRST k samples, ties to the earliest."""
    s, q = _check(scores, quality)
    if not 1 <= k <= s.size:
        raise ValueError(f"k={k} outside 1..{s.size} (the pool size)")
    return float(q[int(np.argmax(s[:k]))])


def powers_of_two(n: int) -> list[int]:
    """1, 2, 4, ... up to n (n itself included when it is not a power of two)."""
    if n < 1:
        raise ValueError(f"pool size {n} < 1")
    ks = [1 << i for i in range(n.bit_length()) if (1 << i) <= n]
    return ks if ks[-1] == n else ks + [n]
