"""Rubric-based downstream judge (docs/protocols.md section 5): a strong LLM grades an answer 0/1/2 per rubric aspect.

Two modes, each one ``engine.generate`` call per batch: ``"all"`` grades every aspect of an answer in one prompt
(``rubric_judge``: lines ``Aspect i: S``), ``"per_aspect"`` sends one prompt per (answer, aspect) with the question,
narrative, aspect, reason and evidence, as LaMP-QA's official evaluator does (``rubric_judge_aspect``: ``Score: S``).
An answer's score is the mean aspect score / 2, in [0, 1]. Any unreadable aspect fails the whole answer (never a
silent partial score). :func:`parse_aspect_scores` and :func:`parse_aspect_score` never raise.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pr_rlhf.models.base import Engine, Generation, SamplingParams
from pr_rlhf.prompts import chat
from pr_rlhf.reward.parsing import ErrorKind, Parsed, answer_text, never_raises

RubricMode = Literal["all", "per_aspect"]
SCORE_LEVELS = (0, 1, 2)

_DECOR = r"[\s>*_#`~\-]*"
_ASPECT_LINE = re.compile(
    rf"^{_DECOR}aspect[\s*_`#]*(?P<index>\d+)[\s*_`]*(?:\([^)\n]*\)[\s*_`]*)?[:=](?P<tail>.*)$", re.IGNORECASE)
_SCORE_LINE = re.compile(rf"^{_DECOR}(?:final\s+)?score[\s*_`]*[:=](?P<tail>.*)$", re.IGNORECASE)
_LEVEL = re.compile(r"^[\s*_`\[(\"']*([-+]?(?:\d+(?:\.\d*)?|\.\d+))(?:\s*/\s*(\d+))?")


def _level(tail: str) -> Parsed[int]:
    """The 0/1/2 grade at the start of ``tail`` (``2``, ``**2**``, ``2/2``, ``2.0``); anything else is bad_score."""
    match = _LEVEL.match(tail)
    shown = tail.strip()[:80]
    if not match:
        return Parsed.fail("bad_score", f"no number: {shown!r}")
    number, scale = match.groups()
    if scale is not None and scale != "2":
        return Parsed.fail("bad_score", f"a score out of {scale[:10]}, not 0-2: {shown!r}")
    if len(number) > 20 or float(number) not in SCORE_LEVELS:
        return Parsed.fail("bad_score", f"score {number[:20]!r} is not 0, 1 or 2")
    return Parsed.success(int(float(number)))


@never_raises
def parse_aspect_scores(text: str, n_aspects: int) -> Parsed[list[int]]:
    """Grades 1..n_aspects from ``Aspect i: S`` lines (markdown, ``=``, ``S/2`` tolerated; a repeated index: the
    last line wins; indices outside 1..n ignored). Fails no_score, bad_score or missing_scores (naming indices)."""
    if isinstance(n_aspects, bool) or not isinstance(n_aspects, int) or n_aspects < 1:
        return Parsed.fail("no_aspects", f"n_aspects must be a positive int, got {n_aspects!r}")
    answer = answer_text(text)
    if not answer.ok:
        return Parsed.fail(answer.error, answer.message)  # type: ignore[arg-type]
    tails: dict[int, str] = {}
    for match in map(_ASPECT_LINE.match, answer.value.splitlines()):
        if match and len(match.group("index")) <= 6 and 1 <= int(match.group("index")) <= n_aspects:
            tails[int(match.group("index"))] = match.group("tail")
    if not tails:
        return Parsed.fail("no_score", "no 'Aspect i: S' line for aspects 1.." + str(n_aspects))
    levels: dict[int, int] = {}
    for index in sorted(tails):
        level = _level(tails[index])
        if not level.ok:
            return Parsed.fail("bad_score", f"aspect {index}: {level.message}")
        levels[index] = level.value  # type: ignore[assignment]
    missing = [i for i in range(1, n_aspects + 1) if i not in levels]
    if missing:
        return Parsed.fail("missing_scores", f"no score for aspect(s) {', '.join(map(str, missing))} "
                                             f"of {n_aspects}")
    return Parsed.success([levels[i] for i in range(1, n_aspects + 1)])


@never_raises
def parse_aspect_score(text: str) -> Parsed[int]:
    """The 0/1/2 grade on the last ``Score: S`` line (``**Score:** 2``, ``Score: 2/2``)."""
    answer = answer_text(text)
    if not answer.ok:
        return Parsed.fail(answer.error, answer.message)  # type: ignore[arg-type]
    tails = [m.group("tail") for m in map(_SCORE_LINE.match, answer.value.splitlines()) if m]
    if not tails:
        return Parsed.fail("no_score", "no 'Score: S' line")
    return _level(tails[-1])


@dataclass(frozen=True)
class RubricAspectInput:
    """One aspect the user expects (the fields of ``records.RubricAspect``, which can be passed as is)."""

    aspect: str
    reason: str = ""
    evidence: str = ""


@dataclass
class RubricVerdict:
    score: float | None              # mean aspect score / 2, in [0, 1]; None when it failed
    aspect_scores: list[int] | None
    error: ErrorKind | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


def _or_missing(text: str) -> str:
    return text if text and text.strip() else "(not given)"


def _generated_text(gen: Generation) -> Parsed[str]:
    if gen.error is not None:
        return Parsed.fail("engine_error", str(gen.error))
    if not gen.samples:
        return Parsed.fail("empty", "the engine returned no sample")
    return Parsed.success(gen.samples[0].text)


def _verdict(levels: list[int]) -> RubricVerdict:
    return RubricVerdict(sum(levels) / (2 * len(levels)), levels)


class RubricJudge:
    def __init__(self, engine: Engine, *, params: SamplingParams, mode: RubricMode = "all"):
        if mode not in ("all", "per_aspect"):
            raise ValueError(f"mode must be 'all' or 'per_aspect', got {mode!r}")
        self.engine = engine
        self.params = params
        self.mode = mode

    def judge(self, questions: Sequence[str], answers: Sequence[str],
              rubrics: Sequence[Sequence[RubricAspectInput]],
              narratives: Sequence[str] | None = None) -> list[RubricVerdict]:
        """One verdict per answer, in order; answers whose rubric is empty get ``no_aspects`` and no prompt."""
        n = len(answers)
        if len(questions) != n or len(rubrics) != n or (narratives is not None and len(narratives) != n):
            given = f"{len(questions)} questions, {n} answers, {len(rubrics)} rubrics"
            raise ValueError(given + ("" if narratives is None else f", {len(narratives)} narratives")
                             + ": the lengths must match")
        narr = list(narratives) if narratives is not None else [""] * n
        verdicts: list[RubricVerdict | None] = [None] * n
        owners: list[tuple[int, int]] = []      # (answer index, aspect index) of each prompt
        prompts: list[list[dict]] = []
        for i, (question, answer, rubric) in enumerate(zip(questions, answers, rubrics)):
            if not rubric:
                verdicts[i] = RubricVerdict(None, None, "no_aspects", "no rubric aspects for this query")
            elif self.mode == "all":
                aspects = "\n".join(f"{k}. {a.aspect}" for k, a in enumerate(rubric, 1))
                prompts.append(chat("rubric_judge", question=question, aspects=aspects, answer=answer))
                owners.append((i, 0))
            else:
                for k, a in enumerate(rubric):
                    prompts.append(chat("rubric_judge_aspect", question=question, narrative=_or_missing(narr[i]),
                                        aspect=a.aspect, reason=_or_missing(a.reason),
                                        evidence=_or_missing(a.evidence), answer=answer))
                    owners.append((i, k))
        generations = self.engine.generate(prompts, self.params) if prompts else []
        if len(generations) != len(prompts):
            raise RuntimeError(f"engine returned {len(generations)} generations for {len(prompts)} prompts")

        per_answer: dict[int, list[Parsed[int]]] = {}
        for (i, _), gen in zip(owners, generations):
            text = _generated_text(gen)
            if self.mode == "all":
                parsed = parse_aspect_scores(text.value, len(rubrics[i])) if text.ok else text
                verdicts[i] = (_verdict(parsed.value) if parsed.ok
                               else RubricVerdict(None, None, parsed.error, parsed.message))
            else:
                per_answer.setdefault(i, []).append(parse_aspect_score(text.value) if text.ok else text)
        for i, parsed_aspects in per_answer.items():
            failed = next(((k, p) for k, p in enumerate(parsed_aspects, 1) if not p.ok), None)
            verdicts[i] = (_verdict([p.value for p in parsed_aspects]) if failed is None else  # type: ignore[misc]
                           RubricVerdict(None, None, failed[1].error, f"aspect {failed[0]}: {failed[1].message}"))
        return verdicts  # type: ignore[return-value]


def failure_counts(verdicts: Iterable[RubricVerdict]) -> dict[str, int]:
    """How many verdicts failed, by error kind."""
    return dict(Counter(v.error for v in verdicts if v.error is not None))
