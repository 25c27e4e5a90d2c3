"""The bootstrap (pr_rlhf.stats): plain, clustered and paired CIs of a mean, calibrated and deterministic."""
import numpy as np
import pytest

from pr_rlhf.stats import bootstrap_ci, cluster_ids, mean_ci, paired_difference_ci, seeded_rng


def test_cluster_bootstrap_resamples_pairs_with_both_verdicts():
    rng = np.random.default_rng(1)
    pair_right = rng.random(400) < 0.7
    correct = np.repeat(pair_right, 2).astype(float)           # both verdicts of a pair agree: fully correlated
    clusters = np.repeat(np.arange(400), 2)
    naive = mean_ci(correct, n_bootstrap=2000, seed=0)
    clustered = mean_ci(correct, n_bootstrap=2000, seed=0, clusters=clusters)
    per_pair = mean_ci(pair_right.astype(float), n_bootstrap=2000, seed=0)
    def w(ci):
        return ci[1] - ci[0]

    # treating 800 correlated verdicts as independent understates the width by ~sqrt(2)
    assert w(clustered) > 1.25 * w(naive)
    # resampling pairs with both their verdicts == resampling the 400 pair outcomes (same stream, same stat)
    assert clustered == pytest.approx(per_pair)
    # singleton clusters are exactly the plain bootstrap
    assert mean_ci(correct, 500, 3, clusters=list(range(800))) == mean_ci(correct, 500, 3)


# ---------------------------------------------------------------------------------------------------------------
# CI behaviour
# ---------------------------------------------------------------------------------------------------------------

def test_ci_contains_point_estimate_and_narrows_with_n():
    rng = np.random.default_rng(0)
    widths = []
    for n in (50, 500, 5000):
        correct = (rng.random(n) < 0.7).astype(float)
        lo, hi = mean_ci(correct, n_bootstrap=1000, seed=0)
        assert lo <= correct.mean() <= hi
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]
    assert widths[0] > 2.5 * widths[1]                # ~sqrt(10)


def test_ci_edge_cases():
    assert all(np.isnan(mean_ci(np.array([]), 100, 0)))
    assert mean_ci(np.ones(20), 100, 0) == (1.0, 1.0)
    assert mean_ci(np.zeros(20), 100, 0) == (0.0, 0.0)
    with pytest.raises(ValueError):
        mean_ci(np.ones(3), 10, 0, clusters=[1, 2])


def test_ci_coverage_is_about_95_percent():
    """Calibration: over many simulated evaluations the 95% CI covers the true accuracy ~95% of the time, and
    for both-order verdicts only the cluster bootstrap does."""
    rng = np.random.default_rng(123)
    reps, n_pairs, p = 300, 150, 0.7
    cover_plain = cover_cluster = cover_naive = 0
    for r in range(reps):
        x = (rng.random(n_pairs) < p).astype(float)
        lo, hi = mean_ci(x, 400, r)
        cover_plain += lo <= p <= hi
        # both orders: the second verdict copies the first 80% of the time, else is an independent draw
        second = np.where(rng.random(n_pairs) < 0.8, x, (rng.random(n_pairs) < p).astype(float))
        both = np.stack([x, second], axis=1).ravel()
        lo, hi = mean_ci(both, 400, r, clusters=np.repeat(np.arange(n_pairs), 2))
        cover_cluster += lo <= p <= hi
        lo, hi = mean_ci(both, 400, r)
        cover_naive += lo <= p <= hi
    assert 0.89 <= cover_plain / reps <= 0.99
    assert 0.89 <= cover_cluster / reps <= 0.99
    assert cover_naive / reps < cover_cluster / reps


def test_chunked_resampling_draws_the_one_shot_stream():
    """Chunks of resample indices (bounded memory) give exactly the CI of one (n_bootstrap, n) draw: the CIs the
    world references and the reports print do not depend on the chunk size."""
    x = (np.random.default_rng(5).random(3000) < 0.6).astype(float)
    n_boot = 2001                                                     # 3000 x 2001 indices: several chunks
    idx = np.random.default_rng(9).integers(len(x), size=(n_boot, len(x)))
    means = x[idx].mean(axis=1)
    one_shot = (float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975)))
    assert bootstrap_ci(x, np.random.default_rng(9), n_boot) == one_shot


def test_bootstrap_ci_edge_cases_and_seeded_streams():
    assert all(np.isnan(bootstrap_ci(np.array([]), np.random.default_rng(0), 100)))
    assert all(np.isnan(bootstrap_ci(np.ones(5), np.random.default_rng(0), 0)))
    assert list(cluster_ids(["b", "a", "b", ("c", 1), ["c", 1]])) == [0, 1, 0, 2, 2]
    def draw(*names):
        return seeded_rng(3, *names).integers(1 << 30)

    assert draw("x") == draw("x") and draw("x") != draw("y") and draw() == seeded_rng(3).integers(1 << 30)


def test_paired_difference_ci():
    old = (np.arange(200) % 2).astype(float)                          # 50% correct
    new = np.where(np.arange(200) % 4 > 0, 1.0, old)                  # strictly better on 50 items
    gain, low, high = paired_difference_ci(new, old, clusters=None, seed=1)
    assert gain == pytest.approx(0.25) and 0 < low < gain < high
    assert (low, high) == mean_ci(new - old, seed=1)
    assert all(np.isnan(paired_difference_ci(np.array([]), np.array([]), clusters=None)))
    with pytest.raises(TypeError):   # the unit the bootstrap resamples is never left to a default
        paired_difference_ci(new, old)


def test_paired_difference_resamples_users_when_a_users_pairs_move_together():
    """Six pairs per user, the change sits in a third of the users and moves all of their pairs: resampling pairs
    understates the CI; resampling users gives the honest one (and the same point estimate)."""
    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(200), 6)
    changed = rng.random(200) < 0.3
    old = (rng.random(1200) < 0.7).astype(float)
    new = np.where(changed[users], 1.0, old)
    by_pair = paired_difference_ci(new, old, clusters=None, seed=0)
    by_user = paired_difference_ci(new, old, clusters=users, seed=0)
    assert by_pair[0] == by_user[0]
    assert (by_user[2] - by_user[1]) > 1.3 * (by_pair[2] - by_pair[1])
