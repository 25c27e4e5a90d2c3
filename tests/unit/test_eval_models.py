"""eval.models: named models on the section's pairs, each cell beside the section's cell of the same (mode,
inputs) with the paired difference; a named model cannot change which pairs are evaluated."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from pr_rlhf.configs.recipe import EvalConfig
from pr_rlhf.eval.metrics import Prediction
from pr_rlhf.eval.models import model_rows, write_models_report
from pr_rlhf.eval.report import write_report


def test_a_named_model_is_the_section_with_its_changes_in_its_own_run_directory():
    cfg = EvalConfig(out="runs/x", max_pairs=40, top_k_profile=10,
                     models={"bt": {"modes": ["pointwise"], "inputs": ["profile"], "top_k_profile": 5,
                                    "scalar_rm": {"model": "models/rm", "max_length": 512}}})
    named = cfg.model_config_for("bt")
    assert named.inputs == ["profile"] and named.top_k_profile == 5 and named.scalar_rm.model == "models/rm"
    assert named.max_pairs == 40 and named.out == "runs/x/models/bt" and not named.models


@pytest.mark.parametrize("changes, names", [({"max_pairs": 10}, "max_pairs"), ({"users": "seen"}, "users"),
                                            ({"inputs": ["nope"]}, "models.m.inputs.0"),
                                            ({"scalar_rm": {"modle": "x"}}, "models.m.scalar_rm.modle")])
def test_a_named_model_that_changes_the_pairs_or_names_a_bad_field_is_rejected_by_name(changes, names):
    with pytest.raises(ValidationError, match=names.replace(".", r"\.")):
        EvalConfig(models={"m": changes})


def _report(tmp_path, name, correct_none, correct_pairwise=None):
    preds = [Prediction.pointwise(pair_id=f"p{i}", user_id=f"u{i}", subset="s", inputs="none",
                                  score_chosen=1.0 if ok else 0.0, score_rejected=0.5)
             for i, ok in enumerate(correct_none)]
    preds += [Prediction.pairwise(pair_id=f"p{i}", user_id=f"u{i}", subset="s", inputs="none", chosen_slot="A",
                                  predicted={True: "A", False: "B", None: None}[ok])
              for i, ok in enumerate(correct_pairwise or [])]
    return write_report(tmp_path / name, preds, n_bootstrap=200)


def test_rows_pair_each_model_cell_with_the_floor_cell_of_the_same_mode_and_inputs(tmp_path):
    floor = _report(tmp_path, "floor", [True, False] * 20, [None] * 40)
    trained = _report(tmp_path, "trained", [True] * 40)
    rows = model_rows("untrained", floor, {"bt": trained}, seed=0)
    assert [(r["model"], r["cell"]) for r in rows] == [("untrained", "pointwise/none"),
                                                       ("untrained", "pairwise/none"), ("bt", "pointwise/none")]
    gain = rows[-1]["vs_floor"]
    assert gain["gain"] == pytest.approx(0.5) and gain["changed"] == 20 and gain["pairs"] == 40
    assert gain["ci_low"] > 0
    # a cell the floor lacks has no comparison; the files name the floor
    judge = _report(tmp_path, "judge", [], [True] * 10)
    assert model_rows("untrained", _report(tmp_path, "f2", [True] * 10), {"j": judge}, 0)[-1]["vs_floor"] is None
    md, js = write_models_report(tmp_path, rows, "untrained", "t")
    assert "vs untrained" in md.read_text() and "+50.0" in md.read_text() and js.is_file()


def test_the_gain_over_a_floor_that_parses_nothing_counts_its_unparsed_verdicts_as_coin_flips(tmp_path):
    """An untrained GenRM parses no verdict: counted wrong it would make any trained model's gain its whole accuracy
    (a 50-point overstatement against chance). The paired difference scores an unparsed verdict or a tie as 0.5 on
    both sides; the accuracy column keeps counting them wrong, as the report does."""
    floor = _report(tmp_path, "floor", [], [None] * 40)
    trained = _report(tmp_path, "trained", [], [True] * 30 + [None] * 10)
    row = model_rows("untrained", floor, {"genrm": trained}, seed=0)[-1]
    assert row["summary"]["accuracy"] == pytest.approx(0.75)
    assert row["vs_floor"]["gain"] == pytest.approx(0.75 + 0.5 * 0.25 - 0.5)
    md = write_models_report(tmp_path, [row], "untrained", "t")[0].read_text()
    assert "coin flips" in md
