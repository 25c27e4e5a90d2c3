"""`Leaderboard.run`'s bookkeeping with each world's work stubbed (the e2e runs it for real on one reported world):
the reported worlds make the table and the few-shot curve, the development worlds their own apart, and nothing of
one reaches the other."""
from __future__ import annotations

import json

import numpy as np

from pr_rlhf.configs.leaderboard import LeaderboardConfig
from pr_rlhf.eval.worlds import WorldOutcomes
from pr_rlhf.leaderboard.board import few_shot_record
from workers.leaderboard import Leaderboard


def frame(seed: int, accuracy: float) -> WorldOutcomes:
    """A world of 6 users (3 seen, 3 cold) and 4 pairs each, two rows: the floor right on ``accuracy`` of the pairs,
    PAL on every pair."""
    rng = np.random.default_rng(seed)
    users = [f"u{i}" for i in range(6) for _ in range(4)]
    pairs = [f"w{seed}p{i}" for i in range(len(users))]
    groups = ["seen" if int(u[1:]) < 3 else "cold" for u in users]
    out = WorldOutcomes(seed, pairs, users, groups, [False] * len(pairs),
                        meta={"costs": {"pal": {"train_s": float(seed), "score_s": 1.0}}})
    by_pair = dict(zip(pairs, users))
    out.add_arm("bt_embedding", {p: float(rng.random() < accuracy) for p in pairs}, by_pair)
    out.add_arm("pal", {p: 1.0 for p in pairs}, by_pair)
    return out


def test_reported_and_development_worlds_make_tables_of_their_own(tmp_path, monkeypatch):
    cfg = LeaderboardConfig(worlds=[1, 2], development_worlds=[7], methods={"bt_embedding": {}, "pal": {}},
                            few_shot={"ks": [0, 2]}, out=str(tmp_path), n_bootstrap=50)
    monkeypatch.setattr(Leaderboard, "run_world", lambda self, seed: frame(seed, 0.9 if seed == 7 else 0.5))

    def few_shot(self, seed):
        users_of = {f"w{seed}c{i}": f"c{i // 2}" for i in range(6)}
        return [few_shot_record(seed, "pal", k, users_of, {p: float(seed == 7 or k == 2) for p in users_of},
                                n_bootstrap=50, seed=0) for k in (0, 2)]

    monkeypatch.setattr(Leaderboard, "few_shot", few_shot)
    result = Leaderboard(cfg, log=lambda _: None).run()
    board, development = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("leaderboard", "development"))
    assert board == json.loads(json.dumps(result["leaderboard"])) and board["worlds"] == [1, 2]
    assert development["worlds"] == [7]
    for table, worlds in ((board, [1, 2]), (development, [7])):
        seen = table["table"]["pal"]["accuracy_seen"]
        assert [w["world"] for w in seen["worlds"]] == worlds and seen["pooled"]["fixed"]["gain"] == 1.0
        assert table["costs"]["pal"]["train_s"] == np.mean(worlds)   # seconds a world, over the table's worlds
    curve = {(c["method"], c["k"]): c for c in json.loads((tmp_path / "few_shot.json").read_text())["curve"]}
    dev_curve = json.loads((tmp_path / "few_shot_development.json").read_text())
    assert curve["pal", 0]["accuracy"] == 0.0 and curve["pal", 2]["accuracy"] == 1.0
    assert curve["pal", 0]["worlds"] == [1, 2]
    assert dev_curve["worlds"] == [7] and all(c["accuracy"] == 1.0 for c in dev_curve["curve"])
    for name in ("leaderboard.md", "development.md", "few_shot.md", "few_shot_development.md"):
        assert (tmp_path / name).is_file(), name
    assert (tmp_path / "w7" / "few_shot_outcomes.json").is_file()
