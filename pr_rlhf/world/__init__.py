"""The synthetic persona world: a deterministic, seeded personalized-preference world with known ground truth.

>>> from pr_rlhf.world import WorldConfig, build_world
>>> world = build_world(WorldConfig(users=4, cold_start_users=1))
>>> world.detect("- one\\n- two, for example!")["structure"]
1

Only the config imports eagerly (it needs no numpy); the rest loads on first use.
"""
from __future__ import annotations

from typing import Any

from pr_rlhf.configs.world import WorldConfig

_LAZY = {
    "World": "generator", "WorldPair": "generator", "WorldUser": "generator", "build_world": "generator",
    "detect": "attributes", "gold_utility": "attributes", "CATALOG": "attributes",
    "reference_accuracies": "reference", "reference_scores": "reference", "Estimate": "reference",
}

__all__ = [
    "CATALOG",
    "Estimate",
    "World",
    "WorldConfig",
    "WorldPair",
    "WorldUser",
    "build_world",
    "detect",
    "gold_utility",
    "reference_accuracies",
    "reference_scores",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"pr_rlhf.world.{_LAZY[name]}"), name)
    raise AttributeError(name)
