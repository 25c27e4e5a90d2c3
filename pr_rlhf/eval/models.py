"""Named models evaluated beside an eval section's own (``eval.models``): each of their cells next to the section's
cell of the same (mode, inputs) on the same pairs, with the paired difference.

The section's own models are the comparison's floor (in the quickstart: the untrained models), so a row reads
"what this trained model buys over that one on these pairs". The difference scores unparsed verdicts and ties as
coin flips on both sides: an untrained generative RM parses nothing, and counted wrong its 0% would credit a trained
model with its whole accuracy rather than its gain over chance.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pr_rlhf.eval.report import correct_by_cell, fmt_accuracy_ci, fmt_paired_gain, paired_gain
from pr_rlhf.files import atomic_write_text

MODELS_JSON = "models.json"
MODELS_MARKDOWN = "models.md"
COIN_FLIP = 0.5   # an unparsed verdict's or a tie's outcome in the paired difference


def model_rows(floor_name: str, floor: Any, models: Mapping[str, Any], seed: int) -> list[dict]:
    """One row per cell: the floor's cells, then every named model's with its paired gain over the floor's cell
    of the same (mode, inputs), when the floor has one. ``floor`` and each model are ``pr_rlhf.eval.report.Report``s."""
    base = correct_by_cell(floor.predictions, unresolved=COIN_FLIP)
    rows = [{"model": floor_name, "cell": cell, "summary": s} for cell, s in floor.summaries.items()]
    for name, report in models.items():
        correct = correct_by_cell(report.predictions, unresolved=COIN_FLIP)
        for cell, s in report.summaries.items():
            vs = paired_gain(correct[cell], base[cell], seed) if cell in base and cell in correct else None
            rows.append({"model": name, "cell": cell, "summary": s, "vs_floor": vs})
    return rows


def write_models_report(run_dir: str | Path, rows: list[dict], floor_name: str, title: str) -> list[Path]:
    """``models.md`` (the table) and ``models.json`` (the rows) in ``run_dir``."""
    run_dir = Path(run_dir)
    lines = [f"# {title}", "",
             f"Each model's cells on the same pairs; the last column is the paired difference from `{floor_name}`'s "
             "cell of the same mode and inputs (95% bootstrap CI resampling users), with unparsed verdicts and ties "
             "as coin flips on both sides; the accuracy column counts them wrong.", "",
             "| model | mode/inputs | n | accuracy % [95% CI] | unparsed | vs " + floor_name + " (points) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        s = r["summary"]
        lines.append(f"| {r['model']} | {r['cell']} | {s.get('n', 0)} | {fmt_accuracy_ci(s)} | "
                     f"{s.get('failures', 0)} | {fmt_paired_gain(r.get('vs_floor'))} |")
    md = atomic_write_text(run_dir / MODELS_MARKDOWN, "\n".join(lines) + "\n")
    js = atomic_write_text(run_dir / MODELS_JSON, json.dumps(rows, indent=1, default=float) + "\n")
    return [md, js]
