"""A persona per user, induced from their past choices as SynthesizeMe does (Ryan et al., ACL 2025; written from the
paper), on any engine.

1. **Bootstrapped reasoning.** For each of the user's pairs kept for induction, the engine reasons about the choice
   and guesses which answer the user picked (slots drawn by the seeded coin of every pairwise judge); a trace is
   kept only when its guess is the user's label -- reasoning that predicts the user, not reasoning that sounds right.
2. **Persona candidates.** The kept traces (in ``candidates`` seeded orders) are turned into short personas.
3. **Selection on held-out choices.** Each candidate is shown to the judge as the user's stated preferences on the
   user's ``validation`` held-out pairs; the candidate that predicts most of them is the persona (ties: the first).

The persona is then read wherever stated preferences are (``RMInput.stated_preferences``): by the judge (the
``persona`` kind's ``reader``: its 1-10 rating, or the pairwise judge against a reference), by a scalar RM's user
block, by the P-GenRM chain. A user with too few pairs gets no persona (an empty one: the reader sees nothing about
the user). Model output is never trusted: every guess is
parsed by :func:`pr_rlhf.reward.judge.parse_verdict` and failures are counted.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from pr_rlhf.models.base import Engine, SamplingParams
from pr_rlhf.prompts import fragment
from pr_rlhf.reward.judge import chosen_slot, parse_verdict


@dataclass
class Choice:
    """One past choice: the question, the answer the user picked and the one they did not."""

    pair_id: str
    question: str
    chosen: str
    rejected: str


@dataclass
class Persona:
    text: str
    traces_kept: int = 0
    traces: int = 0
    unparsed: int = 0                                        # guesses no verdict could be read from
    candidates: list[tuple[str, float]] = field(default_factory=list)   # (persona, held-out accuracy)


def _slots(seed: int, choice: Choice) -> tuple[str, str, str]:
    """(answer A, answer B, the chosen one's slot) by the seeded coin."""
    slot = chosen_slot(seed, choice.pair_id)
    a, b = (choice.chosen, choice.rejected) if slot == "A" else (choice.rejected, choice.chosen)
    return a, b, slot


def trace_prompt(choice: Choice, seed: int, persona: str = "") -> list[dict]:
    a, b, _ = _slots(seed, choice)
    known = fragment("persona", "known", persona=persona) if persona.strip() else ""
    return [{"role": "system", "content": fragment("persona", "trace_system")},
            {"role": "user", "content": fragment("persona", "trace_user", known=known, question=choice.question,
                                                 answer_a=a, answer_b=b)}]


def _guesses(engine: Engine, choices: Sequence[Choice], params: SamplingParams, seed: int,
             persona: str = "") -> list[tuple[str, bool | None]]:
    """(the engine's text, whether its guess is the user's label; None when no guess could be read) per choice."""
    if not choices:
        return []
    generations = engine.generate([trace_prompt(c, seed, persona) for c in choices], params)
    out = []
    for choice, gen in zip(choices, generations):
        text = gen.samples[0].text if gen.ok and gen.samples else ""
        parsed = parse_verdict(text)
        out.append((text, None if not parsed.ok else parsed.value == _slots(seed, choice)[2]))
    return out


def synthesize(engine: Engine, choices: Sequence[Choice], params: SamplingParams, *, seed: int = 0,
               candidates: int = 3, validation: int = 2) -> Persona:
    """The user's persona from their ``choices`` (oldest first): the last ``validation`` ones select among
    ``candidates`` personas induced from the others' kept traces."""
    choices = list(choices)
    if len(choices) < validation + 1:
        return Persona("")
    induce, held_out = choices[:len(choices) - validation], choices[len(choices) - validation:]
    guesses = _guesses(engine, induce, params, seed)
    kept = [text for text, right in guesses if right]
    result = Persona("", traces_kept=len(kept), traces=len(guesses),
                     unparsed=sum(right is None for _, right in guesses))
    if not kept:
        return result
    drafts = []
    for c in range(candidates):
        order = list(kept)
        random.Random(f"{seed}:{c}").shuffle(order)
        observations = "\n\n".join(f"{i}. {t.strip()}" for i, t in enumerate(order, 1))
        drafts.append([{"role": "system", "content": fragment("persona", "write_system")},
                       {"role": "user", "content": fragment("persona", "write_user", observations=observations)}])
    texts = [g.samples[0].text.strip() if g.ok and g.samples else "" for g in engine.generate(drafts, params)]
    for text in texts:
        right = [r for _, r in _guesses(engine, held_out, params, seed, persona=text)] if text else []
        result.candidates.append((text, sum(bool(r) for r in right) / len(held_out)))
    best = max(range(len(result.candidates)), key=lambda i: (result.candidates[i][1], -i))
    result.text = result.candidates[best][0]
    return result
