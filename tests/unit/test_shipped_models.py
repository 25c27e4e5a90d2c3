"""The checkpoints the quickstart ships: every file matches the sha256 its manifest recorded, the manifest names a
recipe that exists and validates and the command that trained it, the evaluation shipped beside the weights is the
one the manifest (and the README) quote, and the model loads from its folder alone."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pr_rlhf.configs.recipe import load_recipe
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.parent for p in (ROOT / "models").glob("*/MANIFEST.json"))
COMMANDS = {"genrm": "pr-rlhf pgenrm", "rm": "pr-rlhf train-rm", "planner": "pr-rlhf pgenrm"}


def _tool():
    return load_script("tools/ship_model.py", "ship_model")


def test_the_quickstart_ships_a_genrm_a_planner_and_three_bt_rms():
    assert {p.name for p in SHIPPED} >= {"pgenrm_tiny", "planner_tiny", "rm_bt_tiny_none", "rm_bt_tiny_profile",
                                         "rm_bt_tiny_plan"}


@pytest.mark.parametrize("shipped", SHIPPED, ids=lambda p: p.name)
def test_shipped_files_match_their_recorded_hashes(shipped):
    tool = _tool()
    manifest = json.loads((shipped / "MANIFEST.json").read_text())
    on_disk = {p.name for p in shipped.iterdir() if p.is_file() and p.name != "MANIFEST.json"}
    assert set(manifest["files"]) == on_disk
    for name, digest in manifest["files"].items():
        assert tool.sha256(shipped / name) == digest, f"{name} differs from the shipped file's recorded hash"
    load_recipe(ROOT / manifest["recipe"])
    assert manifest["command"].startswith(COMMANDS[manifest["kind"]]) and manifest["recipe"] in manifest["command"]
    evaluation = json.loads((shipped / "eval.json").read_text())
    if manifest["kind"] == "planner":   # aspect precision / recall of its held-out plans
        assert evaluation["queries"] > 0 and evaluation["parse_failures"] < evaluation["queries"]
        for key, value in manifest["aspects"].items():
            block = evaluation[key]
            assert round(block["mean"], 4) == value and block["ci_low"] <= block["mean"] <= block["ci_high"]
            assert block["mean"] > 0.5, f"{key}: a shipped planner that gets most aspects wrong"
        return
    assert set(evaluation) == set(manifest["accuracy"])
    for group, block in evaluation.items():
        summary = block["summary"]
        assert summary["n"] > 0 and summary["n_correct"] / summary["n"] == summary["accuracy"]
        assert round(summary["accuracy"], 4) == manifest["accuracy"][group]
        assert summary["ci_low"] <= summary["accuracy"] <= summary["ci_high"]
        assert 0.5 < summary["accuracy"] <= 1.0, f"{group}: a shipped model no better than chance"


@pytest.mark.parametrize("shipped", SHIPPED, ids=lambda p: p.name)
def test_shipped_model_loads_from_its_folder(shipped):
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(shipped).model_type
    assert AutoTokenizer.from_pretrained(shipped)("Example 1: - e.g.\n- calm")["input_ids"]
