"""Which training prompts a GRPO step of the GenRM sees: the data's natural mix, or a hard-negative curriculum whose
share of hard pairs (pairs that differ in exactly one attribute: near-equal quality, only fit to the user decides)
rises linearly from ``start`` at the first step to ``end`` at the last. Pure and seeded: step ``t`` of a run
always draws the same prompts, so a resumed run continues exactly."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def hard_share_at(step: int, steps: int, start: float, end: float) -> float:
    """The scheduled share of hard prompts at ``step`` (0-based) of ``steps``."""
    if steps <= 1:
        return end
    return start + (end - start) * min(max(step, 0), steps - 1) / (steps - 1)


def step_prompts(pool: Sequence[T], hard: Sequence[bool], step: int, count: int, seed: int,
                 schedule: tuple[float, float, int] | None = None, draw: int = 0,
                 exclude: Sequence[T] = ()) -> list[T]:
    """``count`` prompts for ``step``. Without a schedule: a seeded sample of the whole pool (its natural mix).
    With ``schedule = (start, end, steps)``: round(share * count) hard prompts and the rest standard ones, each
    a seeded sample without replacement from its part of the pool. ``draw`` > 0: a further, independent draw
    for the same step (the refill of dynamic sampling), at the step's share, never one of ``exclude`` (the
    prompts the step already drew: the same objects of ``pool``)."""
    rng = np.random.default_rng([seed, step, 23] + ([draw] if draw else []))
    taken = {id(item) for item in exclude}
    if schedule is None:
        free = [i for i in range(len(pool)) if id(pool[i]) not in taken]
        return [pool[i] for i in rng.choice(free, min(count, len(free)), replace=False)]
    start, end, steps = schedule
    hard_idx = [i for i, h in enumerate(hard) if h and id(pool[i]) not in taken]
    easy_idx = [i for i, h in enumerate(hard) if not h and id(pool[i]) not in taken]
    share = hard_share_at(step, steps, start, end)
    if (share > 0 and not hard_idx) or (share < 1 and not easy_idx):
        raise ValueError(f"a curriculum needs hard and standard prompts; the pool has {len(hard_idx)} hard and "
                         f"{len(easy_idx)} standard")
    n_hard = int(round(share * count))
    picked = list(rng.choice(hard_idx, min(n_hard, len(hard_idx)), replace=False)) + \
        list(rng.choice(easy_idx, min(count - n_hard, len(easy_idx)), replace=False))
    return [pool[i] for i in picked]
