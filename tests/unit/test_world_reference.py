"""Reference accuracies of the synthetic world: the Monte Carlo oracle is exact where it can be checked, and the
default world is neither trivial nor noise."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr

from pr_rlhf.stats import bootstrap_ci
from pr_rlhf.world import WorldConfig, build_world
from pr_rlhf.world.reference import WorldPrior, reference_accuracies, reference_scores, reference_summary


@pytest.fixture(scope="module")
def world():
    return build_world(WorldConfig())


@pytest.fixture(scope="module")
def scores(world):
    return reference_scores(world, history_size=3)


def _exact_preference(archetypes, sigma, history, query):
    """Posterior over archetypes by enumeration (user_noise = 0), then the posterior-mean preference."""
    def p_first(diffs):
        return ndtr(archetypes @ diffs.T / (sigma * np.sqrt(2)))           # (A, n)

    posterior = np.prod(p_first(history), axis=1) if len(history) else np.ones(len(archetypes))
    posterior = posterior / posterior.sum()
    return posterior @ p_first(query)


@pytest.mark.parametrize("n_attributes,n_archetypes", [(2, 2), (3, 2), (3, 3)])
def test_monte_carlo_oracle_equals_exact_enumeration(n_attributes, n_archetypes):
    cfg = WorldConfig(n_attributes=n_attributes, n_archetypes=n_archetypes, user_noise=0.0, users=40,
                      cold_start_users=0, max_differing_attributes=2, min_differing_attributes=1, seed=5,
                      reference_samples=50)
    w = build_world(cfg)
    prior = WorldPrior.of(w)
    for u in w.users:
        hist = np.array([p.differing for p in w.history(u.user_id, 3)])
        held = [p for p in w.pairs_of(u.user_id) if p.split != "train"]
        query = np.array([p.differing for p in held])
        mc = prior.preference(hist, query)
        exact = _exact_preference(w.archetypes, cfg.utility_noise, hist, query)
        np.testing.assert_allclose(mc, exact, rtol=1e-9, atol=1e-12)
        assert ((mc > 0.5) == (exact > 0.5)).all()


def test_default_world_is_neither_trivial_nor_noise(world):
    acc = reference_accuracies(world, history_size=3)
    assert 0.75 <= acc["oracle"].accuracy <= 0.92
    assert acc["true_weights"].accuracy >= 0.9
    assert acc["no_history"].accuracy <= 0.65
    for est in acc.values():
        assert est.ci_low <= est.accuracy <= est.ci_high and est.n == 1200


def test_oracle_beats_weaker_references(scores):
    oracle = scores["oracle"]
    for weaker, margin in (("logistic_regression", 0.05), ("no_history", 0.1)):
        diff = oracle - scores[weaker]
        assert diff.mean() >= margin, weaker
        lo, _ = bootstrap_ci(diff, np.random.default_rng(0), 2000)
        assert lo > 0, weaker
    # The true weights are the ceiling: the oracle cannot beat them beyond sampling noise.
    assert oracle.mean() <= scores["true_weights"].mean() + 0.01


def test_more_history_helps_the_oracle(world):
    short = reference_scores(world, history_size=1, predictors=("oracle",))["oracle"].mean()
    long = reference_scores(world, history_size=8, predictors=("oracle",))["oracle"].mean()
    assert long > short + 0.05


def test_monte_carlo_has_converged(world, scores):
    dense = reference_scores(world, history_size=3, n_samples=24_000, predictors=("oracle",))["oracle"]
    assert np.mean(dense == scores["oracle"]) > 0.97


def test_cold_start_reference(world):
    acc = reference_accuracies(world, history_size=1, users="cold_start", splits=("test",))
    assert acc["oracle"].n == world.config.cold_start_users * world.config.cold_start_test_pairs
    assert acc["no_history"].accuracy < acc["true_weights"].accuracy


def test_summary_reports_references(world):
    s = reference_summary(world)
    assert set(s["reference"]) == {"oracle", "logistic_regression", "no_history", "true_weights"}
    assert s["reference"]["oracle"] == reference_accuracies(world, history_size=3)["oracle"].as_dict()
