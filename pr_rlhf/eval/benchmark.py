"""The benchmark accuracy of a reward model, for the validity reports (Best-of-N and RL sweeps): given as a number
or a result file, or computed from the synthetic world for the world's own judges (gold = the true weights, and
the reference predictors of ``world_estimate``)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pr_rlhf.world.reference import UserGroup


def read_accuracy(value: float | str) -> float:
    """A benchmark accuracy given as a number, as 'path/result.json:group' (the group's summary accuracy), as
    'path/result.json' (a result's own summary), or as 'path/metrics.json:mode/inputs' (a cell of a `pr-rlhf
    eval` run's metrics)."""
    if not isinstance(value, str):
        return float(value)
    path, _, group = value.rpartition(":") if not value.endswith(".json") else (value, "", "")
    try:
        result = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"benchmark_accuracy: {path} does not exist (run the stage that writes it)") from None
    try:
        if "groups" in result:   # an evaluation's metrics.json: one summary per (mode, inputs) cell
            return float(result["groups"][group]["accuracy"])
        return float((result[group] if group else result)["summary"]["accuracy"])
    except (KeyError, TypeError):
        field = (f"groups.{group}.accuracy" if "groups" in result else
                 f"{group}.summary.accuracy" if group else "summary.accuracy")
        raise ValueError(f"{path}: no field {field} (keys: {sorted(result)})") from None


def benchmark_accuracies(reward_models: Mapping[str, Any], given: Mapping[str, float | str],
                         users: UserGroup = "seen") -> dict[str, float]:
    """``given`` read (:func:`read_accuracy`), plus, for each ``gold`` and ``world_estimate`` reward model it does
    not name, the pairwise accuracy of its weights on the world's held-out pairs of ``users``."""
    from pr_rlhf.world import build_world
    from pr_rlhf.world.reference import estimate_accuracy

    bench = {name: read_accuracy(value) for name, value in given.items()}
    worlds: dict[str, Any] = {}   # one build per distinct world (the reward models usually share one)
    for name, rcfg in reward_models.items():
        if name in bench or rcfg.kind not in ("gold", "world_estimate"):
            continue
        predictor = "true_weights" if rcfg.kind == "gold" else rcfg.estimator
        key = rcfg.world.model_dump_json()
        if key not in worlds:
            worlds[key] = build_world(rcfg.world)
        history = rcfg.history_pairs if rcfg.kind == "world_estimate" else 0   # the true weights read none
        bench[name] = estimate_accuracy(worlds[key], predictor, history, users=users).accuracy
    return bench
