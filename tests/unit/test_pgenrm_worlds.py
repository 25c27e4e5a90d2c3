"""The multi-world analysis (pr_rlhf.eval.worlds) and the user-clustered paired gain it and every report use."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pr_rlhf.eval.report import PairOutcomes, paired_gain
from pr_rlhf.eval.worlds import Endpoint, WorldOutcomes, analyse, forest_plot, moderator, pool, world_difference
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_paired_gain_resamples_users_and_refuses_pairs_of_other_users():
    users = {f"p{i}": f"u{i // 6}" for i in range(600)}
    old = PairOutcomes({p: float(i % 3 > 0) for i, p in enumerate(users)}, users)
    # the change sits in whole users (every pair of every 4th user becomes right)
    new = PairOutcomes({p: 1.0 if int(users[p][1:]) % 4 == 0 else old[p] for p in users}, users)
    by_user = paired_gain(new, old)
    assert by_user["users"] == 100 and by_user["changed_users"] == 25 and by_user["pairs"] == 600
    by_pair = PairOutcomes(dict(new), {p: p for p in users}), PairOutcomes(dict(old), {p: p for p in users})
    loose = paired_gain(*by_pair)
    assert loose["gain"] == by_user["gain"]
    assert by_user["ci_high"] - by_user["ci_low"] > 1.3 * (loose["ci_high"] - loose["ci_low"])
    with pytest.raises(ValueError, match="another|other"):
        paired_gain(new, PairOutcomes(dict(old), {p: "someone" for p in users}))
    with pytest.raises(ValueError, match="without a user"):
        PairOutcomes({"p0": 1.0}, {})


def test_the_issue_recomputation_of_world_2_resamples_users():
    """docs/results/pgenrm_w2: CRE - PSI was +4.1 [+1.4, +6.4] resampling pairs; resampling users it is +4.1
    [-0.7, +8.8] (the issue's recomputation): the committed outcomes give exactly that."""
    outcomes = WorldOutcomes.load(ROOT / "docs" / "results" / "pgenrm_w2" / "outcomes.json")
    seen = [i for i, g in enumerate(outcomes.groups) if g == "seen"]
    pick = {a: PairOutcomes({outcomes.pairs[i]: outcomes.arms[a][i] for i in seen},
                            {outcomes.pairs[i]: outcomes.users[i] for i in seen}) for a in ("cre", "psi")}
    gain = paired_gain(pick["cre"], pick["psi"])
    assert round(100 * gain["gain"], 1) == 4.1 and gain["users"] == 200
    assert gain["ci_low"] < 0 < gain["ci_high"] and 7.5 < 100 * gain["ci_high"] < 10.0


def synthetic_world(world: int, effect: float, users: int = 120, per_user: int = 6, seed: int = 0) -> WorldOutcomes:
    rng = np.random.default_rng([world, seed])
    n = users * per_user
    pairs = [f"w{world}_p{i}" for i in range(n)]
    user_of = [f"u{i // per_user}" for i in range(n)]
    old = (rng.random(n) < 0.7).astype(float)
    user_gain = rng.random(users) < abs(effect) * 3            # the effect sits in some users
    flip = user_gain[np.arange(n) // per_user] & (rng.random(n) < 0.5)
    new = np.where(flip, 1.0 if effect > 0 else 0.0, old)
    w = WorldOutcomes(world, pairs, user_of, ["seen"] * n, [i % 3 == 0 for i in range(n)])
    w.add_arm("old", dict(zip(pairs, old)), dict(zip(pairs, user_of)))
    w.add_arm("new", dict(zip(pairs, new)), dict(zip(pairs, user_of)))
    return w


def test_pooled_fixed_effect_is_the_inverse_variance_mean_with_a_stratified_ci(tmp_path):
    worlds = [synthetic_world(w, 0.08) for w in (1, 2, 3, 4)]
    ep = Endpoint("new - old", "new", "old")
    rows = [world_difference(w, ep, 1000, 0) for w in worlds]
    pooled = pool(rows)
    weights = np.array([1 / r["se"] ** 2 for r in rows])
    assert pooled["fixed"]["gain"] == pytest.approx(np.dot(weights, [r["gain"] for r in rows]) / weights.sum())
    assert pooled["worlds"] == 4 and pooled["fixed"]["ci_low"] > 0
    # pooling narrows: the pooled CI is narrower than any world's
    width = pooled["fixed"]["ci_high"] - pooled["fixed"]["ci_low"]
    assert all(width < r["ci_high"] - r["ci_low"] for r in rows)
    assert 0.0 <= pooled["i2"] <= 1.0 and pooled["random"]["ci_low"] <= pooled["random"]["gain"]
    # worlds that disagree: heterogeneity shows, and random effects widen
    mixed = [synthetic_world(1, 0.15), synthetic_world(2, -0.15), synthetic_world(3, 0.15), synthetic_world(4, -0.15)]
    spread = pool([world_difference(w, ep, 1000, 0) for w in mixed])
    assert spread["i2"] > 0.5 and spread["random"]["tau2"] > 0
    def width(ci):
        return ci["ci_high"] - ci["ci_low"]
    assert width(spread["random"]) > width(spread["fixed"])
    # save / load keeps every outcome; a missing arm leaves the endpoint out for that world
    path = worlds[0].save(tmp_path / "outcomes.json")
    again = WorldOutcomes.load(path)
    assert again.arms == worlds[0].arms and again.users == worlds[0].users
    result = analyse(worlds + [WorldOutcomes(9, ["x"], ["u"], ["seen"], [False])], [ep], n_bootstrap=200)
    assert [r["world"] for r in result["new - old"]["worlds"]] == [1, 2, 3, 4]
    json.dumps(result)   # JSON-ready (no arrays left)
    png = forest_plot(result, [1, 2, 3, 4, 9], tmp_path / "forest.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert forest_plot({}, [1], tmp_path / "none.png") is None


def test_moderator_slope_follows_the_worlds():
    worlds = [synthetic_world(w, e) for w, e in ((1, 0.02), (2, 0.06), (3, 0.1), (4, 0.14))]
    m = moderator(worlds, Endpoint("g", "new", "old"), {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4})
    assert m["worlds"] == 4 and m["slope"] > 0 and m["spearman"] > 0.5


def load_study_tool(tmp_path, monkeypatch):
    tool = load_script("research/pgenrm_worlds.py", "pgenrm_worlds_tool")
    monkeypatch.setattr(tool, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(tool, "RESULTS", tmp_path / "results")
    return tool


def test_the_study_resumes_from_collected_outcomes_when_run_directories_are_gone(tmp_path, monkeypatch):
    """Run directories do not outlive their machine: a finished arm set counts as done once collected, the
    collected arms are never dropped, and the ablations and scaling grid start from a fresh PSI where the main
    set's is gone (the ablations then compared with that PSI's own CRE)."""
    tool = load_study_tool(tmp_path, monkeypatch)
    w = synthetic_world(2, 0.1)
    for arm in ("psi", "cre", "curriculum", "control"):
        w.arms[arm] = list(w.arms["new"])
    w.save(tool.RESULTS / "w2" / tool.OUTCOMES_FILE)
    (tool.RESULTS / "w2" / "contested.json").write_text("{}")
    assert tool.done(2, "main") and not tool.done(2, "filtered") and not tool.done(2, "ablations")
    again = tool.world_outcomes(2)
    assert again.arms == w.arms and again.pairs == w.pairs     # nothing on disk: the collected outcomes as they were

    assert tool.psi_home(2) == tool.RERUN
    cmd = tool.pgenrm_command(2, "ablations")
    assert cmd[cmd.index("--out") + 1].endswith("w2/rerun")
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--stage"] == ["psi", "cre", "cre_no_pr", "cre_no_or"]
    assert tool.ablation_arms(2)["cre_ablation_ref"] == (tool.RERUN, "cre")
    scaling = tool.commands(2, "scaling")
    assert len(scaling) == 2 and "w2/rerun" in " ".join(scaling[0]) and scaling[1][-1].endswith("scaling.yaml")

    # the main set's PSI still on disk: the ablations run in its directory, as pre-registered
    for stage in ("psi", "cre_no_pr"):
        (tool.RUNS / "w2" / "main" / stage).mkdir(parents=True)
        (tool.RUNS / "w2" / "main" / stage / "COMPLETE").touch()
    cmd = tool.pgenrm_command(2, "ablations")
    assert cmd[cmd.index("--out") + 1].endswith("w2/main")
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--stage"] == ["cre_no_pr", "cre_no_or"]
    assert len(tool.commands(2, "scaling")) == 1
    assert tool.ablation_arms(2)["cre_ablation_ref"] == ("main", "cre")
    # ablations collected from the main set's PSI (its directory gone since) are compared with the main set's CRE
    shutil.rmtree(tool.RUNS)
    for arm in ("cre_no_pr", "cre_no_or"):
        w.arms[arm] = list(w.arms["old"])
    w.save(tool.RESULTS / "w2" / tool.OUTCOMES_FILE)
    assert tool.done(2, "ablations")
    assert tool.world_outcomes(2).arms["cre_ablation_ref"] == w.arms["cre"]


def test_a_world_whose_bootstrap_never_varies_does_not_take_the_whole_pool():
    """Two rows that differ on a few pairs only, each user's differences cancelling (+1 and -1), give a world whose
    user bootstrap is 0 in every replicate. Its inverse variance must not be infinite: the pool then equals that
    world's 0 with a CI of [0, 0] whatever the other worlds show. Its variance is floored at that of one discordant
    pair among its pairs."""
    ep = Endpoint("new - old", "new", "old")
    users = [f"u{i}" for i in range(10) for _ in range(6)]
    pairs = [f"p{i}" for i in range(60)]
    still_new = [1.0 if i in (0, 6) else 0.0 for i in range(60)]     # u0 and u1: one pair up ...
    still_old = [1.0 if i in (1, 7) else 0.0 for i in range(60)]     # ... and one pair down
    still = WorldOutcomes(1, pairs, users, ["seen"] * 60, [False] * 60, {"new": still_new, "old": still_old})
    moving = synthetic_world(2, 0.15)
    rows = [world_difference(still, ep, 500, 0), world_difference(moving, ep, 500, 0)]
    assert rows[0]["gain"] == 0.0 and rows[0]["se"] == 0.0 and rows[1]["gain"] > 0.05
    pooled = pool(rows)
    assert 0.01 < pooled["fixed"]["gain"] < rows[1]["gain"], pooled["fixed"]
    assert pooled["fixed"]["ci_high"] > pooled["fixed"]["ci_low"], pooled["fixed"]
    assert max(pooled["fixed"]["weights"]) < 0.99, pooled["fixed"]["weights"]
