"""The GenRM checkpoint the quickstart ships: every file matches the sha256 its manifest recorded, the manifest
names a recipe that exists and validates, and the model loads (config and tokenizer) from the folder alone."""
from __future__ import annotations

import json
from pathlib import Path

from pr_rlhf.configs.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models" / "pgenrm_tiny"


def test_shipped_files_match_their_recorded_hashes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ship_genrm", ROOT / "tools" / "ship_genrm.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    manifest = json.loads((SHIPPED / "MANIFEST.json").read_text())
    on_disk = {p.name for p in SHIPPED.iterdir() if p.is_file() and p.name != "MANIFEST.json"}
    assert set(manifest["files"]) == on_disk
    for name, digest in manifest["files"].items():
        assert tool.sha256(SHIPPED / name) == digest, f"{name} differs from the shipped file's recorded hash"
    load_recipe(ROOT / manifest["recipe"])
    assert manifest["command"].startswith("pr-rlhf pgenrm") and 0.5 < manifest["accuracy"]["seen"] <= 1.0


def test_shipped_model_loads_from_its_folder():
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(SHIPPED).model_type
    assert AutoTokenizer.from_pretrained(SHIPPED)("Example 1: - e.g.\n- calm")["input_ids"]
    # the evaluation shipped beside the weights is the one the manifest (and the README) quote
    manifest = json.loads((SHIPPED / "MANIFEST.json").read_text())
    evaluation = json.loads((SHIPPED / "eval.json").read_text())
    for group in ("seen", "cold"):
        summary = evaluation[group]["summary"]
        assert summary["n"] > 0 and summary["n_correct"] / summary["n"] == summary["accuracy"]
        assert round(summary["accuracy"], 4) == manifest["accuracy"][group]
        assert summary["ci_low"] <= summary["accuracy"] <= summary["ci_high"]
