"""How many torch (OpenMP) threads a process of this project may run: what its recipe or caller asks for, capped by
``PR_RLHF_MAX_THREADS`` when that is set.

Why a cap: processes that each run as many threads as the machine has cores spin in OpenMP barriers waiting for
each other's cores, and small operations (the tiny models) then run several times slower than with one thread
each (docs/testing.md). Whoever runs several processes side by side (the test suite's parallel workers, a job
beside another on a shared machine) sets the cap once; every place that sets a thread count goes through here.
torch is imported lazily: configs and the CLI may import this module.
"""
from __future__ import annotations

import os

MAX_THREADS_ENV = "PR_RLHF_MAX_THREADS"


def capped_threads(requested: int) -> int:
    """``requested`` (>= 1), at most ``$PR_RLHF_MAX_THREADS`` when set."""
    cap = os.environ.get(MAX_THREADS_ENV, "").strip()
    requested = max(1, int(requested))
    return min(requested, max(1, int(cap))) if cap else requested


def set_torch_threads(requested: int) -> int:
    """Set torch's intra-op threads to ``capped_threads(requested)``; returns the count set."""
    import torch

    threads = capped_threads(requested)
    torch.set_num_threads(threads)
    return threads
