"""The leaderboard's LLM-judge comparison (pre-registration addendum, prediction 15): the judge with the user's
preference history against the judge without, paired on the same pairs (the first 30 users of each group per
world), per world and pooled over the reported worlds, and on the development world apart; 95% CIs resample users.
Reads the committed per-pair outcomes (``docs/results/leaderboard/w<world>/outcomes.json``) and writes
``docs/results/leaderboard/judges.json`` (``tests/unit/test_leaderboard_results.py`` recomputes it).

    .venv/bin/python research/leaderboard_judges.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "docs" / "results" / "leaderboard"
NEW, OLD = "judge_history", "judge"


def judges_analysis() -> dict:
    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.eval.groups import EVAL_GROUPS
    from pr_rlhf.eval.worlds import Endpoint, WorldOutcomes, analyse

    cfg = load_recipe(ROOT / "recipes" / "leaderboard.yaml").leaderboard
    endpoints = [Endpoint(f"{NEW} - {OLD} ({group})", NEW, OLD, group) for group in EVAL_GROUPS]
    out = {"new": NEW, "old": OLD}
    for name, worlds in (("reported", cfg.worlds), ("development", cfg.development_worlds)):
        frames = [WorldOutcomes.load(RESULTS / f"w{w}" / "outcomes.json") for w in worlds]
        out[name] = {"worlds": list(worlds),
                     "analysis": analyse(frames, endpoints, n_bootstrap=cfg.n_bootstrap, seed=cfg.seed)}
    return json.loads(json.dumps(out))


def main() -> None:
    result = judges_analysis()
    (RESULTS / "judges.json").write_text(json.dumps(result, indent=1) + "\n")
    for name in ("reported", "development"):
        for key, entry in result[name]["analysis"].items():
            fixed = entry["pooled"]["fixed"]
            print(f"{name} {key}: {100 * fixed['gain']:+.1f} [{100 * fixed['ci_low']:+.1f}, "
                  f"{100 * fixed['ci_high']:+.1f}]")


if __name__ == "__main__":
    main()
