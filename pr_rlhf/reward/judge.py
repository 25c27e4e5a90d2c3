"""Pairwise generative judge (docs/protocols.md section 3): seeded slot assignment, prompts, verdict parsing.

Which slot holds the chosen answer is a seeded coin per pair (:func:`chosen_slot`): a hash of (seed, pair_id), so
it is stable across runs, machines and batch order, and balanced over pairs. With ``fmt="judge"`` the engine
writes a free-form judgement that ends with ``Result: A|B``; with ``fmt="sec"`` it writes a P-GenRM structured
evaluation chain (response_1 = slot A, response_2 = slot B) and the higher final score wins (equal = a tie); with
``fmt="tagged"`` (reasoning RMs of the RM-R1 family) it closes with ``<answer>[[A]]</answer>``, with ``fmt="json"``
(the R3 / mR3 family) it answers a JSON verdict (``pr_rlhf.reward.verdicts``).
Honest accounting: a parse failure, a tie or an engine error is never correct.

:func:`slot_a_probabilities` reads a verdict without letting the judge write: its probability of answering
``Result: A`` against ``Result: B`` at the start of its answer, normalized over the two (the readout of G-Eval, Liu et
al. 2023, section 2.3, applied to the two verdicts). A model too small to write a parseable judgement still gives a
verdict for every pair this way.
"""
from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pr_rlhf.models.base import Engine, Generation, SamplingParams
from pr_rlhf.prompts import chat
from pr_rlhf.reward.inputs import InputMode, RMInput, conversation_block, user_block
from pr_rlhf.reward.parsing import ErrorKind, Parsed, answer_text, never_raises
from pr_rlhf.reward.sec import SEC, parse_sec, sec_compact_prompt, sec_prompt
from pr_rlhf.reward.verdicts import parse_json_verdict, parse_tagged_verdict

Slot = Literal["A", "B"]


def chosen_slot(seed: int, pair_id: str) -> Slot:
    """``"A"`` or ``"B"`` with probability 1/2 each, fixed by (seed, pair_id)."""
    digest = hashlib.sha256(f"{int(seed)}\x00{pair_id}".encode()).digest()
    return "A" if digest[0] & 1 == 0 else "B"


def other(slot: Slot) -> Slot:
    return "B" if slot == "A" else "A"


# ----------------------------------------------------------------------------------------------------------------
# Verdict parsing
# ----------------------------------------------------------------------------------------------------------------

# A line that starts (after markdown decoration) with "Result" or "Final result", then ":" / "-" / "=" / "is".
_RESULT_LINE = re.compile(r"^[\s>*_#`~\-]*(?:final\s+)?(?:result|verdict)[\s*_`]*(?::|-|=|\bis\b)(?P<tail>.*)$",
                          re.IGNORECASE)
_DECORATION = re.compile(r"[*_`#\[\]()\"'<>{}]")
_SLOT_WORD = r"(?:(?i:answer|response|option|slot|assistant)\s*)?"
_ONLY = re.compile(rf"^{_SLOT_WORD}([abAB])\s*[.!]?$")                   # "A", "b.", "Answer B"
# "A or B", "A/B": the second letter is upper case, so "B, a bit better" is not a pair
_PAIR = re.compile(rf"^{_SLOT_WORD}([abAB])\s*(?:/|,|&|\||(?i:\bor\b|\band\b|\bvs\b\.?)|=)\s*{_SLOT_WORD}([AB])\b")
_LEADING = re.compile(rf"^{_SLOT_WORD}([AB])\b(?!['’])")                # "A (shorter)", "Response B is better"
_TIE_WORDS = re.compile(r"\b(?:tie|tied|both|neither|equal|same|none|draw)\b", re.IGNORECASE)


def _clean(tail: str) -> str:
    return " ".join(_DECORATION.sub(" ", tail).split())


@never_raises
def parse_verdict(text: str) -> Parsed[Slot]:
    """The slot named by the last ``Result: A`` / ``Result: B`` line, after dropping the think block.

    Tolerates case, spacing and markdown (``**Result:** B``, ``Result: [A]``, ``Result: Answer B``, the letter
    alone on the line after ``**Result:**``). A result line naming both slots or neither (``Result: A or B``,
    ``Result: tie``) is ``"ambiguous"``; no result line at all is ``"no_verdict"``.
    """
    answer = answer_text(text)
    if not answer.ok:
        return Parsed.fail(answer.error, answer.message)  # type: ignore[arg-type]
    lines = answer.value.splitlines()
    found = [(i, m.group("tail")) for i, m in enumerate(map(_RESULT_LINE.match, lines)) if m]
    if not found:
        return Parsed.fail("no_verdict", "no 'Result: A|B' line")
    index, raw_tail = found[-1]
    tail = _clean(raw_tail)
    if not tail:  # "**Result:**" with the letter on the next non-blank line
        tail = next((_clean(line) for line in lines[index + 1:] if _clean(line)), "")
    pair = _PAIR.match(tail)
    if pair:
        first, second = pair.group(1).upper(), pair.group(2).upper()
        if first != second:
            return Parsed.fail("ambiguous", f"the result line names both slots: {tail[:80]!r}")
        return Parsed.success(first)
    for pattern in (_ONLY, _LEADING):
        match = pattern.match(tail)
        if match:
            return Parsed.success(match.group(1).upper())
    if _TIE_WORDS.search(tail):
        return Parsed.fail("ambiguous", f"the result line names no single slot: {tail[:80]!r}")
    return Parsed.fail("no_verdict", f"the result line names no slot: {tail[:80]!r}")


def sec_verdict(sec: SEC) -> Slot | None:
    """Slot A (response_1) or B (response_2) by the higher final score; None on a tie."""
    s1, s2 = sec.final["response_1"], sec.final["response_2"]
    return None if s1 == s2 else ("A" if s1 > s2 else "B")


# ----------------------------------------------------------------------------------------------------------------
# Judge
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class JudgeVerdict:
    pair_id: str
    chosen_slot: Slot
    predicted: Slot | None
    error: ErrorKind | None
    raw: str
    scores: tuple[float, float] | None = None   # fmt="sec": final scores of (slot A, slot B)
    sec: SEC | None = None                      # fmt="sec": the parsed chain

    @property
    def correct(self) -> bool:
        return self.error is None and self.predicted is not None and self.predicted == self.chosen_slot


def judge_prompt(inp: RMInput, answer_a: str, answer_b: str, mode: InputMode = "none", top_k: int = 10,
                 template: str = "pairwise_judge", block: str | None = None) -> list[dict]:
    """``block``: what the judge is shown about the user instead of the input mode's block (a persona)."""
    return chat(template, user_block=user_block(inp, mode, top_k) if block is None else block,
                conversation_block=conversation_block(inp), question=inp.question, answer_a=answer_a,
                answer_b=answer_b)


JudgeFormat = Literal["judge", "sec", "sec_compact", "tagged", "json"]
JUDGE_FORMATS: tuple[str, ...] = ("judge", "sec", "sec_compact", "tagged", "json")
# the free-form formats: their prompt template and verdict parser
_FREE_FORMATS = {"judge": ("pairwise_judge", parse_verdict), "tagged": ("tagged_judge", parse_tagged_verdict),
                 "json": ("json_judge", parse_json_verdict)}


VERDICT_LINES = ("Result: A", "Result: B")


def slot_a_probabilities(engine: Engine, prompts: Sequence[list[dict]]) -> list[tuple[float | None, ErrorKind | None]]:
    """For each prompt, P(``Result: A``) / (P(``Result: A``) + P(``Result: B``)) as the judge would answer it, or
    ``(None, "engine_error")`` for a prompt the engine refuses (too long for the model). An engine that cannot score
    continuations at all raises: that is a configuration to fix, not a pair to count."""
    out: list[tuple[float | None, ErrorKind | None]] = []
    for prompt in prompts:
        try:
            a, b = engine.score_continuations(prompt, list(VERDICT_LINES))
        except ValueError:
            out.append((None, "engine_error"))
            continue
        if not (math.isfinite(a) and math.isfinite(b)):
            out.append((None, "engine_error"))
            continue
        out.append((0.5 * (1.0 + math.tanh((a - b) / 2.0)), None))   # the logistic of a - b, without overflow
    return out


class PairwiseJudge:
    """A generative judge over any :class:`~pr_rlhf.models.base.Engine` (one generation per judged order).

    Only the first sample of each generation is read; for several samples per pair use the engine directly
    with :func:`parse_verdict` / :func:`pr_rlhf.reward.sec.parse_sec`.
    """

    def __init__(self, engine: Engine, *, params: SamplingParams, seed: int,
                 fmt: JudgeFormat = "judge", use_stated_preferences: bool = True):
        if fmt not in JUDGE_FORMATS:
            raise ValueError(f"unknown judge format {fmt!r}; expected one of {JUDGE_FORMATS}")
        self.engine = engine
        self.params = params
        self.seed = int(seed)
        self.fmt = fmt
        self.use_stated_preferences = use_stated_preferences

    def prompt(self, inp: RMInput, slot: Slot, mode: InputMode, top_k: int) -> list[dict]:
        """The prompt with the chosen answer in ``slot``."""
        a, b = (inp.chosen, inp.rejected) if slot == "A" else (inp.rejected, inp.chosen)
        if self.fmt == "sec":
            return sec_prompt(inp, a, b, mode=mode, top_k=top_k, use_stated=self.use_stated_preferences)
        if self.fmt == "sec_compact":   # history only: the small P-GenRM trained by `pr-rlhf pgenrm`
            return sec_compact_prompt(inp, a, b)
        return judge_prompt(inp, a, b, mode, top_k, template=_FREE_FORMATS[self.fmt][0])

    def judge(self, inputs: Sequence[RMInput], mode: InputMode, top_k: int,
              both_orders: bool = False) -> list[JudgeVerdict]:
        """One verdict per pair (seeded order), or two per pair (seeded order, then swapped) with both_orders."""
        jobs: list[tuple[RMInput, Slot]] = []
        for inp in inputs:
            slot = chosen_slot(self.seed, inp.pair_id)
            jobs.append((inp, slot))
            if both_orders:
                jobs.append((inp, other(slot)))
        if not jobs:
            return []
        generations = self.engine.generate([self.prompt(inp, slot, mode, top_k) for inp, slot in jobs], self.params)
        if len(generations) != len(jobs):
            raise RuntimeError(f"engine {getattr(self.engine, 'name', '?')} returned {len(generations)} "
                               f"generations for {len(jobs)} prompts")
        return [self._verdict(inp.pair_id, slot, gen) for (inp, slot), gen in zip(jobs, generations)]

    def _verdict(self, pair_id: str, slot: Slot, gen: Generation) -> JudgeVerdict:
        if gen.error is not None:
            return JudgeVerdict(pair_id, slot, None, "engine_error", gen.error)
        if not gen.samples:
            return JudgeVerdict(pair_id, slot, None, "empty", "")
        raw = gen.samples[0].text
        if self.fmt not in _FREE_FORMATS:
            parsed = parse_sec(raw)
            if not parsed.ok:
                return JudgeVerdict(pair_id, slot, None, parsed.error, raw)
            sec = parsed.value
            predicted = sec_verdict(sec)
            return JudgeVerdict(pair_id, slot, predicted, "tie" if predicted is None else None, raw,
                                scores=(sec.final["response_1"], sec.final["response_2"]), sec=sec)
        parsed = _FREE_FORMATS[self.fmt][1](raw)
        return JudgeVerdict(pair_id, slot, parsed.value, parsed.error, raw)  # type: ignore[arg-type]
