"""The oracle teacher of PSI on the synthetic world: correct evaluation chains (SEC) written from the world's own
posterior, the training targets of P-GenRM's supervised stage.

For a pair of one user, given that user's history pairs (x_chosen - x_rejected per pair):

- **persona**: first the evidence (in each history pair, which attribute values the user chose over which), then
  what the posterior says the user values: the attributes whose posterior-mean weight is clearly positive or
  negative. Listing the evidence first gives a small model the chain's reasoning to copy, step by step.
- **criteria**: the attributes on which the two responses differ (the only ones that can decide between them), in
  the rubric wording of the direction the posterior favours, weighted by |posterior-mean weight| (percentages
  summing to 100).
- **scores**: per criterion, the response whose value the user likely prefers gets 5 + a, the other 5 - a, with
  a in 1..4 growing with the posterior's confidence; final scores are the weighted sums.

The ``trace`` style (the default for tiny models trained from scratch) writes the same reasoning as a sequence
of copies and column lookups: the numbered history lines and both responses transliterated token by token, the
posterior's direction and who fits it per attribute, then a rubric over every attribute (catalog order, weights
|posterior mean|) whose scores are 9 / 1 for the response that fits, 5 / 5 where the two are alike. Its decision is
the sign of E[w] . (x_1 - x_2), the posterior-mean utility difference. A tiny model learns the trace's evidence
lines far faster than the compact chain's (docs/measurements.md).

The ``vote`` style replaces the posterior's direction (a joint function of every history line, which a tiny model
learns slowly) by a vote for the user's
type (the world's archetypes are the prior's mixture components): per history line the types whose mean weights
agree with its choice, the vote counts, the type with most votes, then that type's preferences and weights. The
voted type's weights decide about as well as the posterior (docs/measurements.md).

Targets come from what the history can tell (the posterior, or the vote over the world's user types), never
from the user's hidden true weights. The
chain's choice is the sign of its weighted-sum difference; rejection sampling keeps a chain only when that choice
is the labelled chosen answer (as the paper's teacher data), so the kept share is about the oracle's accuracy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from pr_rlhf.configs.pgenrm import TeacherRule
from pr_rlhf.reward.sec import SEC, Criterion, CriterionScore
from pr_rlhf.world.attributes import CATALOG
from pr_rlhf.world.generator import World, WorldPair
from pr_rlhf.world.reference import WorldPrior

ChainStyle = Literal["full", "compact", "trace", "vote"]
TYPE_LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
CLEAR_WEIGHT = 0.25   # |posterior-mean weight| above which the persona states a preference


@dataclass
class OracleChain:
    pair_id: str
    sec: SEC
    first_is_chosen: bool        # slot order: response_1 is the chosen answer
    correct: bool                # the chain prefers the chosen answer
    posterior_mean: np.ndarray


def signed(name: str, value: int) -> str:
    """Compact value token: ``+examples`` (has it) / ``-examples`` (lacks it)."""
    return f"{'+' if value else '-'}{name}"


def evidence_lines(world: World, history: list[WorldPair]) -> list[str]:
    """One line per history pair: the values the user chose, then those they rejected (differing ones only)."""
    names = world.attribute_names
    lines = []
    for i, pair in enumerate(history, 1):
        diff = [j for j in range(len(names)) if pair.x_chosen[j] != pair.x_rejected[j]]
        chose = " ".join(signed(names[j], pair.x_chosen[j]) for j in diff)
        over = " ".join(signed(names[j], pair.x_rejected[j]) for j in diff)
        lines.append(f"Example {i}: chose {chose} over {over}")
    return lines


def persona_text(world: World, history: list[WorldPair], mean: np.ndarray, every_attribute: bool = False) -> str:
    """The evidence, then the clear preferences of the posterior mean (strongest first). ``every_attribute``
    also names the weak leanings (the compact style: every criterion's direction is then stated beforehand, so
    writing the rubric is a lookup for a small model)."""
    names = world.attribute_names
    order = np.argsort(-np.abs(mean))
    clear = [signed(names[j], int(mean[j] > 0)) for j in order if abs(mean[j]) > CLEAR_WEIGHT]
    lines = evidence_lines(world, history) + [f"Prefers: {' '.join(clear) if clear else 'nothing clear yet'}"]
    weak = [signed(names[j], int(mean[j] > 0)) for j in order if abs(mean[j]) <= CLEAR_WEIGHT]
    if every_attribute and weak:
        lines.append(f"Weakly: {' '.join(weak)}")
    return "\n".join(lines)


def transliterate(names: tuple[str, ...], x) -> str:
    """A response's attribute values as signed tokens in rendering order (``+structure -examples ...``)."""
    return " ".join(signed(n, int(v)) for n, v in zip(names, x))


FIT_SCORES = {"=": (5, 5), "1": (9, 1), "2": (1, 9)}   # the trace rubric's scores per Fit symbol


def fit_symbols(mean: np.ndarray, x1, x2) -> list[str]:
    """Per attribute: "=" (alike), "1" / "2" (the response that has the value the posterior mean prefers)."""
    return ["=" if a == b else ("1" if bool(a) == bool(m > 0) else "2") for m, a, b in zip(mean, x1, x2)]


def history_lines(names: tuple[str, ...], history: list[WorldPair]) -> list[str]:
    """Each numbered history line of the prompt transliterated token by token, catalog order."""
    return [f"Example {i}: {transliterate(names, p.x_chosen)} > {transliterate(names, p.x_rejected)}"
            for i, p in enumerate(history, 1)]


def response_lines(names: tuple[str, ...], direction: np.ndarray, x1, x2) -> list[str]:
    """The preferred value per attribute (sign of ``direction``), both responses, and who fits each (the Fit line)."""
    return ["Prefers: " + " ".join(signed(n, int(direction[j] > 0)) for j, n in enumerate(names)),
            f"Response 1: {transliterate(names, x1)}",
            f"Response 2: {transliterate(names, x2)}",
            "Fit: " + " ".join(f"{n}{f}" for n, f in zip(names, fit_symbols(direction, x1, x2)))]


def vote_type(archetypes: np.ndarray, history: list[WorldPair]) -> tuple[list[list[int]], np.ndarray, int]:
    """Per history pair the user types (archetypes) whose mean weights prefer its chosen answer, the votes per
    type, and the voted type: most votes, the first type on ties (no history: type A)."""
    agrees = [[k for k in range(len(archetypes)) if float(archetypes[k] @ p.differing) > 0] for p in history]
    votes = np.zeros(len(archetypes), dtype=int)
    for ks in agrees:
        votes[ks] += 1
    return agrees, votes, int(np.argmax(votes))


def teacher_types(archetypes: np.ndarray, history: list[WorldPair], rule: TeacherRule) -> list[int]:
    """The types a teacher of ``rule`` draws ``Type`` from, uniformly: the voted type, or the types agreeing with the
    most recent history pair (every type when none agrees or there is no history)."""
    agrees, _, voted = vote_type(archetypes, history)
    if rule == "votes":
        return [voted]
    return (agrees[-1] if agrees else []) or list(range(len(archetypes)))


def vote_persona(world: World, history: list[WorldPair], x1, x2, type_index: int | None = None
                 ) -> tuple[str, np.ndarray]:
    """The ``vote`` persona: each transliterated history line followed by the user types it agrees with
    (``Agrees 1: A C``), the votes (``Votes: A2 B0 C1``), the voted ``Type``, then that type's preferred values,
    both responses and who fits (as the trace style). Every step is a copy, a lookup of the line above (which
    types a line's choice agrees with: a function of its differing columns), a count, or a per-type constant.
    ``type_index`` overrides the voted type (a teacher that decides otherwise still writes every line above it).
    Returns the persona and the chosen type's weights (the rubric's)."""
    names = world.attribute_names
    agrees, votes, k = vote_type(world.archetypes, history)
    k = k if type_index is None else type_index
    lines = []
    for i, (line, ks) in enumerate(zip(history_lines(names, history), agrees), 1):
        lines += [line, f"Agrees {i}: {' '.join(TYPE_LABELS[j] for j in ks) or 'none'}"]
    lines.append("Votes: " + " ".join(f"{TYPE_LABELS[j]}{v}" for j, v in enumerate(votes)))
    lines.append(f"Type: {TYPE_LABELS[k]}")
    direction = world.archetypes[k]
    return "\n".join(lines + response_lines(names, direction, x1, x2)), direction


def trace_persona(world: World, history: list[WorldPair], mean: np.ndarray, x1, x2) -> str:
    """The ``trace`` persona, every line in catalog order so that the k-th symbol of each line is about the same
    attribute: each numbered history line of the prompt transliterated token by token (``Example 1: +structure
    -examples > -structure -examples``), the posterior mean's direction per attribute (``Prefers:``), both
    responses transliterated, then which response fits each preference (``Fit: structure= examples2``: = alike,
    1 or 2 the response that has the preferred value). Each symbol is a copy of one prompt token or a lookup of
    the same column in earlier lines: the patterns a small transformer learns first."""
    names = world.attribute_names
    return "\n".join(history_lines(names, history) + response_lines(names, mean, x1, x2))


def percentages(raw: list[float]) -> list[int]:
    """Integer percentages >= 1 summing to 100, proportional to ``raw`` (largest remainder)."""
    total = sum(raw)
    exact = [100 * r / total for r in raw]
    out = [max(1, int(e)) for e in exact]
    for i in sorted(range(len(raw)), key=lambda i: exact[i] - int(exact[i]), reverse=True):
        if sum(out) >= 100:
            break
        out[i] += 1
    while sum(out) > 100:                       # the floor of 1 overshot: take from the largest
        out[out.index(max(out))] -= 1
    return out


def oracle_chain(world: World, prior: WorldPrior, pair: WorldPair, history: list[WorldPair],
                 first_is_chosen: bool, style: ChainStyle = "full", type_index: int | None = None) -> OracleChain:
    """The oracle's chain for ``pair`` with ``history``, responses in the given slot order. ``style="compact"``
    names each criterion by its signed attribute token (``+detail``) and leaves reasons out: criteria and scores
    in about half the characters, for small models; its persona also names the weak leanings, so that every
    criterion's direction is stated before the rubric. ``style="trace"``: :func:`trace_persona`, then the rubric
    over every attribute (weights |posterior mean|), scored from the Fit line. ``style="vote"``: :func:`vote_persona`
    and the same rubric with the voted type's weights (or type ``type_index``'s: :func:`teacher_types`)."""
    names = world.attribute_names
    hist = np.array([p.differing for p in history]).reshape(-1, len(names))
    mean = prior.posterior_weights(hist) @ prior.samples
    x1, x2 = (pair.x_chosen, pair.x_rejected) if first_is_chosen else (pair.x_rejected, pair.x_chosen)
    every_attribute = style in ("trace", "vote")
    if style == "vote":
        persona, direction = vote_persona(world, history, x1, x2, type_index)
    elif style == "trace":
        persona, direction = trace_persona(world, history, mean, x1, x2), mean
    else:
        persona, direction = persona_text(world, history, mean, every_attribute=style == "compact"), mean
    # the trace / vote rubric is the user's: every attribute in catalog order (alike ones score alike); else the
    # ones on which the pair differs
    rubric = list(range(len(names))) if every_attribute else [j for j in range(len(names)) if x1[j] != x2[j]]
    fit = fit_symbols(direction, x1, x2)
    scale = max(float(np.abs(direction[rubric]).max()), 1e-9) if rubric else 1.0
    criteria, scores = [], []
    raw_weights = [max(abs(float(direction[j])), 1e-3) for j in rubric]
    for j, pct in zip(rubric, percentages(raw_weights)):
        attr = CATALOG[names[j]]
        wants = bool(direction[j] > 0)
        if every_attribute:   # the weights carry the strength: scores only say who fits (the Fit line)
            s1, s2 = FIT_SCORES[fit[j]]
        else:
            a = 1 + round(3 * abs(float(direction[j])) / scale)
            s1, s2 = (5 + a, 5 - a) if bool(x1[j]) == wants else (5 - a, 5 + a)
        token = signed(attr.name, int(wants))
        label = attr.aspect(wants) if style == "full" else token
        criteria.append(Criterion(label, pct / 100))
        scores.append(CriterionScore(label, float(s1), float(s2), token if style == "full" else ""))
    sec = SEC(persona=persona, criteria=criteria, scores=scores)
    final = sec.weighted_sums() or {"response_1": 5.0, "response_2": 5.0}
    sec.final = {k: round(v, 4) for k, v in final.items()}
    prefers_first = sec.final["response_1"] > sec.final["response_2"]
    correct = prefers_first == first_is_chosen and sec.final["response_1"] != sec.final["response_2"]
    return OracleChain(pair.pair_id, sec, first_is_chosen, correct, mean)
