"""`pr-rlhf report compare`: the paired gain of one P-GenRM stage over another, from two run directories."""
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pr_rlhf.cli import app
from pr_rlhf.files import mark_complete
from pr_rlhf.pgenrm.report import compare_stage_dirs, contested_split


def _stage(folder: Path, correct: dict[str, dict[str, int]]) -> Path:
    result = {"stage": folder.name}
    for group, by_pair in correct.items():
        (folder / f"eval_{group}").mkdir(parents=True)
        path = folder / f"eval_{group}" / "predictions.parquet"
        pq.write_table(pa.table({"pair_id": list(by_pair), "user_id": [f"u{p}" for p in by_pair],
                                 "correct": list(by_pair.values())}), path)
        result[group] = {"predictions": str(path)}
    (folder / "result.json").write_text(json.dumps(result))
    mark_complete(folder)
    return folder


@pytest.fixture()
def two_runs(tmp_path):
    seen_old = {f"s{i}": int(i % 2 == 0) for i in range(40)}
    seen_new = {**seen_old, **{f"s{i}": 1 for i in range(1, 20, 2)}}      # 10 pairs fixed, all among s0..s19
    cold = {f"c{i}": 1 for i in range(10)}
    old = _stage(tmp_path / "run_a" / "psi", {"seen": seen_old, "cold": cold})
    new = _stage(tmp_path / "run_b" / "cre", {"seen": seen_new, "cold": {**cold, "c0": 0}})
    (tmp_path / "run_a" / "contested.json").write_text(json.dumps({f"s{i}": i < 20 for i in range(40)}))
    return new, old


def test_compare_stage_dirs_across_runs_with_a_split(two_runs):
    new, old = two_runs
    row = compare_stage_dirs(new, old, contested_split(old.parent))
    seen = row["seen"]
    assert (row["stage"], row["baseline"]) == ("cre", "psi")
    assert seen["all"]["pairs"] == 40 and seen["all"]["changed"] == 10 and seen["all"]["gain"] == pytest.approx(0.25)
    assert seen["contested"]["changed"] == 10 and seen["contested"]["gain"] == pytest.approx(0.5)
    assert seen["rest"]["changed"] == 0 and seen["rest"]["gain"] == 0.0
    assert seen["contested"]["ci_low"] > 0
    assert row["cold"]["all"]["gain"] == pytest.approx(-0.1) and row["cold"]["all"]["changed"] == 1


def test_compare_refuses_an_unfinished_stage(two_runs, tmp_path):
    new, _ = two_runs
    (tmp_path / "run_c" / "cre").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="run_c/cre: not a finished P-GenRM stage"):
        compare_stage_dirs(new, tmp_path / "run_c" / "cre")


def test_report_compare_cli(two_runs, tmp_path):
    new, old = two_runs
    result = CliRunner().invoke(app, ["report", "compare", str(new), str(old)])
    assert result.exit_code == 0, result.output
    assert "cre - psi" in result.output and "10 of 20 changed" in result.output
    assert "| psi | seen | 0 | 0 | 0 | 0 | 20 (50% right) |" in result.output   # no chains: unread
    missing = CliRunner().invoke(app, ["report", "compare", str(new), str(old), "--contested",
                                       str(tmp_path / "nope.json")])
    assert missing.exit_code != 0 and "nope.json: no such file" in missing.output
