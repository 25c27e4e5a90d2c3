"""Checks at the boundaries of the prototype modules: model output and user input are never trusted, so shapes,
finiteness and ids are checked wherever arrays or user ids come in."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

EPS = 1e-12   # floor of a norm: a zero row stays zero instead of becoming NaN


def check_matrix(x: Any, what: str, dim: int | None = None) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim != 2:
        raise ValueError(f"{what} must be a 2-D array, got shape {arr.shape}")
    if dim is not None and arr.shape[1] != dim:
        raise ValueError(f"{what} has {arr.shape[1]} columns, expected {dim}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{what} contains NaN or inf")
    return arr


def check_unique(ids: Sequence[str], what: str = "user id") -> None:
    for uid in ids:
        if not isinstance(uid, str):
            raise TypeError(f"{what}s must be strings, got {type(uid).__name__} ({uid!r})")
    dupes = [uid for uid, count in Counter(ids).items() if count > 1]
    if dupes:
        more = f" (and {len(dupes) - 1} more)" if len(dupes) > 1 else ""
        raise ValueError(f"duplicate {what} {dupes[0]!r}{more}")
