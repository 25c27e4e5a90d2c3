"""The shipped format teacher (tests/data/format_teacher/, served by the real-data e2e test): its files are the ones
its manifest hashed, it was trained on exactly what tests/format_teacher.py trains on today, and it still writes the
fixed chain and grade, greedy, on held-out prompts of both kinds."""
import json

import pytest

from tests import format_teacher as ft


def test_the_shipped_files_and_training_inputs_match_the_manifest():
    manifest = json.loads((ft.SHIPPED / "MANIFEST.json").read_text())
    assert manifest["command"] == ft.SHIP_COMMAND and manifest["training"] == json.loads(json.dumps(ft.TRAINING))
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(manifest["files"])
    assert ft.file_hashes(ft.SHIPPED) == manifest["files"]
    assert manifest["training_inputs_sha256"] == ft.training_inputs_sha256(), \
        f"the teacher's training prompts or settings changed: re-ship with `{ft.SHIP_COMMAND}`"
    assert manifest["heldout"]["greedy_exact"] == manifest["heldout"]["prompts"] > 0
    assert ft.shipped_format_teacher() == ft.SHIPPED


def test_an_edited_prompt_set_is_refused(monkeypatch):
    monkeypatch.setitem(ft.TRAINING, "sec", (63, 1))
    with pytest.raises(RuntimeError, match="re-ship"):
        ft.shipped_format_teacher()


def test_the_shipped_teacher_answers_held_out_prompts_exactly():
    checks = ft.check_teacher(ft.SHIPPED, n=4)
    assert checks["greedy_exact"] == checks["prompts"] == 8, checks
    assert checks["sampled_sec_parsed"] == checks["sampled_judge_parsed"] == checks["samples_per_kind"], checks
