"""Reference accuracies on the world's held-out pairs: what a predictor with a given amount of knowledge reaches.

For each held-out pair of a user, given the user's first ``h`` history (train) pairs:

- ``oracle``: Bayes-optimal under the world's own prior. Prior samples of user weights (the archetype mixture
  plus user noise, stratified: the same number of samples per archetype) are weighted by the history's
  likelihood P(chosen | w) = Phi(w.(x_c - x_r) / (utility_noise * sqrt 2)); the prediction is the posterior-mean
  preference probability. With user_noise = 0 this equals exact enumeration over archetypes.
- ``logistic_regression``: a per-user logistic regression on the history pairs (symmetric augmentation, no
  intercept, small L2), the simplest learner that sees only this user's data.
- ``no_history``: the prior alone (the population's preference).
- ``true_weights``: the sign of w_user.(x_a - x_b), the ceiling set by the utility noise.

A prediction scores 1 when it picks the chosen answer, 0 when it picks the rejected one and 0.5 on an exact tie
(the expected score of a coin flip; a per-user LR ties on pairs that differ only in attributes its history never
varied). Each accuracy comes with a 95% percentile-bootstrap CI resampling users (a user's pairs share one
history, so they are not independent).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
from scipy.special import log_ndtr, ndtr

from pr_rlhf.stats import bootstrap_ci, cluster_ids
from pr_rlhf.world.generator import World, stream

REFERENCES = ("oracle", "logistic_regression", "no_history", "true_weights")
UserGroup = Literal["seen", "cold_start", "all"]


@dataclass(frozen=True)
class Estimate:
    accuracy: float
    ci_low: float
    ci_high: float
    n: int

    def as_dict(self) -> dict:
        return asdict(self)


class WorldPrior:
    """Monte Carlo samples of user weights from the world's prior, and the posterior preference they imply."""

    def __init__(self, archetypes: np.ndarray, user_noise: float, utility_noise: float, n_samples: int,
                 rng: np.random.Generator):
        per_archetype = max(1, -(-n_samples // len(archetypes)))   # stratified: equal count per archetype
        self.samples = (np.repeat(archetypes, per_archetype, axis=0)
                        + user_noise * rng.normal(size=(per_archetype * len(archetypes), archetypes.shape[1])))
        self.utility_noise = utility_noise

    @classmethod
    def of(cls, world: World, n_samples: int | None = None) -> WorldPrior:
        cfg = world.config
        return cls(world.archetypes, cfg.user_noise, cfg.utility_noise, n_samples or cfg.reference_samples,
                   stream(cfg.seed, "oracle"))

    def _scaled(self, diffs: np.ndarray) -> np.ndarray:
        margins = self.samples @ np.asarray(diffs, dtype=np.float64).T          # (S, n)
        if self.utility_noise > 0:
            return margins / (self.utility_noise * np.sqrt(2.0))
        return np.sign(margins) * np.inf                                         # noise-free: a step

    def posterior_weights(self, history_diffs: np.ndarray) -> np.ndarray:
        """Normalized importance weights of the samples given history diffs (x_chosen - x_rejected rows)."""
        n = len(self.samples)
        if len(history_diffs) == 0:
            return np.full(n, 1.0 / n)
        with np.errstate(invalid="ignore"):
            loglik = np.nan_to_num(log_ndtr(self._scaled(history_diffs)), nan=np.log(0.5)).sum(axis=1)
        if not np.isfinite(loglik.max()):          # no sample explains the history: fall back to the prior
            return np.full(n, 1.0 / n)
        w = np.exp(loglik - loglik.max())
        return w / w.sum()

    def preference(self, history_diffs: np.ndarray, query_diffs: np.ndarray) -> np.ndarray:
        """P(first answer preferred) for each query diff (x_first - x_second), posterior mean given history."""
        with np.errstate(invalid="ignore"):
            probs = np.nan_to_num(ndtr(self._scaled(query_diffs)), nan=0.5)      # sign(0)*inf -> nan -> tie
        return self.posterior_weights(history_diffs) @ probs


def _score(prob_chosen: np.ndarray) -> np.ndarray:
    """1 when the chosen answer is predicted, 0 when the rejected one is, 0.5 on an exact tie."""
    return np.where(prob_chosen > 0.5, 1.0, np.where(prob_chosen < 0.5, 0.0, 0.5))


def _logistic_regression_coef(history_diffs: np.ndarray, c: float) -> np.ndarray:
    """Per-user weights of a logistic regression on the history (zeros when there is none)."""
    if len(history_diffs) == 0:
        return np.zeros(history_diffs.shape[1] if history_diffs.ndim == 2 else 0)
    from sklearn.linear_model import LogisticRegression

    x = np.vstack([history_diffs, -history_diffs])
    y = np.r_[np.ones(len(history_diffs)), np.zeros(len(history_diffs))]
    return LogisticRegression(fit_intercept=False, C=c).fit(x, y).coef_[0]


def _logistic_regression_probs(history_diffs: np.ndarray, query_diffs: np.ndarray, c: float) -> np.ndarray:
    if len(history_diffs) == 0:
        return np.full(len(query_diffs), 0.5)
    margins = query_diffs @ _logistic_regression_coef(history_diffs, c)
    return np.where(margins > 0, 1.0, np.where(margins < 0, 0.0, 0.5))


def _predict(name: str, prior: WorldPrior, hist: np.ndarray, query: np.ndarray, weights: np.ndarray,
             lr_c: float) -> np.ndarray:
    """P(chosen preferred) for each query diff, by one reference predictor."""
    if name == "oracle":
        return prior.preference(hist, query)
    if name == "logistic_regression":
        return _logistic_regression_probs(hist, query, lr_c)
    if name == "no_history":
        return prior.preference(hist[:0], query)
    return 0.5 + 0.5 * np.sign(query @ weights)      # true_weights


def history_diffs(world: World, user_id: str, history_size: int) -> np.ndarray:
    """(h, attributes) rows x_chosen - x_rejected of the user's first ``history_size`` train pairs."""
    return np.array([p.differing for p in world.history(user_id, history_size)]).reshape(
        -1, len(world.attribute_names))


def estimated_weights(world: World, user_id: str, predictor: str, history_size: int = 3, *,
                      prior: WorldPrior | None = None, lr_c: float = 10.0) -> np.ndarray:
    """The user's weight vector as each reference predictor knows it, so that it can score single answers
    (utility w_hat . x): ``oracle`` the posterior mean given the history (its expected utility is Bayes-optimal),
    ``logistic_regression`` the per-user coefficients, ``no_history`` the prior mean, ``true_weights`` the truth."""
    if predictor not in REFERENCES:
        raise ValueError(f"unknown reference predictor {predictor!r}; known: {REFERENCES}")
    if predictor == "true_weights":
        return world.user(user_id).weights.astype(np.float64)
    hist = history_diffs(world, user_id, history_size)
    if predictor == "logistic_regression":
        return _logistic_regression_coef(hist, lr_c)
    prior = prior or WorldPrior.of(world)
    if predictor == "no_history":
        hist = hist[:0]
    return prior.posterior_weights(hist) @ prior.samples


def held_out_by_user(world: World, users: UserGroup, splits: tuple[str, ...]):
    """(user, their held-out pairs in ``splits``) for each user of the group that has any, in world order."""
    for user in world.users:
        if users != "all" and user.cold_start != (users == "cold_start"):
            continue
        held_out = [p for p in world.pairs_of(user.user_id) if p.split in splits]
        if held_out:
            yield user, held_out


def reference_scores(world: World, history_size: int = 3, *, users: UserGroup = "seen",
                     splits: tuple[str, ...] = ("val", "test"), n_samples: int | None = None,
                     lr_c: float = 10.0, predictors: tuple[str, ...] = REFERENCES) -> dict[str, np.ndarray]:
    """Per-pair scores (1 / 0.5 / 0) of each reference predictor, pairs in world order; plus ``pair_ids`` and
    ``user_ids``."""
    unknown = set(predictors) - set(REFERENCES)
    if unknown:
        raise ValueError(f"unknown reference predictors {sorted(unknown)}; known: {REFERENCES}")
    prior = WorldPrior.of(world, n_samples)
    out: dict[str, list] = {name: [] for name in predictors}
    pair_ids: list[str] = []
    user_ids: list[str] = []
    for user, held_out in held_out_by_user(world, users, splits):
        hist = history_diffs(world, user.user_id, history_size)
        query = np.array([p.differing for p in held_out])
        for name in predictors:
            out[name].append(_score(_predict(name, prior, hist, query, user.weights, lr_c)))
        pair_ids.extend(p.pair_id for p in held_out)
        user_ids.extend(user.user_id for _ in held_out)
    scores = {k: np.concatenate(v) if v else np.zeros(0) for k, v in out.items()}
    scores["pair_ids"] = np.array(pair_ids, dtype=object)
    scores["user_ids"] = np.array(user_ids, dtype=object)
    return scores


def reference_accuracies(world: World, history_size: int = 3, *, users: UserGroup = "seen",
                         splits: tuple[str, ...] = ("val", "test"), n_samples: int | None = None,
                         n_boot: int = 2000, lr_c: float = 10.0) -> dict[str, Estimate]:
    """Accuracy with a 95% bootstrap CI of each reference predictor (see the module docstring)."""
    key = (history_size, users, tuple(splits), n_samples, n_boot, lr_c)
    if key in world._reference_cache:
        return world._reference_cache[key]
    scores = reference_scores(world, history_size, users=users, splits=splits, n_samples=n_samples, lr_c=lr_c)
    result = {}
    users = cluster_ids(scores["user_ids"])
    for name in REFERENCES:
        s = scores[name]
        lo, hi = bootstrap_ci(s, stream(world.config.seed, "bootstrap"), n_boot, clusters=users if len(s) else None)
        result[name] = Estimate(float(s.mean()) if len(s) else float("nan"), lo, hi, len(s))
    world._reference_cache[key] = result
    return result


def reference_summary(world: World, history_size: int = 3) -> dict[str, dict[str, dict]]:
    """The reference accuracies a shard manifest reports: ``reference`` (seen users, ``history_size`` history
    pairs, val + test) and, when the world has cold-start users, ``reference_cold_start`` (one history pair,
    test)."""
    out = {"reference": {k: v.as_dict() for k, v in reference_accuracies(world, history_size=history_size).items()}}
    if any(u.cold_start for u in world.users):
        out["reference_cold_start"] = {k: v.as_dict() for k, v in reference_accuracies(
            world, history_size=1, users="cold_start", splits=("test",)).items()}
    return out


def estimate_accuracy(world: World, predictor: str, history_size: int = 3, *, users: UserGroup = "seen",
                      splits: tuple[str, ...] = ("val", "test"), n_boot: int = 2000,
                      lr_c: float = 10.0) -> Estimate:
    """Pairwise accuracy on the held-out pairs of the scorer ``w_hat . x`` (``estimated_weights``): the benchmark
    accuracy of a ``world_estimate`` reward model. It equals the reference accuracy for ``true_weights`` and
    ``logistic_regression``; for ``oracle`` and ``no_history`` it ranks by the posterior-mean utility, not by the
    posterior preference probability, and may differ from the reference by a little."""
    prior = WorldPrior.of(world)
    scores: list[float] = []
    user_ids: list[str] = []
    for user, held_out in held_out_by_user(world, users, splits):
        w = estimated_weights(world, user.user_id, predictor, history_size, prior=prior, lr_c=lr_c)
        margins = np.array([p.differing for p in held_out]) @ w
        scores += _score(0.5 + 0.5 * np.sign(margins)).tolist()
        user_ids += [user.user_id] * len(held_out)
    s = np.asarray(scores)
    lo, hi = bootstrap_ci(s, stream(world.config.seed, "bootstrap"), n_boot,
                          clusters=cluster_ids(user_ids) if user_ids else None)
    return Estimate(float(s.mean()) if len(s) else float("nan"), lo, hi, len(s))


def population_agreement(world: World, user_ids: list[str] | None = None) -> dict[str, float]:
    """user id -> cosine between the user's true weights and the population's preference (the prior mean that
    the ``no_history`` predictor scores with): above 0 the user shares the population's taste, below 0 a reward
    that ignores who asks pushes the policy away from what this user wants."""
    population = WorldPrior.of(world).samples.mean(axis=0)
    out = {}
    for uid in user_ids if user_ids is not None else [u.user_id for u in world.users]:
        w = world.user(uid).weights.astype(np.float64)
        norms = float(np.linalg.norm(w) * np.linalg.norm(population))
        out[uid] = float(w @ population) / norms if norms > 0 else 0.0
    return out
