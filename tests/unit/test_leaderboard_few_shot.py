"""The few-shot curve's cells when a model fails to score some pairs (a prompt over its engine's window, an
unparsable chain): every pair of the set stays in, an unscored one as a coin flip, and the table says how many."""
from __future__ import annotations

import pytest

from pr_rlhf.leaderboard.board import few_shot_board, few_shot_frames, few_shot_markdown, few_shot_record


def _users(n: int) -> dict[str, str]:
    return {f"p{i}": f"u{i // 4}" for i in range(n)}


def test_an_unscored_pair_counts_as_a_coin_flip_and_is_counted():
    users = _users(800)
    scored = {"p0": 1.0, "p1": 1.0, "p2": 1.0}     # 797 of 800 failed
    record = few_shot_record(0, "genrm", 8, users, scored, n_bootstrap=200, seed=0)
    assert record["pairs"] == 800 and record["users"] == 200 and record["unscored"] == 797
    assert record["accuracy"] == pytest.approx((3 + 0.5 * 797) / 800)
    assert record["ci_high"] - record["ci_low"] < 0.05        # not a CI over three pairs
    full = few_shot_record(0, "genrm", 4, users, {p: 1.0 for p in users}, n_bootstrap=200, seed=0)
    assert full["unscored"] == 0 and full["accuracy"] == 1.0
    curve = few_shot_board(few_shot_frames([record, full]), n_bootstrap=200, seed=0)
    cells = {(c["method"], c["k"]): c for c in curve["curve"]}
    assert cells["genrm", 8]["unscored"] == 797 and cells["genrm", 4]["unscored"] == 0
    assert cells["genrm", 8]["accuracy"] == pytest.approx(record["accuracy"])
    md = few_shot_markdown(curve)
    assert "797 of 800 pairs unscored" in md and "coin flip" in md
    # a row on a sample of users says how many pairs it scored
    sample = few_shot_record(0, "judge", 8, dict(list(users.items())[:120]), {}, n_bootstrap=50, seed=0)
    md = few_shot_markdown(few_shot_board(few_shot_frames([record, full, sample]), n_bootstrap=50, seed=0))
    assert "| genrm | 800 |" in md and "| judge | 120 |" in md, md


def test_a_pair_outside_the_set_is_refused():
    with pytest.raises(ValueError, match="p900"):
        few_shot_record(0, "genrm", 1, _users(8), {"p900": 1.0}, n_bootstrap=50, seed=0)


def test_every_pair_of_a_set_gets_an_outcome():
    from pr_rlhf.leaderboard.board import with_coin_flips

    assert with_coin_flips({"a": 1.0, "c": 0.0}, ["a", "b", "c"]) == {"a": 1.0, "b": 0.5, "c": 0.0}
