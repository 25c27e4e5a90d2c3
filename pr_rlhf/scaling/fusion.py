"""Chain scores of one input and their fusion (docs/protocols.md section 4, test-time scaling).

Model output is never trusted: every sampled chain is parsed, the invalid ones are counted by error kind and left
out of the mean, and an input with no valid chain on either side gets no scores (a counted failure, never a
guessed verdict).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from pr_rlhf.models.base import Generation
from pr_rlhf.reward.sec import parse_sec

Scores = tuple[float, float]   # (response_1, response_2) final scores of one chain


@dataclass
class ChainScores:
    """Per sample of one prompt, in sample order: its (response_1, response_2) scores, or None when it did not
    parse (its error kind counted in ``failures``); the parsed chains' persona texts."""

    per_sample: list[Scores | None] = field(default_factory=list)
    failures: Counter = field(default_factory=Counter)
    personas: list[str] = field(default_factory=list)

    @property
    def valid(self) -> int:
        return sum(s is not None for s in self.per_sample)

    def mean(self, first: int | None = None) -> Scores | None:
        """Mean per-response score over the valid chains among the first ``first`` samples (all when None)."""
        return mean_of([s for s in self.per_sample[:first] if s is not None])


def chain_scores(gen: Generation) -> ChainScores:
    """Parse every sample of one generation; an engine error or an empty generation is one counted failure."""
    out = ChainScores()
    if gen.error is not None or not gen.samples:
        out.failures["engine_error" if gen.error is not None else "empty"] += 1
        return out
    for sample in gen.samples:
        parsed = parse_sec(sample.text)
        if not parsed.ok or parsed.value is None:
            out.failures[str(parsed.error)] += 1
            out.per_sample.append(None)
            continue
        final = parsed.value.final
        out.per_sample.append((float(final["response_1"]), float(final["response_2"])))
        out.personas.append(parsed.value.persona)
    return out


def mean_of(scores: Sequence[Scores]) -> Scores | None:
    if not scores:
        return None
    return (sum(s[0] for s in scores) / len(scores), sum(s[1] for s in scores) / len(scores))


def fuse(own: Scores | None, neighbours: Scores | None, self_weight: float = 0.5,
         neighbour_weight: float = 0.5) -> Scores | None:
    """The weighted mean of the two means; a side without any valid chain is left out (the other decides alone)."""
    parts = [(w, s) for w, s in ((self_weight, own), (neighbour_weight, neighbours)) if s is not None and w > 0]
    if not parts:
        return None
    total = sum(w for w, _ in parts)
    return (sum(w * s[0] for w, s in parts) / total, sum(w * s[1] for w, s in parts) / total)


def verdict(scores: Scores | None) -> str | None:
    """Slot "A" (response_1) or "B" by the higher score; None on a tie or without scores."""
    if scores is None or scores[0] == scores[1]:
        return None
    return "A" if scores[0] > scores[1] else "B"
