"""Prediction records and the project's honest accuracy accounting (pure numpy).

One record type, :class:`Prediction`, holds one verdict of one reward model on one chosen/rejected pair, for both
evaluation modes (docs/protocols.md section 3):

- **pointwise**: a scalar RM scores chosen and rejected separately; correct iff ``score_chosen > score_rejected``
  strictly. Equal scores are a *tie*; a missing or non-finite score is a *failure*.
- **pairwise**: a generative judge sees both answers, the chosen one in slot ``chosen_slot`` ("A" or "B"), and
  names a slot (``predicted``); correct iff it names the chosen slot. A verdict that cannot be parsed, or an engine
  error, is a *failure*; a judge that declares both equal (e.g. equal SEC scores) is a *tie*.

Honest accounting (stricter than the papers): ties and failures count as **wrong** (they stay in the denominator)
and are also reported separately, failures by kind. Use the constructors :meth:`Prediction.pointwise` /
:meth:`Prediction.pairwise`, which derive ``correct``/``tie``/``error`` consistently; the plain constructor
validates that the three agree.

**Both-order judging**: a pair judged twice, once per slot order, gives two records with the same pair and
``order`` 0 and 1. Accuracy is then the mean over all verdicts.

**The bootstrap unit is the user** (a cluster bootstrap, ``pr_rlhf.stats``): every CI resamples users with all
their verdicts, since a user's pairs share one history (and both verdicts of a pair share everything), so they are
not independent.

:func:`summarize` turns the records of one (mode, inputs) group into a JSON-ready dict (schema in its docstring);
:func:`summarize_groups` does it for every group. Everything is seeded and deterministic: the same records and
seed give the same numbers, whatever order the records arrive in.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

import numpy as np

from pr_rlhf.stats import CI_LEVEL, bootstrap_ci, cluster_ids, seeded_rng

MODES = ("pointwise", "pairwise")
KNOWN_INPUTS = ("none", "profile", "plan", "history")     # EvalConfig.inputs; other non-empty names are accepted too
SLOTS = ("A", "B")

Mode = Literal["pointwise", "pairwise"]
Slot = Literal["A", "B", ""]

# failure kinds the constructors fill in when the caller gave none
MISSING_SCORE = "missing_score"     # pointwise: a score is None or not finite
PARSE_FAILURE = "parse_failure"     # pairwise: the verdict names neither slot


@dataclass(frozen=True)
class Prediction:
    """One verdict on one pair. ``correct`` is False whenever ``tie`` or ``error`` is set.

    ``order`` is 0, or 0/1 when each pair is judged in both slot orders; ``chosen_slot`` is "" for pointwise;
    ``predicted`` is the slot the judge named ("" for pointwise, ties and failures); ``score_*`` are the RM's
    scores (pointwise, or the per-answer scores of a scoring judge such as P-GenRM's SEC), None when absent;
    ``error`` is None or the failure kind (e.g. "parse_failure", "engine_timeout"); ``raw`` optionally keeps the
    judge's output text for inspection.
    """

    pair_id: str
    user_id: str
    subset: str
    mode: str
    inputs: str
    correct: bool
    tie: bool = False
    error: str | None = None
    order: int = 0
    chosen_slot: str = ""
    predicted: str = ""
    score_chosen: float | None = None
    score_rejected: float | None = None
    raw: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"Prediction {self.pair_id!r}: mode must be one of {MODES}, got {self.mode!r}")
        if not isinstance(self.inputs, str) or not self.inputs:
            raise ValueError(f"Prediction {self.pair_id!r}: inputs must be a non-empty string")
        if self.order not in (0, 1):
            raise ValueError(f"Prediction {self.pair_id!r}: order must be 0 or 1, got {self.order!r}")
        if self.chosen_slot not in ("A", "B", ""):
            raise ValueError(f"Prediction {self.pair_id!r}: chosen_slot must be 'A', 'B' or '', "
                             f"got {self.chosen_slot!r}")
        if self.predicted not in ("A", "B", ""):
            raise ValueError(f"Prediction {self.pair_id!r}: predicted must be 'A', 'B' or '', got {self.predicted!r}")
        if self.mode == "pairwise" and self.chosen_slot not in SLOTS:
            raise ValueError(f"Prediction {self.pair_id!r}: a pairwise prediction needs chosen_slot 'A' or 'B'")
        if self.error == "":
            raise ValueError(f"Prediction {self.pair_id!r}: error must be None or a non-empty kind")
        if self.correct and (self.tie or self.error is not None):
            raise ValueError(f"Prediction {self.pair_id!r}: a tie or a failure cannot be correct")
        if self.tie and self.error is not None:
            raise ValueError(f"Prediction {self.pair_id!r}: a verdict is either a tie or a failure, not both")
        if self.mode == "pairwise" and self.error is None and not self.tie:
            if self.predicted not in SLOTS:
                raise ValueError(f"Prediction {self.pair_id!r}: a valid pairwise verdict must name a slot "
                                 f"(set error= for a parse failure, tie=True for a tie)")
            if self.correct != (self.predicted == self.chosen_slot):
                raise ValueError(f"Prediction {self.pair_id!r}: correct disagrees with predicted/chosen_slot")

    # ---------------------------------------------------------------------------------------------------------
    @classmethod
    def pointwise(cls, *, pair_id: str, user_id: str, subset: str, inputs: str, score_chosen: float | None,
                  score_rejected: float | None, error: str | None = None, order: int = 0,
                  raw: str | None = None) -> Prediction:
        """A scalar-RM verdict: correct iff chosen > rejected strictly; equal scores are a tie; a missing or
        non-finite score is a failure (kind ``error`` if given, else "missing_score")."""
        sc, sr = _as_float(score_chosen), _as_float(score_rejected)
        if error is None and (sc is None or sr is None or not math.isfinite(sc) or not math.isfinite(sr)):
            error = MISSING_SCORE
        tie = error is None and sc == sr
        correct = error is None and sc > sr
        return cls(pair_id=str(pair_id), user_id=str(user_id), subset=str(subset), mode="pointwise",
                   inputs=inputs, correct=bool(correct), tie=bool(tie), error=error, order=order,
                   score_chosen=sc, score_rejected=sr, raw=raw)

    @classmethod
    def pairwise(cls, *, pair_id: str, user_id: str, subset: str, inputs: str, chosen_slot: str,
                 predicted: str | None, error: str | None = None, tie: bool = False, order: int = 0,
                 score_chosen: float | None = None, score_rejected: float | None = None,
                 raw: str | None = None) -> Prediction:
        """A judge verdict: correct iff ``predicted == chosen_slot``. ``predicted`` None/"" (or anything but
        "A"/"B") without ``error`` and without ``tie`` is a failure of kind "parse_failure"."""
        pred = (predicted or "").strip().upper()
        if error is not None:
            pred, tie = "", False
        elif tie:
            pred = ""
        elif pred not in SLOTS:
            pred, error = "", PARSE_FAILURE
        correct = error is None and not tie and pred == chosen_slot
        return cls(pair_id=str(pair_id), user_id=str(user_id), subset=str(subset), mode="pairwise",
                   inputs=inputs, correct=bool(correct), tie=bool(tie), error=error, order=order,
                   chosen_slot=chosen_slot, predicted=pred, score_chosen=_as_float(score_chosen),
                   score_rejected=_as_float(score_rejected), raw=raw)

    # ---------------------------------------------------------------------------------------------------------
    @property
    def group(self) -> str:
        """The (mode, inputs) group key, e.g. ``"pairwise/plan"``."""
        return group_key(self.mode, self.inputs)

    @property
    def cluster(self) -> tuple[str, str]:
        """The bootstrap unit: one user (identified within its subset), with every verdict on their pairs."""
        return (self.subset, self.user_id)

    @property
    def pair_key(self) -> tuple[str, str, str]:
        """One pair of one user (both-order verdicts share it)."""
        return (self.subset, self.user_id, self.pair_id)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Prediction:
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in row.items() if k in names}
        for key in ("score_chosen", "score_rejected"):
            kw[key] = _as_float(kw.get(key))
        kw["order"] = int(kw.get("order", 0) or 0)
        for key in ("correct", "tie"):
            kw[key] = bool(kw.get(key, False))
        return cls(**kw)


PREDICTION_FIELDS = tuple(f.name for f in fields(Prediction))


def group_key(mode: str, inputs: str) -> str:
    return f"{mode}/{inputs}"


def _as_float(x: Any) -> float | None:
    if x is None:
        return None
    return float(x)


# --------------------------------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------------------------------

def _mean(x: np.ndarray) -> float | None:
    return float(np.mean(x)) if len(x) else None


def _none_if_nan(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def _sorted(preds: Iterable[Prediction]) -> list[Prediction]:
    """Canonical order, so results never depend on the order records arrive in."""
    return sorted(preds, key=lambda p: (p.subset, p.user_id, p.pair_id, p.order))


def _accuracy_block(correct: np.ndarray, users: np.ndarray, pairs: np.ndarray, n_bootstrap: int, seed: int,
                    *names: str) -> dict:
    """Accuracy with its CI resampling users (``users``, ``pairs``: dense ids per verdict)."""
    if len(correct) == 0:
        return {"accuracy": None, "ci_low": None, "ci_high": None, "n": 0, "n_pairs": 0, "n_users": 0}
    # re-densify the cluster ids of this subset of items
    _, local = np.unique(users, return_inverse=True)
    lo, hi = bootstrap_ci(correct, seeded_rng(seed, *names), n_bootstrap, clusters=local)
    return {"accuracy": float(correct.mean()), "ci_low": _none_if_nan(lo), "ci_high": _none_if_nan(hi),
            "n": len(correct), "n_pairs": len(np.unique(pairs)), "n_users": int(local.max()) + 1}


def summarize(preds: Iterable[Prediction], n_bootstrap: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Metrics of one (mode, inputs) group of predictions; JSON-ready (None where not applicable).

    Keys:

    - ``mode``, ``inputs``, ``group``
    - ``accuracy``, ``ci_low``, ``ci_high`` (95% percentile bootstrap resampling users with all their verdicts),
      ``n`` (verdicts), ``n_pairs``, ``n_users``, ``n_correct``, ``n_bootstrap``, ``seed``, ``ci_unit`` ("user")
    - ``ties``, ``tie_rate``, ``failures``, ``failure_rate``, ``failures_by_kind`` {kind: {count, rate}}
      (rates over all verdicts; ties and failures are counted wrong in ``accuracy``)
    - ``accuracy_chosen_a``, ``accuracy_chosen_b``, ``n_chosen_a``, ``n_chosen_b``, ``position_bias``
      (|acc_A - acc_B|), ``predicted_a_rate`` (share of valid slot verdicts naming A) — pairwise only
    - ``mean_score_chosen``, ``mean_score_rejected``, ``mean_margin``, ``n_scored`` — over verdicts with both
      scores finite (pointwise; pairwise when the judge emits scores)
    - ``subsets`` {subset: {accuracy, ci_low, ci_high, n, n_pairs, n_users}}, ``subset_macro_accuracy`` (mean
      over subsets)
    - ``user_macro_accuracy`` (mean over users of each user's accuracy)
    - ``both_orders`` (True when some pair was judged in both orders) and then ``n_pairs_both_orders``,
      ``consistency_rate`` (pairs whose two verdicts are both valid and pick the same answer, over pairs judged in
      both orders; failures and ties count as inconsistent), ``pair_accuracy_both_correct`` (both verdicts correct)

    Raises ValueError when the predictions mix (mode, inputs) groups (use :func:`summarize_groups`) or when the
    same (pair, order) appears twice.
    """
    preds = _sorted(preds)
    if not preds:
        raise ValueError("summarize: no predictions")
    groups = {p.group for p in preds}
    if len(groups) > 1:
        raise ValueError(f"summarize: predictions mix (mode, inputs) groups {sorted(groups)}; "
                         f"use summarize_groups")
    seen: set = set()
    for p in preds:
        key = (p.pair_key, p.order)
        if key in seen:
            raise ValueError(f"summarize: duplicate verdict for pair {p.pair_id!r} (user {p.user_id!r}, "
                             f"subset {p.subset!r}, order {p.order})")
        seen.add(key)

    n = len(preds)
    mode, inputs = preds[0].mode, preds[0].inputs
    correct = np.array([p.correct for p in preds], dtype=np.float64)
    tie = np.array([p.tie for p in preds], dtype=bool)
    failed = np.array([p.error is not None for p in preds], dtype=bool)
    cid = cluster_ids([p.cluster for p in preds])
    pid = cluster_ids([p.pair_key for p in preds])
    group = group_key(mode, inputs)
    overall = _accuracy_block(correct, cid, pid, n_bootstrap, seed, group, "overall")

    out: dict[str, Any] = {
        "mode": mode, "inputs": inputs, "group": group,
        "accuracy": overall["accuracy"], "ci_low": overall["ci_low"], "ci_high": overall["ci_high"],
        "ci_level": CI_LEVEL, "ci_unit": "user", "n": n, "n_pairs": overall["n_pairs"],
        "n_users": overall["n_users"], "n_correct": int(correct.sum()),
        "n_bootstrap": int(n_bootstrap), "seed": int(seed),
        "ties": int(tie.sum()), "tie_rate": float(tie.mean()),
        "failures": int(failed.sum()), "failure_rate": float(failed.mean()),
    }
    kinds: dict[str, int] = {}
    for p in preds:
        if p.error is not None:
            kinds[p.error] = kinds.get(p.error, 0) + 1
    out["failures_by_kind"] = {k: {"count": c, "rate": c / n} for k, c in sorted(kinds.items())}

    # slot accuracies and position bias
    slots = np.array([p.chosen_slot for p in preds])
    in_a, in_b = slots == "A", slots == "B"
    acc_a, acc_b = _mean(correct[in_a]), _mean(correct[in_b])
    out["accuracy_chosen_a"], out["accuracy_chosen_b"] = acc_a, acc_b
    out["n_chosen_a"], out["n_chosen_b"] = int(in_a.sum()), int(in_b.sum())
    out["position_bias"] = abs(acc_a - acc_b) if acc_a is not None and acc_b is not None else None
    named = np.array([p.predicted for p in preds])
    valid_slot = (named == "A") | (named == "B")
    out["predicted_a_rate"] = float((named[valid_slot] == "A").mean()) if valid_slot.any() else None

    # scores
    sc = np.array([np.nan if p.score_chosen is None else p.score_chosen for p in preds], dtype=np.float64)
    sr = np.array([np.nan if p.score_rejected is None else p.score_rejected for p in preds], dtype=np.float64)
    ok = np.isfinite(sc) & np.isfinite(sr)
    out["n_scored"] = int(ok.sum())
    out["mean_score_chosen"] = _mean(sc[ok])
    out["mean_score_rejected"] = _mean(sr[ok])
    out["mean_margin"] = _mean(sc[ok] - sr[ok])

    # per subset (with CI) and the macro average over subsets
    subsets: dict[str, dict] = {}
    subset_arr = np.array([p.subset for p in preds])
    for name in sorted(set(subset_arr.tolist())):
        m = subset_arr == name
        subsets[name] = _accuracy_block(correct[m], cid[m], pid[m], n_bootstrap, seed, group, "subset", name)
    out["subsets"] = subsets
    out["subset_macro_accuracy"] = float(np.mean([s["accuracy"] for s in subsets.values()]))

    # per user (a user is identified within its subset)
    per_user: dict[tuple[str, str], list[float]] = {}
    for p, c in zip(preds, correct):
        per_user.setdefault((p.subset, p.user_id), []).append(c)
    out["user_macro_accuracy"] = float(np.mean([np.mean(v) for v in per_user.values()]))

    # both-order consistency
    by_pair: dict[tuple, dict[int, Prediction]] = {}
    for p in preds:
        by_pair.setdefault(p.pair_key, {})[p.order] = p
    both = [v for v in by_pair.values() if len(v) == 2]
    out["both_orders"] = bool(both)
    if both:
        consistent = [v[0].error is None and v[1].error is None and not v[0].tie and not v[1].tie
                      and v[0].correct == v[1].correct for v in both]
        out["n_pairs_both_orders"] = len(both)
        out["consistency_rate"] = float(np.mean(consistent))
        out["pair_accuracy_both_correct"] = float(np.mean([v[0].correct and v[1].correct for v in both]))
    else:
        out["n_pairs_both_orders"] = 0
        out["consistency_rate"] = None
        out["pair_accuracy_both_correct"] = None
    return out


def _group_sort_key(key: tuple[str, str]) -> tuple:
    mode, inputs = key
    mi = MODES.index(mode) if mode in MODES else len(MODES)
    ii = KNOWN_INPUTS.index(inputs) if inputs in KNOWN_INPUTS else len(KNOWN_INPUTS)
    return (mi, ii, mode, inputs)


def summarize_groups(preds: Iterable[Prediction], n_bootstrap: int = 1000, seed: int = 0) -> dict[str, dict]:
    """:func:`summarize` for every (mode, inputs) group, keyed ``"mode/inputs"``, in a fixed order (pointwise
    before pairwise; inputs none, profile, plan, then others alphabetically). Each group's bootstrap stream is
    derived from ``seed`` and the group key, so adding a group never changes another group's CI, and
    ``summarize_groups(p)[k] == summarize(group k of p)``."""
    buckets: dict[tuple[str, str], list[Prediction]] = {}
    for p in preds:
        buckets.setdefault((p.mode, p.inputs), []).append(p)
    return {group_key(*key): summarize(buckets[key], n_bootstrap=n_bootstrap, seed=seed)
            for key in sorted(buckets, key=_group_sort_key)}


def flatten_summary(summary: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric entries of a summary as flat ``a/b/c`` keys (for mlflow metrics); None and strings dropped."""
    out: dict[str, float] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}/{k}" if path else str(k))
        elif isinstance(node, (bool, int, float, np.integer, np.floating)):
            out[path] = float(node)

    walk(summary, prefix.rstrip("/"))
    return out
