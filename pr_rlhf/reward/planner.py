"""The planner of PRB's "w/ plan" mode: (question, top-k posts) -> the aspects the user likely expects.

Its aspects replace the raw profile in the reward model's input (:func:`pr_rlhf.reward.inputs.with_plans`, then
``user_block(..., mode="plan")``). :func:`parse_aspects` never raises.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from pr_rlhf.models.base import Engine, SamplingParams
from pr_rlhf.prompts import chat
from pr_rlhf.reward.inputs import RMInput, profile_block
from pr_rlhf.reward.parsing import ErrorKind, Parsed, answer_text, never_raises

MAX_ASPECTS = 8
MAX_ASPECT_CHARS = 300

_ITEM = re.compile(r"^\s*(?:[-*•+]|\(?\d{1,3}\s*[.):]|\[\d{1,3}\])\s+(.*)$")
_DECORATION = re.compile(r"\*\*|__|`")


@dataclass
class PlanResult:
    aspects: list[str] = field(default_factory=list)
    error: ErrorKind | None = None
    raw: str = ""


@never_raises
def parse_aspects(text: str, max_aspects: int = MAX_ASPECTS) -> Parsed[list[str]]:
    """Numbered or bulleted lines as aspects: stripped of markers and markdown, deduplicated (case-insensitive),
    at most ``max_aspects`` of them (each cut to MAX_ASPECT_CHARS); no list line at all is ``"no_aspects"``."""
    answer = answer_text(text)
    if not answer.ok:
        return Parsed.fail(answer.error, answer.message)  # type: ignore[arg-type]
    aspects: list[str] = []
    seen: set[str] = set()
    for line in answer.value.splitlines():
        item = _ITEM.match(line)
        if not item:
            continue
        aspect = " ".join(_DECORATION.sub("", item.group(1)).split()).strip(" :-")[:MAX_ASPECT_CHARS].strip()
        key = aspect.casefold().rstrip(".")
        if not aspect or key in seen:
            continue
        seen.add(key)
        aspects.append(aspect)
        if len(aspects) >= max_aspects:
            break
    if not aspects:
        return Parsed.fail("no_aspects", "no numbered or bulleted aspect line")
    return Parsed.success(aspects)


def plan_prompt(inp: RMInput, top_k: int) -> list[dict]:
    return chat("planner", profile_block=profile_block(inp.retrieved, top_k), question=inp.question)


class Planner:
    def __init__(self, engine: Engine, *, params: SamplingParams, max_aspects: int = MAX_ASPECTS):
        self.engine = engine
        self.params = params
        self.max_aspects = max_aspects

    def plan(self, inputs: Sequence[RMInput], top_k: int) -> list[PlanResult]:
        """One PlanResult per input (first sample of each generation); failures carry an error kind."""
        if not inputs:
            return []
        generations = self.engine.generate([plan_prompt(inp, top_k) for inp in inputs], self.params)
        if len(generations) != len(inputs):
            raise RuntimeError(f"engine returned {len(generations)} generations for {len(inputs)} prompts")
        out = []
        for gen in generations:
            if gen.error is not None:
                out.append(PlanResult([], "engine_error", gen.error))
            elif not gen.samples:
                out.append(PlanResult([], "empty", ""))
            else:
                parsed = parse_aspects(gen.samples[0].text, self.max_aspects)
                out.append(PlanResult(parsed.value or [], parsed.error, gen.samples[0].text))
        return out
