"""When a failed HTTP request is worth another try, and how long to wait before it.

Connection errors, timeouts, 429 and the transient 5xx are retried; the wait doubles per retry (optionally
jittered, so that many clients refused at once do not come back at once), is at least what the server's
Retry-After asks, and at most a cap. Standard library only. (``pr_rlhf/integrations/verl.py`` keeps its own
short loop: verl loads that one file by path into workers that are promised nothing beyond the standard library.)
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


def retry_after_s(value: str | None) -> float | None:
    """A Retry-After header in seconds; None when absent or not a finite non-negative number (an HTTP date)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


@dataclass
class Backoff:
    """``delay(retry)``: ``base_s * 2 ** (retry - 1)`` before retry number ``retry`` (1 = the first retry), times
    a jitter drawn from ``rng`` in [0.5, 1.5) when one is given, raised to ``retry_after_s``, capped at
    ``max_s``."""

    base_s: float
    max_s: float
    rng: random.Random | None = None

    def delay(self, retry: int, retry_after_s: float | None = None) -> float:
        delay = self.base_s * 2 ** (retry - 1)
        if self.rng is not None:
            delay *= 0.5 + self.rng.random()
        if retry_after_s is not None:
            delay = max(delay, retry_after_s)
        return min(delay, self.max_s)
