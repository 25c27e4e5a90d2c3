"""P-GenRM's structured evaluation chain (SEC, docs/protocols.md section 4): prompt, parser and writer.

A chain has four tagged parts (the contract is spelled out in ``prompts/sec.txt``)::

    <persona> free text </persona>
    <criteria>
    1. name | weight: 40 | what it checks
    </criteria>
    <scores>
    1. name | response_1: 8 | response_2: 3 | reason
    </scores>
    <final>
    {"response_1": 6.2, "response_2": 4.35}
    </final>

:func:`parse_sec` never raises: it returns a :class:`~pr_rlhf.reward.parsing.Parsed` SEC or an error kind. Weights are
normalized to sum to 1; scores may be numeric strings. The final scores come from the last ``<final>`` block, else
from the public code's ``"better_response": {"response_1": s1, "response_2": s2}``, else they are recomputed as
the weighted sum of the criterion scores. :func:`format_sec` writes a chain the parser reads back exactly
(``parse_sec(format_sec(x)).value == x`` for any SEC whose weights came out of the parser or :func:`normalize`).
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pr_rlhf.prompts import chat
from pr_rlhf.reward.inputs import InputMode, RMInput, conversation_block, history_block, stated_block, user_block
from pr_rlhf.reward.parsing import ErrorKind, Parsed, answer_text, never_raises, to_number

SCORE_MIN, SCORE_MAX = 1.0, 10.0
WEIGHT_DECIMALS = 10   # normalized weights are rounded so that format -> parse reproduces them exactly
RESPONSES = ("response_1", "response_2")
FinalSource = Literal["final", "better_response", "recomputed"]


@dataclass
class Criterion:
    name: str
    weight: float              # normalized: the weights of a chain sum to 1
    description: str = ""


@dataclass
class CriterionScore:
    name: str
    response_1: float
    response_2: float
    reason: str = ""


@dataclass
class SEC:
    persona: str
    criteria: list[Criterion] = field(default_factory=list)
    scores: list[CriterionScore] = field(default_factory=list)
    final: dict[str, float] = field(default_factory=dict)   # {"response_1": f1, "response_2": f2}
    final_source: FinalSource = "final"

    @property
    def weights(self) -> dict[str, float]:
        return {c.name: c.weight for c in self.criteria}

    @property
    def prefers_first(self) -> bool | None:
        """The chain's verdict by slot: True when response_1's final score is higher, False when lower, None on a
        tie or a missing final score."""
        f1, f2 = self.final.get("response_1"), self.final.get("response_2")
        return None if f1 is None or f2 is None or f1 == f2 else f1 > f2

    def weighted_sums(self) -> dict[str, float] | None:
        """Each response's weighted sum of criterion scores; None when the scores do not cover the criteria."""
        aligned = _align(self.criteria, self.scores)
        if aligned is None:
            return None
        return {r: sum(c.weight * getattr(s, r) for c, s in aligned) for r in RESPONSES}


def normalize(weights: Sequence[float]) -> list[float]:
    """Positive weights as fractions that sum to 1, rounded to WEIGHT_DECIMALS.

    Weights that already sum to 100 (percentages) or to 1, up to a relative 1e-7, are only rescaled by 100 or 1,
    so normalizing is idempotent and a written chain reads back exactly; other weights are divided by their sum.
    """
    total = math.fsum(weights)
    scale = next((s for s in (100.0, 1.0) if abs(total - s) <= 1e-7 * s), total)
    return [round(w / scale, WEIGHT_DECIMALS) for w in weights]


# ----------------------------------------------------------------------------------------------------------------
# Prompt
# ----------------------------------------------------------------------------------------------------------------

def sec_prompt(inp: RMInput, response_1: str, response_2: str, *, mode: InputMode = "none", top_k: int = 10,
               use_stated: bool = True) -> list[dict]:
    """The P-GenRM prompt: the user's history triples, optional stated preferences and user block, the query and
    the two responses in slot order (the history shows once: mode ``"history"`` adds no user block)."""
    return chat("sec", history_block=history_block(inp), stated_block=stated_block(inp) if use_stated else "",
                user_block="" if mode == "history" else user_block(inp, mode, top_k),
                conversation_block=conversation_block(inp),
                question=inp.question, response_1=response_1, response_2=response_2)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def sec_compact_prompt(inp: RMInput, response_1: str, response_2: str) -> list[dict]:
    """The compact P-GenRM prompt (``prompts/sec_compact.txt``) for small models trained from scratch: one numbered
    line per history choice (``Example 1: <chosen> > <rejected>``), the query and both responses, texts flattened
    to one line. The history's questions are left out (the choice is the evidence). Numbering the lines lets a
    chain's ``Example i`` find its line by matching, not by counting; the chain asked for is the same SEC."""
    lines = "\n".join(f"Example {i}: {one_line(t.get('chosen', ''))} > {one_line(t.get('rejected', ''))}"
                       for i, t in enumerate(inp.history, 1))
    return chat("sec_compact", history_lines=lines, question=one_line(inp.question),
                response_1=one_line(response_1), response_2=one_line(response_2))


# ----------------------------------------------------------------------------------------------------------------
# Parser
# ----------------------------------------------------------------------------------------------------------------

_LIST_ITEM = re.compile(r"^\s*(?:[-*•+]\s+|\(?\d{1,3}\s*[.):]\s+)")
_WEIGHT_KEY = re.compile(r"^\s*weight\b\s*[:=]?\s*(.*)$", re.IGNORECASE)
_WEIGHT_INLINE = re.compile(r"\bweight\b\s*[:=]?\s*([^\s|,;)\]]+)", re.IGNORECASE)
_PERCENT_INLINE = re.compile(r"([-+]?\d+(?:\.\d+)?)\s*%")
_RESPONSE_KEY = re.compile(r"^\s*(?:response|resp)[\s_-]*([12])\s*[:=]\s*(.*)$", re.IGNORECASE)
_RESPONSE_INLINE = re.compile(r"\b(?:response|resp)[\s_-]*([12])\s*[:=]\s*([^\s,;|]+)", re.IGNORECASE)
_LOOSE_VALUE = r"[\"']?\s*[:=]\s*[\"']?\s*([-+]?[\w.]+)"


class _Fail(Exception):
    def __init__(self, kind: ErrorKind, message: str):
        super().__init__(message)
        self.kind = kind


def _block(text: str, tag: str) -> str | None:
    """The content of the last ``<tag>`` block (to its first ``</tag>``, or to the end when unclosed)."""
    opens = list(re.finditer(rf"<\s*{tag}\s*>", text, re.IGNORECASE))
    if not opens:
        return None
    start = opens[-1].end()
    close = re.compile(rf"<\s*/\s*{tag}\s*>", re.IGNORECASE).search(text, start)
    return text[start:close.start()] if close else text[start:]


def _item_lines(block: str) -> list[str]:
    """Lines that are list items or pipe-separated records (prose lines in a block are ignored)."""
    out = []
    for line in block.splitlines():
        if not line.strip() or not (_LIST_ITEM.match(line) or "|" in line):
            continue
        out.append(_LIST_ITEM.sub("", line, count=1).replace("**", "").strip())
    return out


def _parse_criteria(block: str) -> list[Criterion]:
    names: list[str] = []
    raw_weights: list[float] = []
    descriptions: list[str] = []
    for line in _item_lines(block):
        fields = [f.strip() for f in line.split("|")]
        name, weight, rest = fields[0], None, []
        for f in fields[1:]:
            key = _WEIGHT_KEY.match(f)
            if weight is None and (key or to_number(f) is not None):
                weight = key.group(1) if key else f
            else:
                rest.append(f)
        if len(fields) == 1:  # "Name (weight: 40): description" / "Name - 40%"
            m = _WEIGHT_INLINE.search(line) or _PERCENT_INLINE.search(line)
            if m:
                name, weight = line[:m.start()].rstrip(" ([:,-–"), m.group(1)
                rest = [line[m.end():].lstrip(" )]:-–")]
        if not name:
            raise _Fail("bad_weights", f"a criterion line has no name: {line[:80]!r}")
        if weight is None:
            raise _Fail("bad_weights", f"criterion {name[:40]!r} has no weight")
        value = to_number(weight)
        if value is None or value <= 0:
            raise _Fail("bad_weights",
                        f"criterion {name[:40]!r} has weight {str(weight)[:40]!r} (need a positive number)")
        names.append(name)
        raw_weights.append(value)
        descriptions.append(" | ".join(r for r in rest if r))
    if raw_weights and not math.isfinite(math.fsum(raw_weights)):
        raise _Fail("bad_weights", "the weights overflow")
    return [Criterion(n, w, d) for n, w, d in zip(names, normalize(raw_weights) if raw_weights else [], descriptions)]


def _score_value(raw: str | None, name: str, response: str) -> float:
    if raw is None:
        raise _Fail("missing_scores", f"criterion {name[:40]!r} has no {response} score")
    value = to_number(raw)
    if value is None or not SCORE_MIN <= value <= SCORE_MAX:
        raise _Fail("bad_score", f"criterion {name[:40]!r}: {response} score {raw[:40]!r} is not a number from 1 to 10")
    return value


def _parse_scores(block: str) -> list[CriterionScore]:
    out = []
    for line in _item_lines(block):
        fields = [f.strip() for f in line.split("|")]
        found: dict[str, str] = {}
        name, rest = fields[0], []
        for f in fields[1:]:
            key = _RESPONSE_KEY.match(f)
            if key and f"response_{key.group(1)}" not in found:
                found[f"response_{key.group(1)}"] = key.group(2)
            else:
                rest.append(f)
        if len(fields) == 1:  # "Name: response_1 = 8, response_2 = 3"
            hits = list(_RESPONSE_INLINE.finditer(line))
            if hits:
                name = line[:hits[0].start()].strip(" :-–(")
                for hit in hits:
                    found.setdefault(f"response_{hit.group(1)}", hit.group(2))
                rest = []
        if not found:
            continue  # a list line without scores (e.g. a remark) is not a score line
        s1 = _score_value(found.get("response_1"), name, "response_1")
        s2 = _score_value(found.get("response_2"), name, "response_2")
        out.append(CriterionScore(name, s1, s2, " | ".join(r for r in rest if r)))
    return out


def _align(criteria: Sequence[Criterion],
           scores: Sequence[CriterionScore]) -> list[tuple[Criterion, CriterionScore]] | None:
    """Pair each criterion with its score line, by name (case-insensitive), else by position."""
    if not criteria or not scores:
        return None
    by_name = {s.name.casefold(): s for s in scores}
    if all(c.name.casefold() in by_name for c in criteria):
        return [(c, by_name[c.name.casefold()]) for c in criteria]
    if len(criteria) == len(scores):
        return list(zip(criteria, scores))
    return None


def _key(raw: Any) -> str:
    return re.sub(r"[^a-z0-9]", "", str(raw).lower())


def _scores_from_object(obj: Any, where: str) -> dict[str, float]:
    if isinstance(obj, dict) and "better_response" in obj and isinstance(obj["better_response"], dict):
        obj = obj["better_response"]
    if not isinstance(obj, dict):
        raise _Fail("missing_scores", f"{where} is a JSON {type(obj).__name__}, not an object with the scores")
    keyed = {_key(k): v for k, v in obj.items()}
    out = {}
    for response in RESPONSES:
        if _key(response) not in keyed:
            raise _Fail("missing_scores", f"{where} has no {response!r}")
        value = to_number(keyed[_key(response)])
        if value is None:
            shown = str(keyed[_key(response)])[:40]
            raise _Fail("bad_score", f"{where}: {response} = {shown!r} is not a finite number")
        out[response] = value
    return out


def _loose_scores(text: str) -> dict[str, str] | None:
    """``{response_1: 7, response_2: '5'}`` written without valid JSON (unquoted keys, single quotes)."""
    found = {}
    for response in RESPONSES:
        m = re.search(rf"{response}{_LOOSE_VALUE}", text, re.IGNORECASE)
        if not m:
            return None
        found[response] = m.group(1)
    return found


def _object_after(text: str, start: int, where: str) -> dict[str, float]:
    """The scores of the first JSON object at or after ``start`` (strict JSON, then the loose shape)."""
    brace = text.find("{", start)
    if brace < 0:
        raise _Fail("no_json", f"{where}: no JSON object")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text, brace)
    except (ValueError, RecursionError) as exc:
        end = text.find("}", brace)
        loose = _loose_scores(text[brace:end + 1 if end >= 0 else brace + 400])
        if loose is None:
            raise _Fail("bad_json", f"{where}: {type(exc).__name__}: {str(exc)[:80]}") from None
        obj = loose
    return _scores_from_object(obj, where)


def _final_scores(answer: str) -> tuple[dict[str, float], FinalSource] | None:
    block = _block(answer, "final")
    if block is not None:
        return _object_after(block.replace("```json", "").replace("```", ""), 0, "<final>"), "final"
    hits = list(re.finditer(r"better_response", answer, re.IGNORECASE))
    if hits:
        return _object_after(answer, hits[-1].end(), "better_response"), "better_response"
    return None


@never_raises
def parse_sec(text: str, strict: bool = False) -> Parsed[SEC]:
    """Read a structured evaluation chain. ``strict=True`` (format rewards) also requires every tagged part."""
    answer = answer_text(text)
    if not answer.ok:
        return Parsed.fail(answer.error, answer.message)  # type: ignore[arg-type]
    body = answer.value
    try:
        persona_block, criteria_block, scores_block = (_block(body, t) for t in ("persona", "criteria", "scores"))
        criteria = _parse_criteria(criteria_block) if criteria_block is not None else []
        scores = _parse_scores(scores_block) if scores_block is not None else []
        persona = (persona_block or "").strip()
        sec = SEC(persona=persona, criteria=criteria, scores=scores)
        if strict:
            for part, ok in (("persona", bool(persona)), ("criteria", bool(criteria)),
                             ("scores", _align(criteria, scores) is not None and len(scores) == len(criteria)),
                             ("final", _block(body, "final") is not None)):
                if not ok:
                    raise _Fail("missing_section", f"the <{part}> part is missing, empty or incomplete")
        final = _final_scores(body)
        if final is None:
            sums = sec.weighted_sums()
            if sums is None:
                kind: ErrorKind = "missing_scores" if (criteria or scores) else "no_json"
                raise _Fail(kind, "no <final> scores, no better_response, and no complete criterion scores")
            final = (sums, "recomputed")
        sec.final, sec.final_source = final
        return Parsed.success(sec)
    except _Fail as fail:
        return Parsed.fail(fail.kind, str(fail))


# ----------------------------------------------------------------------------------------------------------------
# Writer
# ----------------------------------------------------------------------------------------------------------------

def _num(x: float) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def _field(text: str) -> str:
    """A value that stays inside one pipe-separated field."""
    return " ".join(str(text).replace("|", "/").split())


def format_sec(sec: SEC, final: bool = True) -> str:
    """Write ``sec`` in exactly the format :func:`parse_sec` reads (names and reasons are kept to one line
    without ``|``). The final scores are written as given (``sec.final``; the weighted sums when it is empty).
    ``final=False`` leaves the ``<final>`` block out: the parser then recomputes the weighted sums exactly (the
    compact chains of small models, which should not spend their capacity on decimal arithmetic)."""
    final_scores = sec.final or sec.weighted_sums() or {}
    lines = ["<persona>", sec.persona.strip(), "</persona>", "<criteria>"]
    for i, c in enumerate(sec.criteria, 1):
        # rounded at the precision normalize() keeps, so 0.21 prints as 21, not 21.000000000000004
        parts = [f"{i}. {_field(c.name)}", f"weight: {_num(round(c.weight * 100, WEIGHT_DECIMALS - 2))}"]
        lines.append(" | ".join(parts + ([_field(c.description)] if c.description.strip() else [])))
    lines += ["</criteria>", "<scores>"]
    for i, s in enumerate(sec.scores, 1):
        parts = [f"{i}. {_field(s.name)}", f"response_1: {_num(s.response_1)}", f"response_2: {_num(s.response_2)}"]
        lines.append(" | ".join(parts + ([_field(s.reason)] if s.reason.strip() else [])))
    lines.append("</scores>")
    if final:
        final = {r: float(final_scores[r]) for r in RESPONSES if r in final_scores}
        lines += ["<final>", json.dumps(final), "</final>"]
    return "\n".join(lines)
