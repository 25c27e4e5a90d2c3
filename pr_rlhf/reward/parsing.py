"""Typed parse results shared by every reward-model parser, and think-block stripping.

Parsers read model output and NEVER raise on it: they return a :class:`Parsed` that holds either a value or an
error kind (one of :data:`ErrorKind`) with a short message, and callers count the kinds. :func:`never_raises`
is a last-resort net: an unexpected exception inside a parser becomes the kind ``"internal"`` (the fuzz tests
assert that it never occurs, so a parser bug shows up there instead of being hidden).
"""
from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, get_args

T = TypeVar("T")

ErrorKind = Literal[
    "empty",            # nothing to read (blank output, or nothing after the closing think tag)
    "unclosed_think",   # a <think> block that never closes: the model never reached its answer
    "no_verdict",       # no "Result: A|B" line
    "ambiguous",        # the verdict names both slots, or neither (e.g. "Result: tie")
    "no_score",         # no "Score: N" line
    "no_aspects",       # no numbered or bulleted aspect line
    "no_json",          # no JSON object where one was required
    "bad_json",         # a JSON object that does not decode
    "missing_scores",   # the final scores (or the criterion scores to recompute them) are missing
    "bad_weights",      # a criterion weight that is missing, not a number, not finite, or not positive
    "bad_score",        # a score that is not a number, not finite, or out of range
    "missing_section",  # (strict SEC parsing) a required tagged part is missing
    "no_coverage",      # (PR judge) no "Coverage: X/10" line, or a value outside the scale
    "tie",              # parsed fine, but both responses got the same score: no preference
    "engine_error",     # the engine failed on this request (Generation.error)
    "internal",         # a parser bug caught by never_raises (must never happen)
]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)


@dataclass(frozen=True)
class Parsed(Generic[T]):
    """Either ``value`` (``error is None``) or an ``error`` kind with a human-readable ``message``."""

    value: T | None = None
    error: ErrorKind | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def success(cls, value: T) -> Parsed[T]:
        return cls(value=value)

    @classmethod
    def fail(cls, error: ErrorKind, message: str = "") -> Parsed[T]:
        return cls(error=error, message=message[:300])


def never_raises(fn: Callable[..., Parsed]) -> Callable[..., Parsed]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Parsed:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the whole point: model output must never crash a caller
            return Parsed.fail("internal", f"{fn.__name__}: {type(exc).__name__}: {exc}")
    return wrapper


_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)


def strip_think(text: str) -> str:
    """The answer part of a generation: everything after the last ``</think>``.

    A ``<think>`` that is not closed afterwards means the model never reached its answer: the result is ``""``.
    A closing tag without an opening one (chat templates often put ``<think>`` in the prompt) is honoured.
    """
    if not isinstance(text, str):
        return ""
    closes = list(_THINK_CLOSE.finditer(text))
    tail = text[closes[-1].end():] if closes else text
    if _THINK_OPEN.search(tail):
        return ""
    return tail.strip()


def answer_text(text: Any) -> Parsed[str]:
    """``strip_think`` with the reason when nothing is left (``"unclosed_think"`` or ``"empty"``)."""
    if not isinstance(text, str) or not text.strip():
        return Parsed.fail("empty", "no text")
    answer = strip_think(text)
    if answer:
        return Parsed.success(answer)
    closes = list(_THINK_CLOSE.finditer(text))
    tail = text[closes[-1].end():] if closes else text
    if _THINK_OPEN.search(tail):
        return Parsed.fail("unclosed_think", "a <think> block is never closed")
    return Parsed.fail("empty", "nothing after </think>")


_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def to_number(value: Any) -> float | None:
    """A finite float from a JSON number or a numeric string (``"7"``, ``" 7.5 "``, ``"8/10"``); else None.

    Booleans are not numbers here (``True`` is an int in Python, never a score).
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except (OverflowError, ValueError):
            return None
        return number if math.isfinite(number) else None
    if isinstance(value, str):
        text = value.strip().strip("*_`'\"").strip()
        text = re.sub(r"\s*/\s*(?:10|100)\s*$", "", text)  # "8/10": the scale, not a fraction to evaluate
        text = text.rstrip("%").strip()
        if len(text) > 64 or not _NUMBER.fullmatch(text):
            return None
        try:
            number = float(text)
        except (OverflowError, ValueError):
            return None
        return number if math.isfinite(number) else None
    return None
