"""Verdict parsers of generative judges whose format is not this project's ``Result: A|B`` line: a reasoning
reward model's tagged answer (the RM-R1 family, ``<answer>[[A]]</answer>``) and a JSON verdict (the R3 / mR3
family, ``{"explanation": ..., "score": "Assistant A"}``). Like every parser here they never raise on model output:
a :class:`~pr_rlhf.reward.parsing.Parsed` slot, or the failure's kind, which callers count."""
from __future__ import annotations

import json
import re
from typing import Any

from pr_rlhf.reward.parsing import Parsed, answer_text, never_raises

_ANSWER_TAG = re.compile(r"<answer>(?P<body>.*?)</answer>", re.IGNORECASE | re.DOTALL)
_BRACKETED = re.compile(r"\[\[\s*([AB])\s*\]\]", re.IGNORECASE)
# what a verdict field or an answer tag may say for a slot: "A", "[[A]]", "Assistant A", "Chatbot B", "Response 1"
_SLOT_NAME = re.compile(r"^(?:the\s+)?(?:(?:assistant|chatbot|response|answer|model|output)\s*)?"
                        r"(?P<slot>[AB12])(?:'s\s+response)?\s*[.!]?$", re.IGNORECASE)
_VERDICT_FIELDS = ("score", "verdict", "winner", "preference", "better_response", "choice")


def _slot_of(value: Any) -> str | None:
    """"A" / "B" when ``value`` names exactly one slot (1 and 2 are the slots' numbers), else None."""
    if isinstance(value, bool) or value is None:
        return None
    text = " ".join(str(value).replace("[", " ").replace("]", " ").split())
    match = _SLOT_NAME.match(text)
    if not match:
        return None
    return {"1": "A", "2": "B"}.get(match.group("slot").upper(), match.group("slot").upper())


@never_raises
def parse_tagged_verdict(text: str) -> Parsed[str]:
    """The slot in the last ``<answer>...</answer>`` block (``[[A]]``, ``A``, ``Chatbot B``); without any answer tag,
    a bracketed ``[[A]]`` / ``[[B]]`` in the answer part. Naming both slots or neither is ``"ambiguous"``; no
    answer at all ``"no_verdict"``."""
    answer = answer_text(text)
    if not answer.ok:
        return Parsed.fail(answer.error, answer.message)  # type: ignore[arg-type]
    tags = list(_ANSWER_TAG.finditer(answer.value))
    body = tags[-1].group("body") if tags else answer.value
    bracketed = {m.upper() for m in _BRACKETED.findall(body)}
    if len(bracketed) > 1:
        return Parsed.fail("ambiguous", f"the answer names both slots: {body.strip()[:80]!r}")
    if bracketed:
        return Parsed.success(bracketed.pop())
    if not tags:
        return Parsed.fail("no_verdict", "no <answer>...</answer> tag and no [[A]] / [[B]]")
    slot = _slot_of(body.strip())
    if slot is None:
        return Parsed.fail("ambiguous", f"the answer tag names no single slot: {body.strip()[:80]!r}")
    return Parsed.success(slot)


def _json_objects(text: str) -> list[tuple[Any, str]]:
    """Every top-level ``{...}`` span of ``text`` with its decoded value (or the exception's message), in order."""
    out, depth, start, in_string, escaped = [], 0, None, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"' and depth:
            in_string = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0 and start is not None:
                span = text[start:i + 1]
                try:
                    out.append((json.loads(span), ""))
                except ValueError as exc:
                    out.append((None, f"{exc}"))
    return out


@never_raises
def parse_json_verdict(text: str) -> Parsed[str]:
    """The slot named by the verdict field (``score``, or ``verdict`` / ``winner`` / ``preference``) of the last JSON
    object in the answer part (a fenced code block or bare). ``"no_json"`` without an object, ``"bad_json"`` when the
    last one does not decode, ``"no_verdict"`` without a verdict field, ``"ambiguous"`` when it names no single
    slot."""
    answer = answer_text(text)
    if not answer.ok:
        return Parsed.fail(answer.error, answer.message)  # type: ignore[arg-type]
    objects = _json_objects(answer.value)
    if not objects:
        return Parsed.fail("no_json", "no JSON object")
    value, error = objects[-1]
    if error or not isinstance(value, dict):
        return Parsed.fail("bad_json", error or f"a JSON {type(value).__name__}, not an object")
    field = next((f for f in _VERDICT_FIELDS if f in value), None)
    if field is None:
        return Parsed.fail("no_verdict", f"no verdict field (one of {', '.join(_VERDICT_FIELDS)}) in {sorted(value)}")
    slot = _slot_of(value[field])
    if slot is None:
        return Parsed.fail("ambiguous", f"{field}: {str(value[field])[:80]!r} names no single slot")
    return Parsed.success(slot)
