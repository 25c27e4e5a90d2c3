"""Rows of DSP run in a run folder of their own, merged into the committed DSP outcomes
(``docs/results/leaderboard/dsp/outcomes.json``): every row both hold must agree pair for pair (the embedding
methods, scored again from their saved models), each new row is added after the committed ones with its costs, and
the table, its markdown and its plot are rewritten by the leaderboard's own ``Leaderboard.dataset_table``. What it
is for: a row whose run could not share the earlier rows' run folder (DEVIATIONS.md, item 5).

    .venv/bin/python research/dsp_rows_merged.py runs/leaderboard_dsp_bth bt_history
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "docs" / "results" / "leaderboard" / "dsp"


def merged(run: Path, rows: list[str]):
    from pr_rlhf.eval.worlds import WorldOutcomes

    committed = WorldOutcomes.load(RESULTS / "outcomes.json")
    fresh = WorldOutcomes.load(run / "datasets" / "dsp" / "outcomes.json")
    if (fresh.pairs, fresh.users) != (committed.pairs, committed.users):
        raise ValueError(f"{run}: other evaluation pairs than the committed DSP outcomes")
    shared = [a for a in fresh.arms if a in committed.arms]
    differ = [a for a in shared if fresh.arms[a] != committed.arms[a]]
    if differ:
        raise ValueError(f"{run}: rows {differ} disagree with the committed outcomes")
    missing = [r for r in rows if r not in fresh.arms]
    if missing:
        raise ValueError(f"{run}: no rows {missing} (it has {list(fresh.arms)})")
    for row in rows:
        committed.arms[row] = fresh.arms[row]
        committed.meta["costs"][row] = fresh.meta["costs"][row]
    print(f"rows agreeing with the committed outcomes: {shared}; added: {rows}")
    return committed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the run folder holding the rows (its datasets/dsp/outcomes.json)")
    parser.add_argument("rows", nargs="+", help="the rows to add")
    args = parser.parse_args()
    from pr_rlhf.configs.recipe import load_recipe
    from workers.leaderboard import Leaderboard

    outcomes = merged(args.run, args.rows)
    cfg = load_recipe(ROOT / "recipes" / "leaderboard_dsp.yaml").leaderboard
    with tempfile.TemporaryDirectory() as tmp:
        Leaderboard(cfg.model_copy(update={"out": tmp})).dataset_table("dsp", outcomes)
        for suffix in ("json", "md", "png"):
            shutil.copy(Path(tmp) / "datasets" / f"dsp.{suffix}", RESULTS / f"dsp.{suffix}")
    outcomes.save(RESULTS / "outcomes.json")


if __name__ == "__main__":
    main()
