"""Two RL runs compared on what their policies earn on the same held-out prompts: the last evaluation of each
(``history.json``), paired over prompts, with a 95% bootstrap CI. The downstream scorer's values
(``train.downstream``, e.g. the world's gold utility) when both runs have them, else their own rewards, which are
comparable only when both runs trained on the same reward."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pr_rlhf.stats import paired_difference_ci

DOWNSTREAM, OWN = "heldout_downstream_per_prompt", "heldout_reward_per_prompt"


def last_eval(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "history.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (a finished `pr-rlhf train` run writes it)")
    evals = json.loads(path.read_text()).get("evals") or []
    if not evals:
        raise KeyError(f"{path}: no held-out evaluation")
    return evals[-1]


def compare_runs(new: str | Path, old: str | Path, seed: int = 0) -> dict[str, Any]:
    """Mean over held-out prompts of (new - old), with its CI, on the downstream values or the own rewards."""
    a, b = last_eval(new), last_eval(old)
    key = DOWNSTREAM if DOWNSTREAM in a and DOWNSTREAM in b else OWN
    x, y = np.asarray(a[key], dtype=float), np.asarray(b[key], dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"{new} and {old} were evaluated on {len(x)} and {len(y)} held-out prompts: not the same "
                         f"prompts")
    gain, low, high = paired_difference_ci(x, y, seed=seed)
    return {"new": str(new), "old": str(old), "measure": "downstream" if key == DOWNSTREAM else "own reward",
            "prompts": len(x), "new_mean": float(x.mean()), "old_mean": float(y.mean()), "gain": gain,
            "ci_low": low, "ci_high": high, "new_step": a["step"], "old_step": b["step"]}
