"""Retry policy (pr_rlhf.retry): which statuses are retried, Retry-After, and the backoff schedule."""
import random

import pytest

from pr_rlhf.retry import RETRY_STATUS, Backoff, retry_after_s


def test_retry_after_header():
    assert retry_after_s("2") == 2.0 and retry_after_s("0.5") == 0.5 and retry_after_s("0") == 0.0
    for bad in (None, "", "soon", "-1", "inf", "nan", "Wed, 21 Oct 2015 07:28:00 GMT"):
        assert retry_after_s(bad) is None, bad
    assert {429, 500, 502, 503, 504} == RETRY_STATUS and 400 not in RETRY_STATUS and 501 not in RETRY_STATUS


def test_backoff_doubles_is_capped_and_honours_retry_after():
    plain = Backoff(0.2, 5.0)
    assert [plain.delay(r) for r in (1, 2, 3, 6, 7)] == [0.2, 0.4, 0.8, 5.0, 5.0]
    assert plain.delay(1, retry_after_s=3.0) == 3.0 and plain.delay(1, retry_after_s=60.0) == 5.0
    assert plain.delay(3, retry_after_s=0.1) == pytest.approx(0.8)


def test_jitter_is_seeded_and_within_half_to_one_and_a_half():
    draws = [Backoff(1.0, 100.0, random.Random(7)).delay(3) for _ in range(2)]
    assert draws[0] == draws[1]
    jittered = Backoff(1.0, 100.0, random.Random(0))
    rng = random.Random(0)
    for retry in range(1, 6):
        assert jittered.delay(retry) == 2 ** (retry - 1) * (0.5 + rng.random())   # the engine's old formula
