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

import hashlib
import json
import random
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pr_rlhf.files import atomic_write_text
from pr_rlhf.models.base import Engine, SamplingParams
from pr_rlhf.prompts import fragment
from pr_rlhf.reward.judge import chosen_slot, parse_verdict

K = TypeVar("K", bound=Hashable)


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


def _guesses(engine: Engine, asked: Sequence[tuple[Choice, str]], params: SamplingParams,
             seed: int) -> list[tuple[str, bool | None]]:
    """(the engine's text, whether its guess is the user's label; None when no guess could be read) per (choice,
    persona shown) in ``asked``, all in one engine call."""
    if not asked:
        return []
    generations = engine.generate([trace_prompt(c, seed, persona) for c, persona in asked], params)
    out = []
    for (choice, _), gen in zip(asked, generations):
        text = gen.samples[0].text if gen.ok and gen.samples else ""
        parsed = parse_verdict(text)
        out.append((text, None if not parsed.ok else parsed.value == _slots(seed, choice)[2]))
    return out


def _drafts(kept: Sequence[str], seed: int, candidates: int) -> list[list[dict]]:
    """The ``candidates`` persona-writing prompts, each over the kept traces in its own seeded order."""
    drafts = []
    for c in range(candidates):
        order = list(kept)
        random.Random(f"{seed}:{c}").shuffle(order)
        observations = "\n\n".join(f"{i}. {t.strip()}" for i, t in enumerate(order, 1))
        drafts.append([{"role": "system", "content": fragment("persona", "write_system")},
                       {"role": "user", "content": fragment("persona", "write_user", observations=observations)}])
    return drafts


def synthesize_many(engine: Engine, users: Mapping[K, Sequence[Choice]], params: SamplingParams, *, seed: int = 0,
                    candidates: int = 3, validation: int = 2) -> dict[K, Persona]:
    """Each user's persona from their ``choices`` (oldest first): the last ``validation`` ones select among
    ``candidates`` personas induced from the others' kept traces. The users move through the three steps together,
    one engine call a step, so an engine that batches writes every user's traces at once."""
    split = {key: (list(c)[:len(c) - validation], list(c)[len(c) - validation:]) for key, c in users.items()
             if len(c) >= validation + 1}
    asked = [(key, choice) for key, (induce, _) in split.items() for choice in induce]
    guesses = _guesses(engine, [(choice, "") for _, choice in asked], params, seed)
    kept: dict[K, list[str]] = {key: [] for key in split}
    result = {key: Persona("") for key in users}
    for (key, _), (text, right) in zip(asked, guesses):
        result[key].traces += 1
        result[key].unparsed += right is None
        if right:
            kept[key].append(text)
    writing = [key for key in split if kept[key]]
    for key in writing:
        result[key].traces_kept = len(kept[key])
    prompts = [prompt for key in writing for prompt in _drafts(kept[key], seed, candidates)]
    generations = engine.generate(prompts, params) if prompts else []
    texts = [g.samples[0].text.strip() if g.ok and g.samples else "" for g in generations]
    drafted = {key: texts[i * candidates:(i + 1) * candidates] for i, key in enumerate(writing)}
    checks = [(key, c, choice) for key in writing for c, text in enumerate(drafted[key]) if text
              for choice in split[key][1]]
    verdicts = _guesses(engine, [(choice, drafted[key][c]) for key, c, choice in checks], params, seed)
    right: dict[tuple[K, int], int] = {}
    for (key, c, _), (_, ok) in zip(checks, verdicts):
        right[key, c] = right.get((key, c), 0) + bool(ok)
    for key in writing:
        persona = result[key]
        persona.candidates = [(text, right.get((key, c), 0) / validation) for c, text in enumerate(drafted[key])]
        best = max(range(len(persona.candidates)), key=lambda i: (persona.candidates[i][1], -i))
        persona.text = persona.candidates[best][0]
    return result


def synthesize(engine: Engine, choices: Sequence[Choice], params: SamplingParams, *, seed: int = 0,
               candidates: int = 3, validation: int = 2) -> Persona:
    """One user's persona (:func:`synthesize_many` for a single user)."""
    return synthesize_many(engine, {"": choices}, params, seed=seed, candidates=candidates,
                           validation=validation)[""]


class PersonaBook:
    """Personas by user and the history pairs they are induced from (each user's latest ``history_pairs``), induced
    once: every missing user at once by :func:`synthesize_many`. Kept in a JSON file when ``path`` is given, so a
    BT RM trained on personas is scored with the very personas it was trained with."""

    def __init__(self, params: SamplingParams, *, history_pairs: int = 8, candidates: int = 3, validation: int = 2,
                 seed: int = 0, path: str | Path | None = None) -> None:
        self.params, self.history_pairs, self.candidates = params, history_pairs, candidates
        self.validation, self.seed = validation, seed
        self.path = Path(path) if path else None
        self.personas: dict[str, Persona] = {}
        if self.path is not None and self.path.is_file():
            self.personas = {key: Persona(**{**entry, "candidates": [tuple(c) for c in entry["candidates"]]})
                             for key, entry in json.loads(self.path.read_text()).items()}

    def _pairs(self, history: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return list(history)[-self.history_pairs:]

    def key(self, user_id: str, history: Sequence[Mapping[str, Any]]) -> str:
        pairs = [{k: str(h.get(k, "")) for k in ("question", "chosen", "rejected")} for h in self._pairs(history)]
        return f"{user_id}:" + hashlib.sha256(json.dumps(pairs, sort_keys=True).encode()).hexdigest()

    def _too_few(self, pairs: Sequence[Any]) -> bool:
        return len(pairs) < self.validation + 1

    def _missing(self, histories: Iterable[tuple[str, Sequence[Mapping[str, Any]]]]) -> dict[str, tuple[str, list]]:
        keyed = {self.key(user, history): (user, self._pairs(history)) for user, history in histories}
        return {key: value for key, value in keyed.items() if key not in self.personas and not self._too_few(value[1])}

    def lacks(self, histories: Iterable[tuple[str, Sequence[Mapping[str, Any]]]]) -> bool:
        """Whether a (user, history) still needs the engine: enough pairs for a persona, none in the book yet."""
        return bool(self._missing(histories))

    def fill(self, engine: Engine, histories: Iterable[tuple[str, Sequence[Mapping[str, Any]]]]) -> int:
        """Induce the persona of every (user, history) the book lacks (one batch); returns how many."""
        missing = self._missing(histories)
        if missing:
            users = {key: [Choice(f"{user}:{i}", str(h.get("question", "")), str(h.get("chosen", "")),
                                  str(h.get("rejected", ""))) for i, h in enumerate(pairs)]
                     for key, (user, pairs) in missing.items()}
            self.personas.update(synthesize_many(engine, users, self.params, seed=self.seed,
                                                 candidates=self.candidates, validation=self.validation))
        return len(missing)

    def persona(self, user_id: str, history: Sequence[Mapping[str, Any]]) -> Persona:
        """The user's persona: none from too few pairs, else the book's (KeyError when :meth:`fill` has not induced
        it)."""
        if self._too_few(self._pairs(history)):
            return Persona("")
        return self.personas[self.key(user_id, history)]

    def save(self) -> Path:
        if self.path is None:
            raise ValueError("this persona book has no file")
        return atomic_write_text(self.path, json.dumps({key: asdict(p) for key, p in self.personas.items()}))
