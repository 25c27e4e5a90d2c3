"""The exact best-of-k estimator against brute-force enumeration of every k-subset (ties included)."""
from __future__ import annotations

from itertools import combinations, pairwise

import numpy as np
import pytest

from pr_rlhf.bon.estimator import (
    best_of_k_curve,
    expected_best_of_k,
    first_k_quality,
    powers_of_two,
)


def brute_force(scores, quality, k) -> float:
    values = []
    for subset in combinations(range(len(scores)), k):
        top = max(scores[i] for i in subset)
        tied = [quality[i] for i in subset if scores[i] == top]
        values.append(sum(tied) / len(tied))      # a uniform pick among the subset's tied maxima
    return sum(values) / len(values)


@pytest.mark.parametrize("seed", range(6))
def test_matches_enumeration_with_and_without_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 9))
    scores = list(rng.integers(0, 4, size=n).astype(float)) if seed % 2 else list(rng.normal(size=n))
    quality = list(rng.normal(size=n))
    for k in range(1, n + 1):
        assert expected_best_of_k(scores, quality, k) == pytest.approx(brute_force(scores, quality, k), abs=1e-12)


def test_edge_cases_and_first_k_protocol():
    q = [0.1, 0.9, 0.5, 0.3]
    assert expected_best_of_k([1, 2, 3, 4], q, 1) == pytest.approx(np.mean(q))   # k = 1: the pool mean
    assert expected_best_of_k([1, 2, 3, 4], q, 4) == pytest.approx(0.3)          # k = N: the top-scored sample
    assert expected_best_of_k([7, 7, 7, 7], q, 3) == pytest.approx(np.mean(q))   # all tied: uniform pick
    assert first_k_quality([1, 5, 5, 9], q, 3) == 0.9                           # ties to the earliest
    curve = best_of_k_curve([1, 2, 3, 4], q, [1, 2, 4])
    assert list(curve) == [1, 2, 4] and curve[4] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="outside"):
        expected_best_of_k([1, 2], [0, 1], 3)
    with pytest.raises(ValueError, match="quality"):
        expected_best_of_k([1, 2], [0], 1)
    with pytest.raises(ValueError, match="finite"):
        expected_best_of_k([1, float("nan")], [0, 1], 1)
    assert powers_of_two(128) == [1, 2, 4, 8, 16, 32, 64, 128] and powers_of_two(12) == [1, 2, 4, 8, 12]


def test_large_pool_is_exact_and_a_good_rm_rises_with_k():
    rng = np.random.default_rng(0)
    quality = rng.normal(size=128)
    scores = quality + rng.normal(scale=0.5, size=128)      # an informative RM
    curve = best_of_k_curve(scores, quality, powers_of_two(128))
    values = list(curve.values())
    assert all(b > a for a, b in pairwise(values))   # more samples, better pick
    assert curve[1] == pytest.approx(quality.mean()) and curve[128] == pytest.approx(quality[np.argmax(scores)])
    noise = best_of_k_curve(rng.normal(size=128), quality, [1, 128])   # an uninformative RM does not rise on average
    assert abs(noise[1] - quality.mean()) < 1e-12


def test_benchmark_validity_rank_agreement():
    from pr_rlhf.bon.validity import ndcg, spearman_rho

    down = [0.2, 0.5, 0.4, 0.9]
    assert spearman_rho([1, 3, 2, 4], down) == pytest.approx(1.0)
    assert spearman_rho([4, 2, 3, 1], down) == pytest.approx(-1.0)
    assert ndcg([1, 3, 2, 4], down) == pytest.approx(1.0)            # the benchmark ranks as the downstream does
    worst = ndcg([4, 2, 3, 1], down)
    assert 0.0 <= worst < 1.0 and ndcg([4, 2, 3, 1], down, relevance="zscore") < 0   # signed relevance goes below 0
    # hand-computed: order by benchmark = RM 3 (rel 1), RM 0 (0), RM 1 (3/7), RM 2 (2/7)
    rel = np.array([0.0, 3 / 7, 2 / 7, 1.0])
    disc = 1 / np.log2(np.arange(2, 6))
    expected = (rel[[3, 0, 1, 2]] * disc).sum() / (np.sort(rel)[::-1] * disc).sum()
    assert ndcg([3, 2, 1, 4], down) == pytest.approx(expected)
    assert np.isnan(spearman_rho([1, 1, 1], [1, 2, 3])) and np.isnan(ndcg([1, 2], [5, 5]))
    with pytest.raises(ValueError, match="at least 2"):
        ndcg([1], [1])


def test_curves_per_subset_with_ci_plot_and_metrics(tmp_path):
    from pr_rlhf.bon.curves import ScoredPool, curve, mlflow_metrics, plot_curves

    rng = np.random.default_rng(3)
    pools = []
    for i in range(20):
        quality = rng.normal(size=16)
        informative = i % 2 == 0
        scores = quality + rng.normal(scale=0.3, size=16) if informative else rng.normal(size=16)
        pools.append(ScoredPool(f"p{i}", "good_rm" if informative else "noise", tuple(scores), tuple(quality),
                                    f"u{i // 2}"))
    points = curve(pools, n_bootstrap=200)
    assert {p.subset for p in points} == {"all", "good_rm", "noise"} and {p.k for p in points} == {1, 2, 4, 8, 16}
    good = {p.k: p for p in points if p.subset == "good_rm"}
    assert good[16].mean > good[1].mean + 0.5 and good[16].ci_low <= good[16].mean <= good[16].ci_high
    assert good[16].first_k_mean == pytest.approx(good[16].mean)   # k = N: both protocols pick the top sample
    metrics = mlflow_metrics(points)
    assert "bon/best_of_16" in metrics and "bon/noise/best_of_1" in metrics
    assert plot_curves(points, tmp_path / "bon.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="smallest pool"):
        curve(pools, ks=[32])


def test_an_unscored_sample_ranks_below_every_scored_one_of_its_prompt():
    from pr_rlhf.bon.curves import scored_pool

    pool = scored_pool("p", "s", "u", [0.2, None, -3.0], [0.1, 1.0, 0.5])
    assert pool.scores[1] < min(pool.scores[0], pool.scores[2])
    assert pool.quality == (0.1, 1.0, 0.5) and pool.user_id == "u"
    # an RM failure is never the pick, even where that sample is the best one: best-of-3 takes the top scored
    assert expected_best_of_k(pool.scores, pool.quality, 3) == 0.1
    blank = scored_pool("p", "s", "u", [None, None], [0.0, 1.0])
    assert blank.scores[0] == blank.scores[1]   # nothing scored: a uniform pick
