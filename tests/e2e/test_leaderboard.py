"""`pr-rlhf leaderboard` as a user runs it, shrunk (a 30-user world, 150 training steps): every embedding method
trained in a Ray task and a fine-tuned BT RM on the learner, each scored through a reward pool on the world's
evaluation pairs, beside the world's references and a reused row (a committed outcomes file's arm, read not
recomputed), one table whose every accuracy is the per-pair outcomes' mean (users as the bootstrap's unit), the
few-shot curve, and PAL's curve through the running reward service (pairs sent as
/feedback) agreeing with it pair for pair; the methods and the BT RM on a pair set given as shards (as a real set is);
a rerun trains and scores nothing again. A development world runs the same code as a reported one: how run() keeps
it apart is tests/unit/test_leaderboard_run.py. The full run is recipes/leaderboard.yaml (docs/results/leaderboard/).
"""
import json
import os
from pathlib import Path

import numpy as np
import yaml

from pr_rlhf.eval.worlds import WorldOutcomes
from tests.cli_subprocess import run_cli

HANG_S = 900
CLI_ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}
WORLD = {"rendering": "compact", "n_attributes": 3, "n_archetypes": 3, "max_differing_attributes": 2, "users": 30,
         "cold_start_users": 10, "reference_samples": 500}
METHODS = ["bt_embedding", "pal", "lore", "vpl", "gpo"]


def committed_outcomes(folder: Path, world: int) -> Path:
    """A stand-in for a committed study's outcomes of the same world: an arm that is right on every seen pair."""
    from pr_rlhf.configs.world import WorldConfig
    from pr_rlhf.leaderboard.data import evaluation_items
    from pr_rlhf.world import build_world

    items = evaluation_items(build_world(WorldConfig(**WORLD, seed=world)))
    outcomes = WorldOutcomes(world, [it.pair_id for it in items], [it.user_id for it in items],
                             [it.group for it in items], [False] * len(items),
                             {"oracle_arm": [1.0 if it.group == "seen" else None for it in items]})
    return outcomes.save(folder / f"w{world}" / "outcomes.json")


def test_leaderboard_trains_scores_tables_and_resumes(tmp_path):
    committed_outcomes(tmp_path / "study", 1)
    from data_pipelines.build import ensure_world_shards
    from pr_rlhf.configs.world import WorldConfig

    # a pair set given as shards (as a real one is, after `pr-rlhf data build`): here a small world's
    ensure_world_shards(tmp_path / "set_shards", WorldConfig(**{**WORLD, "users": 12, "cold_start_users": 4}, seed=3))
    recipe = tmp_path / "leaderboard.yaml"
    recipe.write_text(yaml.safe_dump({"name": "leaderboard_e2e", "seed": 0, "leaderboard": {
        "worlds": [1], "development_worlds": [], "world": WORLD, "train": {"steps": 150},
        "reuse": {"study": str(tmp_path / "study" / "w{world}" / "outcomes.json") + ":oracle_arm"},
        # another reward model scored on the same pairs (any kind): the world's prior-only estimate
        "models": {"prior_rm": {"reward": {"kind": "world_estimate", "world": {**WORLD, "seed": 1},
                                           "estimator": "no_history"}, "worlds": [1]},
                   # a slow model's row on a sample of users, not on the few-shot sets, under a name of its own
                   "prior_sampled": {"reward": {"kind": "world_estimate", "world": {**WORLD, "seed": 1},
                                                "estimator": "no_history"}, "worlds": [1], "users_per_group": 2,
                                     "few_shot": False, "label": "prior on two users per group"},
                   # a slow model on a set of few users: each user's first 2 pairs of the set, on no world
                   "prior_set": {"reward": {"kind": "world_estimate", "world": {**WORLD, "seed": 1},
                                            "estimator": "no_history"}, "worlds": [], "datasets": True,
                                 "pairs_per_user": 2}},
        # fine-tuned BT RMs reading the user's history and their retrieved posts, trained per world on the learner
        # (2 steps: they run)
        "bt_rm": {"model": "tiny", "input_modes": ["history", "profile"], "top_k_profile": 2, "max_length": 256,
                  "steps": 2, "batch_size": 8, "learner": {"micro_batch_size": 8}},
        "datasets": {"toy": {"shards": str(tmp_path / "set_shards"), "history_pairs": 3, "licence": "made here"}},
        "against": "study", "n_bootstrap": 200,
        "few_shot": {"ks": [0, 2], "cold_start_history": 2, "service": ["pal"], "service_worlds": [1]}}}))
    out = tmp_path / "run"
    first = run_cli(["leaderboard", str(recipe), "--out", str(out)], hang_timeout_s=HANG_S, env=CLI_ENV)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]

    world = WorldOutcomes.load(out / "w1" / "outcomes.json")
    assert {*METHODS, "oracle", "logistic_regression", "no_history", "oracle@all", "study", "prior_rm",
            "bt_history"} <= set(world.arms)
    assert all(a is not None for a in world.arms["bt_history"])   # every pair scored by the trained BT RM
    assert all(a is not None for a in world.arms["bt_profile"])   # ... and by the one reading the pairs' posts
    assert set(world.groups) == {"seen", "cold"} and all(u.startswith("u") for u in world.users)
    sampled = {(g, u) for g, u, a in zip(world.groups, world.users, world.arms["prior_sampled"]) if a is not None}
    for group in ("seen", "cold"):   # every pair of the first two users of each group, and nothing else
        first = sorted({u for g, u in zip(world.groups, world.users) if g == group})[:2]
        assert {u for g, u in sampled if g == group} == set(first)
        assert all(a is not None for g, u, a in zip(world.groups, world.users, world.arms["prior_sampled"])
                   if g == group and u in first)
    assert "prior on two users per group" in (out / "leaderboard.md").read_text()
    board = json.loads((out / "leaderboard.json").read_text())
    assert board["worlds"] == [1] and board["baseline"] == "bt_embedding" and board["against"] == "study"
    for row in METHODS:   # the table's accuracy is the outcomes' mean, on the pairs the row judged
        for group in ("seen", "cold"):
            idx = world.select(group, "all", row)
            table = board["table"][row][f"accuracy_{group}"]["worlds"][0]
            assert abs(table["gain"] - np.mean([world.arms[row][i] for i in idx])) < 1e-12
            assert table["users"] == len({world.users[i] for i in idx}) and table["ci_low"] <= table["gain"]
        assert board["costs"][row]["train_s"] > 0 and board["costs"][row]["score_s"] > 0
    assert board["costs"]["bt_history"]["train_s"] > 0 and (out / "w1" / "bt_rm" / "history" / "model").is_dir()
    study = board["table"]["pal"]["vs_against_seen"]["worlds"][0]   # paired with the reused row, seen pairs only
    assert study["pairs"] == len(world.select("seen", "all", "pal", "study"))
    assert "cold" not in {g for g, a in zip(world.groups, world.arms["study"]) if a is not None}
    seen = {r: board["table"][r]["accuracy_seen"]["pooled"]["fixed"]["gain"] for r in ("bt_embedding", "pal")}
    assert seen["pal"] > seen["bt_embedding"], seen   # personalization shows even in 150 steps
    assert not (out / "development.json").exists()
    curve = json.loads((out / "few_shot.json").read_text())["curve"]
    # every row of the table reads the few-shot sets: the trained methods and the recipe's other models
    assert {(c["method"], c["k"]) for c in curve} == {(m, k) for m in [*METHODS, "prior_rm", "bt_history"]
                                                      for k in (0, 2)}
    # the curve through the running service (feedback stored, then /score reading it) agrees pair for pair
    service = json.loads((out / "few_shot_service.json").read_text())
    assert [(r["method"], r["k"]) for r in service] == [("pal", 0), ("pal", 2)]
    assert all(r["agreement"] == r["compared"] == r["pairs"] > 0 for r in service), service
    for name in ("leaderboard.md", "leaderboard.png", "few_shot.md", "few_shot.png"):
        assert (out / name).is_file(), name
    # the pair set: every method and the fine-tuned BT RM trained on its training pairs, scored on all its pairs
    toy = WorldOutcomes.load(out / "datasets" / "toy" / "outcomes.json")
    assert {*METHODS, "bt_history"} <= set(toy.arms) and {"seen", "cold"} == set(toy.groups)
    assert all(a is not None for a in toy.arms["bt_history"]) and all(a is not None for a in toy.arms["bt_profile"])
    scored = [(u, a is not None) for u, a in zip(toy.users, toy.arms["prior_set"])]
    for user in set(toy.users):   # the first 2 pairs of every user, in the set's order, and nothing else
        flags = [s for u, s in scored if u == user]
        assert all(flags[:2]) and not any(flags[2:]), (user, flags)
    assert "prior_set" not in world.arms
    assert (out / "datasets" / "toy" / "bt_rm" / "history" / "model").is_dir()
    toy_board = json.loads((out / "datasets" / "toy.json").read_text())
    assert toy_board["costs"]["bt_history"]["train_s"] > 0 and "made here" in (out / "datasets" / "toy.md").read_text()

    written = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.parent.name in ("arms",)}
    models = {p: p.stat().st_mtime_ns for p in out.rglob("model.safetensors")}
    again = run_cli(["leaderboard", str(recipe), "--out", str(out)], hang_timeout_s=HANG_S, env=CLI_ENV)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "trained" not in again.stdout   # nothing retrained ...
    assert {p: p.stat().st_mtime_ns for p in written} == written   # ... nor rescored
    assert {p: p.stat().st_mtime_ns for p in models} == models
