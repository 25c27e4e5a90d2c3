"""The committed leaderboard (docs/results/leaderboard/) is what its committed per-pair outcomes give: the table
(every row's accuracy and paired differences with their user-resampled CIs, per world and pooled), the few-shot
curve, and the reused P-GenRM rows, which equal the P-GenRM study's own per-pair outcomes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pr_rlhf.configs.recipe import load_recipe
from pr_rlhf.eval.worlds import WorldOutcomes
from pr_rlhf.leaderboard.board import build_board, few_shot_board

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "leaderboard"
CFG = load_recipe(ROOT / "recipes" / "leaderboard.yaml").leaderboard


def committed(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def outcomes(world: int, name: str = "outcomes.json") -> WorldOutcomes:
    return WorldOutcomes.load(RESULTS / f"w{world}" / name)


def strip(board: dict) -> dict:
    return json.loads(json.dumps({k: v for k, v in board.items() if k != "costs"}))


@pytest.mark.parametrize("name,worlds", [("leaderboard.json", CFG.worlds),
                                         ("development.json", CFG.development_worlds)])
def test_the_committed_table_is_its_committed_outcomes(name, worlds):
    table = committed(name)
    assert table["worlds"] == worlds
    again = build_board([outcomes(w) for w in worlds], table["rows"], baseline=CFG.baseline, against=CFG.against,
                        n_bootstrap=CFG.n_bootstrap, seed=CFG.seed)
    assert strip(again) == strip(table)


def test_the_committed_few_shot_curve_is_its_committed_outcomes():
    curve = committed("few_shot.json")
    frames = [outcomes(w, "few_shot_outcomes.json") for w in CFG.worlds]
    assert json.loads(json.dumps(few_shot_board(frames, CFG.n_bootstrap, CFG.seed))) == curve


def test_the_reused_pgenrm_rows_are_the_studys_own_outcomes():
    for world in CFG.worlds:
        ours, study = outcomes(world), WorldOutcomes.load(ROOT / "docs" / "results" / "pgenrm_worlds" / f"w{world}"
                                                          / "outcomes.json")
        for name, spec in CFG.reuse.items():
            arm = spec.split(":", 1)[1]
            if arm not in study.arms:
                assert name not in ours.arms
                continue
            theirs = dict(zip(study.pairs, study.arms[arm]))
            assert [theirs[p] for p in ours.pairs] == ours.arms[name], (world, name)


def test_the_committed_judge_comparison_is_its_committed_outcomes():
    """judge + history - judge (pre-registration addendum, prediction 15), paired on the judges' users."""
    from tests.scripts import load_script

    again = load_script("research/leaderboard_paired.py", "leaderboard_paired").comparisons("judges.json")
    assert again == committed("judges.json")
    for name in ("reported", "development"):
        for entry in again[name]["analysis"].values():   # every world of each set compared, on the sampled users
            assert len(entry["worlds"]) == len(again[name]["worlds"])
            assert all(w["users"] == 30 for w in entry["worlds"]), entry["worlds"]


def test_the_committed_bt_rm_comparisons_are_their_committed_outcomes():
    """The fine-tuned BT RM with history - without, PAL and LoRe - the BT RM with history (addendum 18-23,
    predictions 19 and 21), paired on every pair of every user."""
    from tests.scripts import load_script

    again = load_script("research/leaderboard_paired.py", "leaderboard_paired").comparisons("bt_rms.json")
    assert again == committed("bt_rms.json")
    assert [(c["new"], c["old"]) for c in again["comparisons"]] == [
        ("bt_history", "bt_none"), ("pal", "bt_history"), ("lore", "bt_history"), ("bt_profile", "bt_none"),
        ("bt_profile", "bt_history"), ("bt_persona", "bt_none"), ("bt_persona", "bt_history"),
        ("bt_persona", "bt_profile")]
    (dsp,) = again["comparisons"][0]["dsp"]["analysis"]["bt_history - bt_none (seen)"]["worlds"]
    assert dsp["pairs"] == 4316, dsp   # on DSP every pair (addendum 28-31)
    for entry in again["comparisons"][0]["reported"]["analysis"].values():   # every user of every reported world
        assert [w["users"] for w in entry["worlds"]] == [200] * len(CFG.worlds), entry["worlds"]


def test_the_committed_persona_comparisons_are_their_committed_outcomes():
    """The judge reading a SynthesizeMe persona - the judge without it and with the preference history (addendum
    24-27), paired on the persona's users (15 per group and world, the reported worlds only); cold-start users get no
    persona, so the persona row is the judge on every one of their pairs."""
    from tests.scripts import load_script

    again = load_script("research/leaderboard_paired.py", "leaderboard_paired").comparisons("persona.json")
    assert again == committed("persona.json")
    assert "development" not in again["comparisons"][0]
    for entry in again["comparisons"][0]["reported"]["analysis"].values():
        assert [w["users"] for w in entry["worlds"]] == [15] * len(CFG.worlds), entry["worlds"]
    cold = again["comparisons"][0]["reported"]["analysis"]["persona - judge (cold)"]
    assert all(w["changed"] == 0 for w in cold["worlds"]), cold["worlds"]
    # on DSP (addendum 32-35): each user's first 100 pairs, 100 query units resampled
    (dsp,) = again["comparisons"][0]["dsp"]["analysis"]["persona - judge (seen)"]["worlds"]
    assert (dsp["pairs"], dsp["users"]) == (400, 100), dsp


def test_the_committed_dsp_table_is_its_committed_outcomes():
    """DSP's table (`dsp/dsp.json`) is its per-pair outcomes' (no text shipped: pair ids, users, query units)."""

    cfg = load_recipe(ROOT / "recipes" / "leaderboard_dsp.yaml").leaderboard
    table = committed("dsp/dsp.json")
    frame = WorldOutcomes.load(RESULTS / "dsp" / "outcomes.json")
    again = build_board([frame], table["rows"], baseline=cfg.baseline, against=None, n_bootstrap=cfg.n_bootstrap,
                        seed=cfg.seed)
    assert strip(again) == {k: v for k, v in strip(table).items() if k != "dataset"}


def test_rows_run_apart_join_the_dsp_outcomes_only_where_every_shared_row_agrees(tmp_path):
    """`research/dsp_rows_merged.py`: a row from a run folder of its own is added to the committed DSP outcomes with
    its costs; a run whose shared rows differ on one pair, or that lacks the row, is refused."""
    from tests.scripts import load_script

    module = load_script("research/dsp_rows_merged.py", "dsp_rows_merged")
    base = WorldOutcomes.load(RESULTS / "dsp" / "outcomes.json")
    run = tmp_path / "run"
    (run / "datasets" / "dsp").mkdir(parents=True)
    fresh = WorldOutcomes(base.world, base.pairs, base.users, base.groups, base.contested,
                          {"pal": list(base.arms["pal"]), "new_row": [1.0] * len(base.pairs)},
                          {"costs": {"pal": {}, "new_row": {"train_s": 1.0, "score_s": 2.0}}}, base.clusters)
    fresh.save(run / "datasets" / "dsp" / "outcomes.json")
    joined = module.merged(run, ["new_row"])
    assert list(joined.arms)[-1] == "new_row" and list(joined.arms)[:-1] == list(base.arms)
    assert joined.meta["costs"]["new_row"] == {"train_s": 1.0, "score_s": 2.0}
    with pytest.raises(ValueError, match="no rows"):
        module.merged(run, ["other_row"])
    fresh.arms["pal"][0] = 1.0 - fresh.arms["pal"][0]
    fresh.save(run / "datasets" / "dsp" / "outcomes.json")
    with pytest.raises(ValueError, match=r"rows \['pal'\] disagree"):
        module.merged(run, ["new_row"])


def test_the_committed_few_shot_judge_comparisons_are_their_committed_outcomes():
    """The judge + history on the few-shot sets (addendum 36-39): k = 8 against k = 0 and against PAL at k = 8, on
    the judge's users (the first 30 cold-start users of each world), recomputed from the few-shot outcomes."""
    from tests.scripts import load_script

    again = load_script("research/leaderboard_paired.py", "leaderboard_paired").comparisons("few_shot_judge.json")
    assert again == committed("few_shot_judge.json")
    for comparison in again["comparisons"]:
        (entry,) = comparison["reported"]["analysis"].values()   # cold-start users only
        assert [(w["users"], w["pairs"]) for w in entry["worlds"]] == [(30, 120)] * len(CFG.worlds), entry["worlds"]
