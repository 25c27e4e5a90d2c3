"""Honest accuracy accounting (pr_rlhf.eval.metrics) and the report files (pr_rlhf.eval.report)."""
import json
import random

import numpy as np
import pyarrow.parquet as pq
import pytest

from pr_rlhf.eval.metrics import (
    Prediction,
    flatten_summary,
    summarize,
    summarize_groups,
)
from pr_rlhf.eval.report import (
    fmt_accuracy_ci,
    fmt_pct,
    markdown_table,
    metrics_for_tracking,
    normalize_references,
    read_predictions,
    write_report,
)
from pr_rlhf.stats import mean_ci


def pw(pair, chosen_slot, predicted, *, user="u0", subset="S", inputs="none", order=0, **kw):
    return Prediction.pairwise(pair_id=str(pair), user_id=user, subset=subset, inputs=inputs,
                               chosen_slot=chosen_slot, predicted=predicted, order=order, **kw)


def pt(pair, sc, sr, *, user="u0", subset="S", inputs="none", **kw):
    return Prediction.pointwise(pair_id=str(pair), user_id=user, subset=subset, inputs=inputs,
                                score_chosen=sc, score_rejected=sr, **kw)


# ---------------------------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------------------------

def test_pointwise_constructor_strict_tie_and_missing_score():
    assert pt(1, 2.0, 1.0).correct
    tie = pt(2, 1.0, 1.0)
    assert not tie.correct and tie.tie and tie.error is None
    nan = pt(3, float("nan"), 1.0)
    assert not nan.correct and nan.error == "missing_score" and not nan.tie
    none = pt(4, None, 1.0)
    assert none.error == "missing_score"
    eng = pt(5, None, None, error="engine_error")
    assert eng.error == "engine_error" and not eng.correct


def test_pairwise_constructor_parse_failure_and_tie():
    assert pw(1, "A", "A").correct and not pw(2, "B", "A").correct
    assert pw(3, "B", "b").correct                      # case-insensitive
    bad = pw(4, "A", None)
    assert bad.error == "parse_failure" and bad.predicted == "" and not bad.correct
    assert pw(5, "A", "C").error == "parse_failure"
    tie = pw(6, "A", "A", tie=True)                     # a declared tie never counts, whatever was parsed
    assert tie.tie and not tie.correct and tie.predicted == ""
    eng = pw(7, "A", "A", error="engine_timeout")
    assert eng.error == "engine_timeout" and not eng.correct


@pytest.mark.parametrize("kwargs", [
    {"mode": "listwise"},
    {"correct": True, "tie": True},
    {"correct": True, "error": "parse_failure", "predicted": ""},
    {"tie": True, "error": "x", "correct": False},
    {"chosen_slot": ""},                                # pairwise needs a slot
    {"predicted": "B"},                                 # correct=True but predicted != chosen_slot
    {"order": 2},
    {"error": ""},
])
def test_inconsistent_prediction_rejected(kwargs):
    base = {"pair_id": "p", "user_id": "u", "subset": "S", "mode": "pairwise", "inputs": "none", "correct": True,
                "chosen_slot": "A", "predicted": "A"}
    base.update(kwargs)
    with pytest.raises(ValueError):
        Prediction(**base)


# ---------------------------------------------------------------------------------------------------------------
# Accounting
# ---------------------------------------------------------------------------------------------------------------

def test_ties_and_failures_count_wrong_and_are_reported():
    preds = [pt(1, 2.0, 1.0), pt(2, 1.0, 3.0), pt(3, 1.5, 1.5), pt(4, None, 1.0), pt(5, 0.5, None, error="oom")]
    s = summarize(preds, n_bootstrap=200, seed=0)
    assert s["accuracy"] == pytest.approx(1 / 5)          # 1 right; the tie and both failures stay in the denominator
    assert s["n"] == 5 and s["n_correct"] == 1
    assert s["ties"] == 1 and s["tie_rate"] == pytest.approx(0.2)
    assert s["failures"] == 2 and s["failure_rate"] == pytest.approx(0.4)
    assert s["failures_by_kind"] == {"missing_score": {"count": 1, "rate": 0.2}, "oom": {"count": 1, "rate": 0.2}}
    # pointwise: scores over verdicts with both scores only; no slots
    assert s["n_scored"] == 3
    assert s["mean_score_chosen"] == pytest.approx((2.0 + 1.0 + 1.5) / 3)
    assert s["mean_score_rejected"] == pytest.approx((1.0 + 3.0 + 1.5) / 3)
    assert s["mean_margin"] == pytest.approx((1.0 - 2.0 + 0.0) / 3)
    assert s["accuracy_chosen_a"] is None and s["position_bias"] is None and s["predicted_a_rate"] is None


def test_pairwise_failures_by_kind():
    preds = [pw(1, "A", "A"), pw(2, "A", "garbage"), pw(3, "B", None), pw(4, "B", "B", error="engine_timeout"),
             pw(5, "A", "A", tie=True), pw(6, "B", "B"), pw(7, "A", "B"), pw(8, "B", "B")]
    s = summarize(preds, n_bootstrap=100)
    assert s["accuracy"] == pytest.approx(3 / 8)
    assert s["failures"] == 3 and s["ties"] == 1
    assert s["failures_by_kind"]["parse_failure"]["count"] == 2
    assert s["failures_by_kind"]["engine_timeout"]["rate"] == pytest.approx(1 / 8)


def test_always_a_judge_slot_accuracies_and_position_bias():
    rng = random.Random(0)
    slots = ["A"] * 30 + ["B"] * 70
    rng.shuffle(slots)
    preds = [pw(i, slot, "A") for i, slot in enumerate(slots)]
    s = summarize(preds, n_bootstrap=200)
    assert s["accuracy"] == pytest.approx(0.30)
    assert s["accuracy_chosen_a"] == 1.0 and s["accuracy_chosen_b"] == 0.0
    assert s["n_chosen_a"] == 30 and s["n_chosen_b"] == 70
    assert s["position_bias"] == 1.0
    assert s["predicted_a_rate"] == 1.0


def test_slot_accuracies_partial_bias():
    # chosen in A: 8/10 right; chosen in B: 5/10 right
    preds = ([pw(i, "A", "A" if i < 8 else "B") for i in range(10)]
             + [pw(10 + i, "B", "B" if i < 5 else "A") for i in range(10)])
    s = summarize(preds, n_bootstrap=100)
    assert s["accuracy_chosen_a"] == pytest.approx(0.8) and s["accuracy_chosen_b"] == pytest.approx(0.5)
    assert s["position_bias"] == pytest.approx(0.3)
    assert s["accuracy"] == pytest.approx(13 / 20)


def test_per_subset_and_user_macro():
    preds = ([pw(i, "A", "A", subset="X", user=f"x{i}") for i in range(10)]                      # X: 100%
             + [pw(i, "A", "B", subset="Y", user="y0") for i in range(30)]                       # Y: 0%
             + [pw(100, "A", "A", subset="Y", user="y1")])                                       # y1: 100%
    s = summarize(preds, n_bootstrap=200)
    assert s["accuracy"] == pytest.approx(11 / 41)
    assert s["subsets"]["X"]["accuracy"] == 1.0 and s["subsets"]["X"]["n"] == 10
    assert s["subsets"]["Y"]["accuracy"] == pytest.approx(1 / 31)
    assert s["subset_macro_accuracy"] == pytest.approx((1.0 + 1 / 31) / 2)
    # users: x0..x9 (1.0 each), y0 (0.0), y1 (1.0)
    assert s["n_users"] == 12
    assert s["user_macro_accuracy"] == pytest.approx(11 / 12)
    for sub in s["subsets"].values():
        assert sub["ci_low"] <= sub["accuracy"] <= sub["ci_high"]
    # same pair id in two subsets is two different pairs
    assert s["n_pairs"] == 41


def test_same_user_id_in_two_subsets_is_two_users():
    preds = [pw(1, "A", "A", subset="X", user="u"), pw(2, "A", "B", subset="Y", user="u"),
             pw(3, "A", "B", subset="Y", user="u")]
    s = summarize(preds, n_bootstrap=50)
    assert s["n_users"] == 2 and s["user_macro_accuracy"] == pytest.approx(0.5)


def test_duplicates_and_mixed_groups_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        summarize([pw(1, "A", "A"), pw(1, "B", "B")])
    with pytest.raises(ValueError, match="summarize_groups"):
        summarize([pw(1, "A", "A"), pw(2, "A", "A", inputs="plan")])
    with pytest.raises(ValueError):
        summarize([])


# ---------------------------------------------------------------------------------------------------------------
# Both orders
# ---------------------------------------------------------------------------------------------------------------

def both_order_preds(patterns, users_of=None):
    """patterns: per pair, a (verdict order 0, verdict order 1) of 'c' correct, 'w' wrong, 'f' failure, 't' tie.
    Order 0 puts the chosen answer in A, order 1 in B. Each pair is its own user's (``users_of``: pair -> user)."""
    out = []
    for i, pat in enumerate(patterns):
        user = users_of(i) if users_of else f"u{i}"
        for order, (v, slot) in enumerate(zip(pat, ("A", "B"))):
            other = "B" if slot == "A" else "A"
            if v == "c":
                out.append(pw(i, slot, slot, order=order, user=user))
            elif v == "w":
                out.append(pw(i, slot, other, order=order, user=user))
            elif v == "f":
                out.append(pw(i, slot, None, order=order, user=user))
            else:
                out.append(pw(i, slot, "A", order=order, tie=True))
    return out


def test_both_order_consistency_and_pair_accuracy():
    preds = both_order_preds(["cc", "cc", "ww", "cw", "wc", "cf", "tt", "cc"])
    s = summarize(preds, n_bootstrap=200)
    assert s["both_orders"] and s["n_pairs_both_orders"] == 8 and s["n_pairs"] == 8 and s["n"] == 16
    # consistent: cc, cc, ww, cc  (cw / wc disagree; failures and ties are inconsistent)
    assert s["consistency_rate"] == pytest.approx(4 / 8)
    assert s["pair_accuracy_both_correct"] == pytest.approx(3 / 8)
    assert s["accuracy"] == pytest.approx(9 / 16)
    assert s["failures"] == 1 and s["ties"] == 2
    single = summarize([pw(1, "A", "A")], n_bootstrap=20)
    assert not single["both_orders"] and single["consistency_rate"] is None


def test_summarize_uses_the_cluster_bootstrap():
    rng = np.random.default_rng(2)
    patterns = ["cc" if r else "ww" for r in rng.random(300) < 0.6]
    s = summarize(both_order_preds(patterns), n_bootstrap=1000, seed=5)
    correct = np.array([c == "c" for pat in patterns for c in pat], dtype=float)
    naive = mean_ci(correct, 1000, 5)
    assert s["n_pairs"] == 300 and s["n"] == 600 and s["n_users"] == 300 and s["ci_unit"] == "user"
    assert (s["ci_high"] - s["ci_low"]) > 1.25 * (naive[1] - naive[0])
    # six pairs per user that go right or wrong together: the CI resamples the 50 users, not the 300 pairs
    per_user = [("cc" if rng.random() < 0.6 else "ww") for _ in range(50)]
    patterns = [pat for pat in per_user for _ in range(6)]
    by_user = summarize(both_order_preds(patterns, users_of=lambda i: f"u{i // 6}"), n_bootstrap=1000, seed=5)
    by_pair = summarize(both_order_preds(patterns), n_bootstrap=1000, seed=5)
    assert by_user["n_users"] == 50 and by_user["n_pairs"] == 300 and by_user["accuracy"] == by_pair["accuracy"]
    assert (by_user["ci_high"] - by_user["ci_low"]) > 2 * (by_pair["ci_high"] - by_pair["ci_low"])


def test_deterministic_and_order_independent():
    rng = random.Random(4)
    preds = [pw(i, rng.choice("AB"), rng.choice(["A", "B", "B", None]), user=f"u{i % 7}",
                subset=rng.choice(["X", "Y", "Z"])) for i in range(300)]
    a = summarize(preds, n_bootstrap=500, seed=11)
    shuffled = preds[:]
    rng.shuffle(shuffled)
    b = summarize(shuffled, n_bootstrap=500, seed=11)
    assert a == b
    c = summarize(preds, n_bootstrap=500, seed=12)
    assert c["accuracy"] == a["accuracy"] and (c["ci_low"], c["ci_high"]) != (a["ci_low"], a["ci_high"])
    assert mean_ci(np.array([1, 0, 1, 1.0]), 100, 7) == mean_ci(np.array([1, 0, 1, 1.0]), 100, 7)


def test_summarize_groups_order_and_equivalence():
    preds = ([pw(i, "A", "A" if i % 3 else "B", inputs="plan") for i in range(30)]
             + [pw(i, "B", "B", inputs="none") for i in range(20)]
             + [pt(i, float(i % 2), 0.5, inputs="profile") for i in range(20)]
             + [pt(i, 1.0, 0.0, inputs="none") for i in range(20)])
    groups = summarize_groups(preds, n_bootstrap=300, seed=3)
    assert list(groups) == ["pointwise/none", "pointwise/profile", "pairwise/none", "pairwise/plan"]
    plan_only = [p for p in preds if p.mode == "pairwise" and p.inputs == "plan"]
    assert groups["pairwise/plan"] == summarize(plan_only, n_bootstrap=300, seed=3)
    assert groups["pointwise/profile"]["accuracy"] == pytest.approx(0.5)
    flat = flatten_summary(groups["pairwise/plan"], "eval/pairwise/plan")
    assert flat["eval/pairwise/plan/accuracy"] == pytest.approx(20 / 30)
    assert flat["eval/pairwise/plan/subsets/S/accuracy"] == pytest.approx(20 / 30)


# ---------------------------------------------------------------------------------------------------------------
# Report files
# ---------------------------------------------------------------------------------------------------------------

class _Estimate:                          # shaped like pr_rlhf.world.reference.Estimate
    def __init__(self, accuracy, ci_low, ci_high):
        self.accuracy, self.ci_low, self.ci_high = accuracy, ci_low, ci_high


def _mixed_preds():
    rng = random.Random(9)
    preds = []
    for inputs in ("none", "profile", "plan"):
        for i in range(40):
            subset = ["Art", "Life"][i % 2]
            slot = rng.choice("AB")
            for order in (0, 1):
                s = slot if order == 0 else ("B" if slot == "A" else "A")
                verdict = rng.choice([s, s, "A", "B", None])
                preds.append(pw(f"p{i}", s, verdict, user=f"u{i % 5}", subset=subset, inputs=inputs,
                                order=order, raw=f"... Result: {verdict}"))
        for i in range(40):
            preds.append(pt(f"p{i}", rng.choice([0.1, 0.5, 0.9, None]), 0.5, user=f"u{i % 5}",
                            subset=["Art", "Life"][i % 2], inputs=inputs))
    return preds


def test_report_files_written_and_readable(tmp_path):
    preds = _mixed_preds()
    refs = {"oracle": _Estimate(0.81, 0.78, 0.84), "logistic_regression": (0.70, 0.66, 0.74), "chance": 0.5}
    rep = write_report(tmp_path / "run", preds, n_bootstrap=300, seed=1, references=refs, title="eval test",
                       extra={"recipe": "quickstart"})
    for path in rep.paths:
        assert path.exists() and path.stat().st_size > 0

    # parquet round trip
    back = read_predictions(rep.predictions)
    assert back == preds
    table = pq.read_table(rep.predictions)
    assert table.num_rows == len(preds)
    assert table.schema.field("score_chosen").type == "double"

    # metrics JSON: strict JSON (no NaN), same numbers
    doc = json.loads(rep.metrics.read_text())
    assert set(doc["groups"]) == set(rep.summaries)
    assert doc["groups"]["pairwise/plan"]["accuracy"] == pytest.approx(rep.summaries["pairwise/plan"]["accuracy"])
    assert doc["references"]["oracle"] == {"accuracy": 0.81, "ci_low": 0.78, "ci_high": 0.84}
    assert doc["references"]["chance"]["ci_low"] is None
    assert doc["recipe"] == "quickstart"
    assert "NaN" not in rep.metrics.read_text()

    # markdown: one row per (mode, inputs), with the numbers
    md = rep.markdown.read_text()
    assert md.startswith("# eval test")
    for s in rep.summaries.values():
        row = next(line for line in md.splitlines() if line.startswith(f"| {s['mode']} | {s['inputs']} |"))
        assert fmt_accuracy_ci(s) in row
        assert f"{s['ties']} (" in row and f"{s['failures']} (" in row
        for name in ("Art", "Life"):
            assert fmt_accuracy_ci(s["subsets"][name]) in row
        if s["mode"] == "pairwise":
            assert f"{fmt_pct(s['accuracy_chosen_a'])} / {fmt_pct(s['accuracy_chosen_b'])}" in row
            assert fmt_pct(s["position_bias"]) in row
            assert fmt_pct(s["consistency_rate"]) in row
    assert "| oracle | 81.00 [78.00, 84.00] |" in md
    assert "| chance | 50.00 |" in md

    # PNG
    assert rep.figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # tracking metrics: flat, no '@'
    flat = metrics_for_tracking(rep.summaries)
    assert flat["eval/pairwise/plan/accuracy"] == pytest.approx(rep.summaries["pairwise/plan"]["accuracy"])
    assert not any("@" in k for k in flat)


def test_markdown_table_numbers_small_example():
    preds = [pw(1, "A", "A"), pw(2, "B", "A"), pw(3, "A", None), pw(4, "B", "B")]
    s = summarize_groups(preds, n_bootstrap=100, seed=0)
    md = markdown_table(s)
    assert "| pairwise | none | 4 | 50.00 [" in md
    assert "1 (25.0%): parse_failure 1" in md
    assert "50.00 / 50.00" in md


def test_references_normalized():
    refs = normalize_references({"a": 0.5, "b": (0.6, 0.5, 0.7), "c": {"accuracy": 0.7}, "d": _Estimate(0.8, 0.7, 0.9)})
    assert [(r.name, r.accuracy, r.ci_low) for r in refs] == [("a", 0.5, None), ("b", 0.6, 0.5), ("c", 0.7, None),
                                                              ("d", 0.8, 0.7)]
    with pytest.raises(TypeError):
        normalize_references({"x": "high"})
