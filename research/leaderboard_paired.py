"""The leaderboard's paired comparisons beyond its table (which compares every row with the global BT and with
P-GenRM): the LLM judge with the user's preference history against without (addendum 14-17, prediction 15; on the
judges' users) -> ``judges.json``; the fine-tuned BT RM with history against without, and PAL and LoRe against the
BT RM with history (addendum 18-23, predictions 19 and 21) -> ``bt_rms.json``; the judge reading a SynthesizeMe
persona against the judge without user information and with the preference history (addendum 24-27, predictions 24
and 25; on the persona's users) -> ``persona.json``; the BT RM reading retrieved posts against without and against
the one reading history (addendum 40-43) and the BT RM reading a SynthesizeMe persona against without, with history
and with posts (addendum 44-47) -> ``bt_rms.json``; the judge + history given 8 of a cold-start user's
pairs against none and against PAL given the same 8 (addendum 36-39, on the judge's users) -> ``few_shot_judge.json``.
Each per world and pooled over the reported worlds, on the development world apart, and on DSP (addendum 32-35),
where the rows were scored there; 95% CIs resample users (queries on DSP). Reads the committed per-pair outcomes
(``docs/results/leaderboard/w<world>/outcomes.json`` or ``few_shot_outcomes.json``, ``dsp/outcomes.json``);
``tests/unit/test_leaderboard_results.py`` recomputes them.

    .venv/bin/python research/leaderboard_paired.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "docs" / "results" / "leaderboard"
# file -> (new row, old row) pairs, each compared on the pairs both scored
COMPARISONS = {"judges.json": [("judge_history", "judge")],
               "bt_rms.json": [("bt_history", "bt_none"), ("pal", "bt_history"), ("lore", "bt_history"),
                               ("bt_profile", "bt_none"), ("bt_profile", "bt_history"), ("bt_persona", "bt_none"),
                               ("bt_persona", "bt_history"), ("bt_persona", "bt_profile")],
               "persona.json": [("persona", "judge"), ("persona", "judge_history")],
               "few_shot_judge.json": [("judge_history@8", "judge_history@0"), ("judge_history@8", "pal@8")]}
# the few-shot curve's arms (``<row>@<k>``, cold-start users only) are in each world's few_shot_outcomes.json
FEW_SHOT = {"few_shot_judge.json"}


def paired(new: str, old: str, outcomes: str = "outcomes.json") -> dict:
    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.eval.groups import EVAL_GROUPS
    from pr_rlhf.eval.worlds import Endpoint, WorldOutcomes, analyse

    cfg = load_recipe(ROOT / "recipes" / "leaderboard.yaml").leaderboard
    out = {"new": new, "old": old}
    for name, worlds in (("reported", cfg.worlds), ("development", cfg.development_worlds)):
        frames = [WorldOutcomes.load(RESULTS / f"w{w}" / outcomes) for w in worlds]
        frames = [f for f in frames if {new, old} <= set(f.arms)]   # a row scored on some worlds only
        if not frames:
            continue
        endpoints = [Endpoint(f"{new} - {old} ({group})", new, old, group) for group in EVAL_GROUPS
                     if any(group in f.groups for f in frames)]
        out[name] = {"worlds": [f.world for f in frames],
                     "analysis": analyse(frames, endpoints, n_bootstrap=cfg.n_bootstrap, seed=cfg.seed)}
    dsp = RESULTS / "dsp" / "outcomes.json"   # the real set: its users are all seen, its CIs resample queries
    frame = WorldOutcomes.load(dsp) if dsp.is_file() else None
    if frame is not None and {new, old} <= set(frame.arms):
        out["dsp"] = {"analysis": analyse([frame], [Endpoint(f"{new} - {old} (seen)", new, old, "seen")],
                                          n_bootstrap=cfg.n_bootstrap, seed=cfg.seed)}
    return json.loads(json.dumps(out))


def comparisons(file: str) -> dict:
    """``file``'s content: one comparison as its own object (judges.json), several as a list."""
    pairs = COMPARISONS[file]
    outcomes = "few_shot_outcomes.json" if file in FEW_SHOT else "outcomes.json"
    return paired(*pairs[0], outcomes) if len(pairs) == 1 else {"comparisons": [paired(*p, outcomes) for p in pairs]}


def main() -> None:
    for file in COMPARISONS:
        result = comparisons(file)
        (RESULTS / file).write_text(json.dumps(result, indent=1) + "\n")
        for entry in result.get("comparisons", [result]):
            for name in ("reported", "development", "dsp"):
                for key, analysis in entry.get(name, {}).get("analysis", {}).items():
                    fixed = analysis["pooled"]["fixed"]
                    print(f"{name} {key}: {100 * fixed['gain']:+.1f} [{100 * fixed['ci_low']:+.1f}, "
                          f"{100 * fixed['ci_high']:+.1f}]")


if __name__ == "__main__":
    main()
