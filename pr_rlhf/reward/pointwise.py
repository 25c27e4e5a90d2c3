"""Pointwise generative judge: the engine rates one answer at a time from 1 to 10 (``Score: N``).

A pair is correct when chosen scores strictly above rejected (docs/protocols.md section 3); :class:`PointScores` is
shared with the scalar RM. :func:`parse_score` never raises.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pr_rlhf.models.base import Engine, SamplingParams
from pr_rlhf.prompts import chat
from pr_rlhf.reward.inputs import InputMode, RMInput, conversation_block, user_block
from pr_rlhf.reward.parsing import ErrorKind, Parsed, answer_text, never_raises, to_number

SCORE_MIN, SCORE_MAX = 1.0, 10.0

_SCORE_LINE = re.compile(r"^[\s>*_#`~\-]*(?:final\s+)?(?:score|rating)[\s*_`]*[:=](?P<tail>.*)$", re.IGNORECASE)
_FIRST_NUMBER = re.compile(r"^[\s*_`\[\"']*([-+]?(?:\d+(?:\.\d*)?|\.\d+))(?:\s*/\s*(10|100))?")


@dataclass
class PointScores:
    chosen: float | None
    rejected: float | None
    error: ErrorKind | None = None

    @property
    def correct(self) -> bool:
        return self.error is None and self.margin is not None and self.margin > 0

    @property
    def tie(self) -> bool:
        return self.error is None and self.chosen is not None and self.chosen == self.rejected

    @property
    def margin(self) -> float | None:
        return None if self.chosen is None or self.rejected is None else self.chosen - self.rejected


@never_raises
def parse_score(text: str) -> Parsed[float]:
    """The number on the last ``Score: N`` line (``**Score:** 7``, ``Score: 7.5``, ``Score: 8/10``), from 1 to 10."""
    answer = answer_text(text)
    if not answer.ok:
        return Parsed.fail(answer.error, answer.message)  # type: ignore[arg-type]
    tails = [m.group("tail") for m in map(_SCORE_LINE.match, answer.value.splitlines()) if m]
    if not tails:
        return Parsed.fail("no_score", "no 'Score: N' line")
    number = _FIRST_NUMBER.match(tails[-1])
    if not number:
        return Parsed.fail("bad_score", f"the score line holds no number: {tails[-1].strip()[:80]!r}")
    if number.group(2) == "100":
        return Parsed.fail("bad_score", f"a score out of 100, not 1-10: {tails[-1].strip()[:80]!r}")
    value = to_number(number.group(1))
    if value is None or not SCORE_MIN <= value <= SCORE_MAX:
        return Parsed.fail("bad_score", f"score {number.group(1)[:40]!r} is not a number from 1 to 10")
    return Parsed.success(value)


def pointwise_prompt(inp: RMInput, answer: str, mode: InputMode = "none", top_k: int = 10) -> list[dict]:
    return chat("pointwise", user_block=user_block(inp, mode, top_k), conversation_block=conversation_block(inp),
                question=inp.question, answer=answer)


class PointwiseJudge:
    def __init__(self, engine: Engine, *, params: SamplingParams):
        self.engine = engine
        self.params = params

    def rate(self, inputs: Sequence[RMInput], answers: Sequence[str], mode: InputMode,
             top_k: int) -> list[tuple[float | None, ErrorKind | None]]:
        """(score or None, error kind or None) for each (input, answer)."""
        if len(inputs) != len(answers):
            raise ValueError(f"{len(inputs)} inputs but {len(answers)} answers")
        if not inputs:
            return []
        prompts = [pointwise_prompt(inp, ans, mode, top_k) for inp, ans in zip(inputs, answers)]
        generations = self.engine.generate(prompts, self.params)
        if len(generations) != len(prompts):
            raise RuntimeError(f"engine returned {len(generations)} generations for {len(prompts)} prompts")
        out: list[tuple[float | None, ErrorKind | None]] = []
        for gen in generations:
            if gen.error is not None:
                out.append((None, "engine_error"))
            elif not gen.samples:
                out.append((None, "empty"))
            else:
                parsed = parse_score(gen.samples[0].text)
                out.append((parsed.value, parsed.error))
        return out

    def score_pairs(self, inputs: Sequence[RMInput], mode: InputMode, top_k: int) -> list[PointScores]:
        """Chosen and rejected rated separately (in one engine call); the first failure is the pair's error."""
        n = len(inputs)
        rated = self.rate(list(inputs) * 2, [i.chosen for i in inputs] + [i.rejected for i in inputs], mode, top_k)
        return [PointScores(c, r, ce or re_) for (c, ce), (r, re_) in zip(rated[:n], rated[n:])]
