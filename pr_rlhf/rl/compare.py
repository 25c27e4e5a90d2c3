"""Two RL runs compared on what their policies earn on the same held-out prompts: the last evaluation of each
(``history.json``), paired over prompts, with a 95% bootstrap CI resampling users (a user's prompts together). The
downstream scorer's values (``train.downstream``, e.g. the world's gold utility) when both runs have them, else their
own rewards, which are comparable only when both runs trained on the same reward. On the synthetic world the prompts
are also split by whether their user shares the population's taste (``population_agreement``): a reward that
ignores who asks can only serve the users who agree with everyone else, so the users who disagree are where a
personalized reward must show."""
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


def agreement_groups(run_dir: str | Path) -> dict[str, list[int]] | None:
    """Held-out prompt indices of the users who share the population's taste (cosine of their weights with the
    population's preference > 0: ``agree``) and of the others (``disagree``), in the world the run's shards were
    built from; None for a run on real data or one whose history.json predates ``heldout_users``."""
    from pr_rlhf.configs.world import WorldConfig
    from pr_rlhf.shards import ShardReader
    from pr_rlhf.world import build_world
    from pr_rlhf.world.reference import population_agreement

    run_dir = Path(run_dir)
    users = json.loads((run_dir / "history.json").read_text()).get("heldout_users")
    recipe = run_dir / "recipe.yaml"
    if not users or not recipe.is_file():
        return None
    import yaml

    shards = (yaml.safe_load(recipe.read_text()).get("train") or {}).get("data", {}).get("shards")
    built = ShardReader(shards).manifest.get("config", {}).get("world") if shards and Path(shards).is_dir() else None
    if built is None:
        return None
    cosine = population_agreement(build_world(WorldConfig.model_validate(built)), sorted(set(users)))
    return {"agree": [i for i, u in enumerate(users) if cosine[u] > 0],
            "disagree": [i for i, u in enumerate(users) if cosine[u] <= 0]}


def heldout_users(run_dir: str | Path, prompts: int) -> list[str]:
    """The user of each held-out prompt of a run (``history.json``'s ``heldout_users``): the CI's unit. A run
    written before they were recorded gets one label per prompt (prompts resampled as independent), said so by
    the caller's ``ci_unit``."""
    users = json.loads((Path(run_dir) / "history.json").read_text()).get("heldout_users")
    if users is None:
        return [f"prompt{i}" for i in range(prompts)]
    if len(users) != prompts:
        raise ValueError(f"{run_dir}/history.json: {len(users)} held-out users for {prompts} prompts")
    return list(users)


def compare_runs(new: str | Path, old: str | Path, seed: int = 0,
                 groups: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """Mean over held-out prompts of (new - old), with its CI, on the downstream values or the own rewards; on
    the synthetic world also per agreement group (``groups``; default: :func:`agreement_groups` of ``new``)."""
    a, b = last_eval(new), last_eval(old)
    key = DOWNSTREAM if DOWNSTREAM in a and DOWNSTREAM in b else OWN
    x, y = np.asarray(a[key], dtype=float), np.asarray(b[key], dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"{new} and {old} were evaluated on {len(x)} and {len(y)} held-out prompts: not the same "
                         f"prompts")
    users = heldout_users(new, len(x))
    if users != heldout_users(old, len(y)):
        raise ValueError(f"{new} and {old} held out other users' prompts: not the same prompts")
    gain, low, high = paired_difference_ci(x, y, clusters=users, seed=seed)
    by_group = {}
    for name, idx in ((agreement_groups(new) if groups is None else groups) or {}).items():
        if idx:
            g, lo, hi = paired_difference_ci(x[idx], y[idx], clusters=[users[i] for i in idx], seed=seed)
            by_group[name] = {"prompts": len(idx), "new_mean": float(x[idx].mean()),
                              "old_mean": float(y[idx].mean()), "gain": g, "ci_low": lo, "ci_high": hi}
    return {"new": str(new), "old": str(old), "measure": "downstream" if key == DOWNSTREAM else "own reward",
            "groups": by_group, "prompts": len(x), "new_mean": float(x.mean()), "old_mean": float(y.mean()),
            "gain": gain, "ci_low": low, "ci_high": high, "users": len(set(users)), "ci_unit": "user",
            "new_step": a["step"], "old_step": b["step"]}
