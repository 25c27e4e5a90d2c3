"""The online learning curve, shrunk (research/online_curve.py; the full run is outside CI): two users arrive with
nothing stored, send feedback through the running service with the shipped P-GenRM, and their held-out pairs are
scored through it after 0 and 3 pairs. Every verdict agrees with the same model offline given the pairs the
service says it used, the files a reader re-analyses are written, and the committed full run's summary is what
its committed outcomes give."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.optional import need

ROOT = Path(__file__).resolve().parents[2]
need("ray.serve")


def test_shrunk_curve_through_the_service_agrees_with_offline(tmp_path):
    out = tmp_path / "results"
    run = subprocess.run([sys.executable, "research/online_curve.py", "run", "--users", "2", "--points", "0", "3",
                          "--borrow-points", "--out", str(out), "--work", str(tmp_path / "work")],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["agreement"] == {"compared": 16, "agree": 16, "rate": 1.0}
    outcomes = json.loads((out / "outcomes.json").read_text())["outcomes"]
    service = [o for o in outcomes if o["arm"] == "service"]
    assert len(service) == 16 and all(o["user_id"] for o in outcomes)
    # after 3 stored pairs the service used exactly the user's 3 pairs, in order; before any, none
    assert all(o["pairs"] == [] for o in service if o["k"] == 0)
    assert all(o["pairs"] == [[o["user_id"], i] for i in (1, 2, 3)] for o in service if o["k"] == 3)
    assert (out / "curve.png").stat().st_size > 0
    # run again on the same work folder: it resumes from the saved verdicts (no service, no model) to the same result
    again = subprocess.run([sys.executable, "research/online_curve.py", "run", "--users", "2", "--points", "0", "3",
                            "--borrow-points", "--out", str(tmp_path / "again"), "--work", str(tmp_path / "work")],
                           cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert {k: v for k, v in resumed.items() if k != "wall_s"} == {k: v for k, v in summary.items() if k != "wall_s"}


def test_committed_curve_summary_is_what_its_outcomes_give():
    from pr_rlhf.serve.curve import summarize

    folder = ROOT / "docs" / "results" / "online"
    saved = json.loads((folder / "outcomes.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    again = summarize(saved["outcomes"], saved["settings"]["points"], saved["settings"]["borrow_points"])
    assert {k: summary[k] for k in again} == json.loads(json.dumps(again))
