"""`pr-rlhf train-rm` as a user runs it: a small world built by the command, one Bradley-Terry RM per input mode on
the learner, each exported, evaluated and reported with the paired gain over the RM without profile; a rerun
skips finished modes and resumes an unfinished one from its checkpoint.

Six steps of a tiny RM are too few to show learning on this world: here the checks are that the steps moved the
weights and lowered nothing to nan, and that the report is the exported model's own verdicts. Learning itself is
checked in ``tests/integration/test_reward_model_training.py`` (a toy preference learned to >= 0.95 held-out
accuracy, one rank and two FSDP2 ranks alike) and by the shipped BT RMs' accuracies
(``tests/unit/test_shipped_models.py``)."""
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import yaml

from pr_rlhf.eval.report import PREDICTIONS_FILE, correct_by_pair
from pr_rlhf.files import is_complete
from tests.cli_subprocess import run_cli

HANG_S = 900
CLI_ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}
WORLD = {"rendering": "compact", "users": 12, "cold_start_users": 4, "history_size": 4, "val_pairs_per_user": 1,
         "test_pairs_per_user": 2, "cold_start_test_pairs": 2, "reference_samples": 200}


def write_recipe(tmp_path: Path) -> Path:
    recipe = tmp_path / "rm.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "rm_e2e", "seed": 0, "world": WORLD, "data": {"retrieval": {"embedder": "bm25", "top_k": 4}},
        "tracking": {"experiment": "rm_e2e"},
        "rm": {"shards": str(tmp_path / "shards"), "model": "tiny", "input_modes": ["none", "profile"],
               "top_k_profile": 4, "max_length": 256, "steps": 6, "batch_size": 8, "lr": 5e-4, "warmup_steps": 2,
               "checkpoint_every": 3, "learner": {"micro_batch_size": 8, "strategy": "none"}}}))
    return recipe


def assert_weights_moved(folder: Path) -> None:
    """The exported RM's backbone is not the tiny model it started from: the steps changed it."""
    import torch
    from safetensors.torch import load_file

    from pr_rlhf.models.sources import resolve_model

    def tensors(d: Path) -> dict:
        return {k: v for f in sorted(d.glob("*.safetensors")) for k, v in load_file(f).items()}

    start, trained = tensors(Path(resolve_model("tiny"))), tensors(folder)
    shared = [k for k in trained if k in start and k.startswith("model.layers.")]
    moved = [k for k in shared if not torch.equal(trained[k].float(), start[k].float())]
    assert shared and len(moved) > len(shared) // 2, f"{folder}: {len(moved)} of {len(shared)} backbone tensors moved"


def test_train_rm_trains_exports_evaluates_reports_and_resumes(tmp_path):
    recipe, out = write_recipe(tmp_path), tmp_path / "run"
    first = run_cli(["train-rm", str(recipe), "--out", str(out)], hang_timeout_s=HANG_S, env=CLI_ENV)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    rows = {r["mode"]: r for r in report["rows"]}
    assert set(rows) == {"none", "profile"} and rows["none"]["n"] == rows["profile"]["n"] == 12 * 3 + 4 * 2
    assert rows["profile"]["vs_none"]["pairs"] == rows["none"]["n"] and "vs_none" not in rows["none"]
    groups = rows["profile"]["groups"]   # seen and cold-start users apart, from the shards' profiles
    assert groups["seen"]["n"] == 12 * 3 and groups["cold-start"]["n"] == 4 * 2
    assert groups["cold-start"]["vs_none"]["pairs"] == 4 * 2
    assert "world no_history" in report["references"] and (out / "report.png").is_file()
    for mode in rows:
        assert is_complete(out / mode / "model") and is_complete(out / mode / "eval")
        history = json.loads((out / mode / "history.json").read_text())
        assert len(history) == 6 and all(math.isfinite(h["rm/bt_loss"]) for h in history)
        correct = correct_by_pair(out / mode / "eval" / PREDICTIONS_FILE)   # the report: the model's own verdicts
        assert len(correct) == rows[mode]["n"] and rows[mode]["accuracy"] == pytest.approx(
            sum(correct.values()) / len(correct))
    assert_weights_moved(out / "none" / "model")
    assert "cold-start users never trained on" in first.stdout.replace("\n", " ")

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'profile' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("rm_e2e").experiment_id])
    assert "rm/bt_loss" in run.data.metrics and run.data.tags["input_mode"] == "profile"

    # an interrupted profile RM (its checkpoint at step 3 kept, nothing after it): the rerun resumes it
    shutil.rmtree(out / "profile" / "model")
    shutil.rmtree(out / "profile" / "eval")
    (out / "profile" / "history.json").unlink()
    again = run_cli(["train-rm", str(recipe), "--out", str(out)], hang_timeout_s=HANG_S, env=CLI_ENV)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    text = again.stdout.replace("\n", " ")
    assert "none:" in text and "not retrained" in text and "profile: resumed from" in text
    assert len(json.loads((out / "profile" / "history.json").read_text())) == 6
    assert json.loads((out / "report.json").read_text())["rows"][1]["n"] == rows["profile"]["n"]


def test_plan_mode_plans_every_training_query_once_and_evaluates_with_the_planner(tmp_path):
    """Mechanics only: an untrained tiny planner writes poor rubrics (a failed plan shows an empty block)."""
    recipe, out = write_recipe(tmp_path), tmp_path / "run"
    planner = '{backend: hf, model: tiny}'
    args = ["train-rm", str(recipe), "--out", str(out), "--set", "rm.input_modes=[plan]", "--set",
            f"rm.planner={planner}", "--set", "rm.planner_generation.max_tokens=12", "--set", "rm.steps=2"]
    run = run_cli(args, hang_timeout_s=HANG_S, env=CLI_ENV)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    plans = json.loads((out / "plans_train.json").read_text())
    assert len(plans) == 12 * 4 and all(isinstance(aspects, list) for aspects in plans.values())
    (row,) = json.loads((out / "report.json").read_text())["rows"]
    assert row["mode"] == "plan" and row["n"] == 12 * 3 + 4 * 2
    metrics = json.loads((out / "plan" / "eval" / "metrics.json").read_text())
    assert "pointwise/plan" in metrics["groups"]
