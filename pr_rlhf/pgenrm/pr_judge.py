"""The LLM-judged process reward (PR) of the CRE stage: a judge engine grades how well a chain's criteria cover
the user's gold criteria (``prompts/pr_judge.txt``), answering ``Coverage: X/10``.

On real data the gold criteria are the gold rubric's aspects for the query where the data has them (PRB,
LaMP-QA), else the user's stated preferences (PRISM's survey ``system_string``); a pair with neither has no PR
(the chain's reward is then its outcome part only, counted as ``pr_unavailable``). On the synthetic world the
exact PR (``cre_reward.process_reward``) is the default; :func:`world_gold_criteria` writes the world's gold for a
pair (the attributes on which the responses differ, in the user's direction, with their importance) and
:class:`ScriptedCoverageJudge`, the world's scripted judge, computes from the prompt text alone exactly what the
exact PR computes from the ground truth, so the template and the parser are checked against it.

Judge output is never trusted: :func:`parse_coverage` returns a typed failure, and a chain whose PR the judge
could not give gets the mean PR of the step's graded chains (no advantage from a judge failure), counted.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from pr_rlhf.models.base import Engine, Generation, Prompt, Sample, SamplingParams
from pr_rlhf.pgenrm.cre_reward import CREReward, combine, criterion_attribute
from pr_rlhf.prompts import chat
from pr_rlhf.reward.parsing import Parsed, answer_text, never_raises, to_number
from pr_rlhf.reward.sec import SEC, one_line, parse_sec

GOLD_HEADER = "What this user cares about:"
CHAIN_HEADER = "The reward model's criteria:"
_COVERAGE = re.compile(r"coverage\s*[:=]\s*\**\s*([-+]?\d+(?:\.\d+)?)\s*(/\s*10\b|/\s*100\b|%)?", re.IGNORECASE)
_GOLD_LINE = re.compile(r"^\s*([+-][A-Za-z_]+)\s*\|\s*importance:\s*([\d.]+)")
_CRITERION_LINE = re.compile(r"^\s*\d+\.\s*([^|]+?)\s*\|")


def chain_criteria(sec: SEC) -> str:
    """The chain's criteria as the judge sees them: ``N. name | weight: W | description`` (W in percent)."""
    return "\n".join(f"{i}. {one_line(c.name).replace('|', '/')} | weight: {round(100 * c.weight, 1):g}"
                     + (f" | {one_line(c.description).replace('|', '/')}" if c.description.strip() else "")
                     for i, c in enumerate(sec.criteria, 1))


def judge_prompt(gold_criteria: str, sec: SEC, question: str) -> list[dict]:
    return chat("pr_judge", gold_criteria=gold_criteria.strip(), chain_criteria=chain_criteria(sec),
                question=one_line(question))


@never_raises
def parse_coverage(text: str) -> Parsed[float]:
    """The last ``Coverage: X`` of the answer as a share in [0, 1]: ``X/10`` (also a bare X up to 10), ``X/100``,
    ``X%`` or a bare X in [0, 1] read as a share already. Anything else is a ``no_coverage`` failure."""
    answer = answer_text(text)
    if not answer.ok or answer.value is None:
        return Parsed.fail(answer.error or "empty", answer.message)
    found = list(_COVERAGE.finditer(answer.value))
    if not found:
        return Parsed.fail("no_coverage", "no 'Coverage: X/10' line")
    raw, scale = found[-1].group(1), (found[-1].group(2) or "").replace(" ", "")
    value = to_number(raw)
    if value is None:
        return Parsed.fail("no_coverage", f"coverage {raw!r} is not a number")
    if scale == "/100" or scale == "%":
        share = value / 100
    elif scale == "/10" or value > 1:
        share = value / 10
    else:
        share = value
    if not 0.0 <= share <= 1.0:
        return Parsed.fail("no_coverage", f"coverage {raw}{scale} is outside the scale")
    return Parsed.success(share)


@dataclass
class JudgeStats:
    graded: int = 0
    failed: Counter = field(default_factory=Counter)   # kind -> count (engine_error, no_coverage, ...)
    unavailable: int = 0                               # chains of pairs without gold criteria (no PR)

    def as_dict(self) -> dict:
        return {"graded": self.graded, "failed": dict(self.failed), "unavailable": self.unavailable}


class CoverageJudge:
    """PR of parsed chains through a judge engine (greedy by default). ``grade`` returns one share per item, or
    None where the pair has no gold criteria or the judge failed (both counted in ``stats``)."""

    def __init__(self, engine: Engine, params: SamplingParams | None = None):
        self.engine = engine
        self.params = params or SamplingParams(temperature=0.0, max_tokens=32)
        self.stats = JudgeStats()

    def grade(self, items: Sequence[tuple[str, SEC, str]]) -> list[float | None]:
        """``items``: (gold criteria, parsed chain, question) per chain."""
        out: list[float | None] = [None] * len(items)
        asked = [i for i, (gold, _, _) in enumerate(items) if gold.strip()]
        self.stats.unavailable += len(items) - len(asked)
        if not asked:
            return out
        gens = self.engine.generate([judge_prompt(*items[i]) for i in asked], self.params)
        for i, gen in zip(asked, gens):
            if gen.error is not None or not gen.samples:
                self.stats.failed["engine_error"] += 1
                continue
            parsed = parse_coverage(gen.samples[0].text)
            if parsed.ok:
                out[i] = parsed.value
                self.stats.graded += 1
            else:
                self.stats.failed[str(parsed.error)] += 1
        return out


@dataclass(frozen=True)
class ChainGroup:
    """The chains sampled for one GRPO prompt, and what their reward needs."""

    texts: Sequence[str]
    first_is_chosen: bool
    gold_criteria: str
    question: str


def judged_rewards(groups: Sequence[ChainGroup], judge: CoverageJudge | None, alpha: float = 0.5,
                   beta: float = 1.0, format_penalty: float = -0.1) -> list[list[CREReward]]:
    """The CRE reward of every chain with the judged PR, one judge call for all parsed chains of all groups. A
    chain whose PR the judge failed to give gets the mean PR of its group's graded chains (0 when none was
    graded): within a GRPO group a judge failure neither helps nor hurts a chain. Without a judge (None) there is
    no PR: alpha must be 0."""
    if judge is None and alpha > 0:
        raise ValueError(f"alpha {alpha} weighs a process reward, and there is no PR judge to grade it")
    parsed = [[(lambda p: p.value if p.ok else None)(parse_sec(t)) for t in g.texts] for g in groups]
    asked = [(gi, ci) for gi, secs in enumerate(parsed) for ci, sec in enumerate(secs) if sec is not None]
    grades = judge.grade([(groups[gi].gold_criteria, parsed[gi][ci], groups[gi].question) for gi, ci in asked]) \
        if judge is not None and alpha > 0 else [None] * len(asked)
    by_chain = dict(zip(asked, grades))
    out = []
    for gi, (group, secs) in enumerate(zip(groups, parsed)):
        has_gold = alpha > 0 and bool(group.gold_criteria.strip())
        graded = [by_chain[(gi, ci)] for ci in range(len(secs)) if by_chain.get((gi, ci)) is not None]
        fill = sum(graded) / len(graded) if graded else 0.0

        def process(ci: int, sec: SEC | None) -> float | None:
            if sec is None or not has_gold:
                return None
            grade = by_chain[(gi, ci)]
            return fill if grade is None else grade
        out.append([combine(sec, group.first_is_chosen, process(ci, sec), alpha, beta, format_penalty)
                    for ci, sec in enumerate(secs)])
    return out


# ----------------------------------------------------------------------------------------------------------------
# The synthetic world's gold criteria and scripted judge
# ----------------------------------------------------------------------------------------------------------------

def world_gold_criteria(names: Sequence[str], x_1: Sequence[int], x_2: Sequence[int],
                        true_weights: Sequence[float]) -> str:
    """The world's gold criteria of one pair: each attribute on which the responses differ, as a signed token in
    the user's direction with its share of the importance (percent), e.g. ``+detail | importance: 62.5``."""
    differing = [(n, w) for n, a, b, w in zip(names, x_1, x_2, true_weights) if a != b]
    total = sum(abs(w) for _, w in differing)
    if not differing or total <= 0:
        return "(the two responses differ in nothing this user cares about)"
    return "\n".join(f"{'+' if w > 0 else '-'}{n} | importance: {100 * abs(w) / total:.6f}" for n, w in differing)


class ScriptedCoverageJudge:
    """An engine that answers PR-judge prompts by the exact rule, from the prompt text alone: the importance share
    of the gold lines (``+attr | importance: P``) that some criterion line names in the same direction. Deterministic;
    any other prompt gets an answer without a coverage line (a parse failure, as from a confused model)."""

    name = "scripted-coverage-judge"

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        return [Generation(samples=[Sample(self._answer(p))] * max(params.n, 1)) for p in prompts]

    @staticmethod
    def _answer(prompt: Prompt) -> str:
        text = prompt if isinstance(prompt, str) else "\n".join(str(m.get("content", "")) for m in prompt)
        if GOLD_HEADER not in text or CHAIN_HEADER not in text:
            return "I cannot grade this."
        gold_text = text.split(GOLD_HEADER, 1)[1].split(CHAIN_HEADER, 1)[0]
        chain_text = text.split(CHAIN_HEADER, 1)[1].split("\nQuery:", 1)[0]
        gold = [(m.group(1), float(m.group(2))) for m in map(_GOLD_LINE.match, gold_text.splitlines()) if m]
        if not gold:
            return "Coverage: 10/10"
        claimed = dict(found for found in (criterion_attribute(m.group(1)) for m in
                                           map(_CRITERION_LINE.match, chain_text.splitlines()) if m) if found)
        total = sum(w for _, w in gold)
        covered = sum(w for token, w in gold if claimed.get(token[1:]) == (token[0] == "+"))
        return f"Coverage: {10 * covered / total:.6f}/10"

    def score_continuations(self, prefix: Prompt, continuations: list[str]) -> list[float]:
        from pr_rlhf.models.openai_engine import ScoringUnsupportedError

        raise ScoringUnsupportedError("the scripted judge only generates (it grades prompts, it has no model)")

    def close(self) -> None:
        pass
