"""The committed comparison of the one-step-off rollout with the sequential step (docs/results/async_rollout/) is
what its committed per-prompt histories give: ``analysis.json`` recomputed by the study's own analysis from the runs'
``history.json`` files (held-out reward per prompt at each evaluation, the users of the prompts, every step's
staleness and importance weights)."""
from __future__ import annotations

import json
from pathlib import Path

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "async_rollout"


def study():
    return load_script("research/async_vs_sync.py", "async_vs_sync")


def test_the_committed_analysis_is_its_committed_histories():
    committed = json.loads((RESULTS / "analysis.json").read_text())
    again = study().analyse(committed["seeds"])
    assert json.loads(json.dumps(again)) == committed
    for seed in committed["seeds"]:
        for mode in ("sync", "one_step_off"):
            history = json.loads((RESULTS / "histories" / f"{mode}_s{seed}.history.json").read_text())
            assert [e["step"] for e in history["evals"]] == [0, 10, 20]
            assert len(history["heldout_users"]) == len(history["evals"][-1]["heldout_reward_per_prompt"])


def test_the_development_seed_is_apart():
    assert 0 not in json.loads((RESULTS / "analysis.json").read_text())["seeds"]
