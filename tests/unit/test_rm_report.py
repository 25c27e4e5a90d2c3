"""The BT RMs' report splits every mode's accuracy and its paired gain over the RM w/o profile by user group."""
from __future__ import annotations

import pytest

from pr_rlhf.eval.metrics import Prediction
from pr_rlhf.eval.report import write_report
from pr_rlhf.rm.report import markdown, mode_rows


def _eval(tmp_path, mode, correct):
    preds = [Prediction.pointwise(pair_id=f"p{i}", user_id=f"u{i}", subset="s", inputs=mode,
                                  score_chosen=1.0 if ok else 0.0, score_rejected=0.5) for i, ok in enumerate(correct)]
    report = write_report(tmp_path / mode, preds, n_bootstrap=100)
    return {"summary": next(iter(report.summaries.values())), "predictions": str(report.predictions)}


def test_each_group_gets_its_accuracy_and_its_paired_gain_on_its_own_pairs(tmp_path):
    # profile is right on every seen pair (p0-p29) and no better than none on the cold-start ones (p30-p39)
    none = _eval(tmp_path, "none", [i % 2 == 0 for i in range(40)])
    profile = _eval(tmp_path, "profile", [i < 30 or i % 2 == 0 for i in range(40)])
    groups = {"seen": {f"p{i}" for i in range(30)}, "cold-start": {f"p{i}" for i in range(30, 40)}}
    rows = {r["mode"]: r for r in mode_rows({"none": none, "profile": profile}, seed=0, groups=groups)}
    seen, cold = rows["profile"]["groups"]["seen"], rows["profile"]["groups"]["cold-start"]
    assert seen["n"] == 30 and seen["accuracy"] == 1.0 and seen["vs_none"]["gain"] == pytest.approx(0.5)
    assert cold["n"] == 10 and cold["vs_none"]["gain"] == 0.0 and cold["vs_none"]["changed"] == 0
    assert "vs_none" not in rows["none"]["groups"]["seen"]
    table = markdown(list(rows.values()), {}, "t")
    assert "seen users" in table and "cold-start users" in table and "+50.0" in table
