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

Targets come from the posterior given the history (what can be known), never from the hidden true weights. The
chain's choice is the sign of its weighted-sum difference; rejection sampling keeps a chain only when that choice
is the labelled chosen answer (as the paper's teacher data), so the kept share is about the oracle's accuracy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from pr_rlhf.reward.sec import SEC, Criterion, CriterionScore
from pr_rlhf.world.attributes import CATALOG
from pr_rlhf.world.generator import World, WorldPair
from pr_rlhf.world.reference import WorldPrior

ChainStyle = Literal["full", "compact", "table"]
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


def table_persona(world: World, history: list[WorldPair], mean: np.ndarray, x1: np.ndarray,
                  x2: np.ndarray) -> str:
    """The ``table`` persona: every attribute in catalog order on every line, so each symbol depends on two cue
    words only. ``Example i: structure+ examples= ...`` (+: chose the answer that has it over one that lacks
    it, -: the reverse, =: both alike), ``Prefers: structure+ examples- ...`` (the posterior mean's sign) and
    ``Responses: structure1 examples= ...`` (which response has the attribute where they differ)."""
    names = world.attribute_names

    def sym(a: int, b: int, plus: str, minus: str) -> str:
        return "=" if a == b else (plus if a else minus)

    lines = [f"Example {i}: " + " ".join(f"{n}{sym(p.x_chosen[j], p.x_rejected[j], '+', '-')}"
                                         for j, n in enumerate(names)) for i, p in enumerate(history, 1)]
    lines.append("Prefers: " + " ".join(f"{n}{'+' if mean[j] > 0 else '-'}" for j, n in enumerate(names)))
    lines.append("Responses: " + " ".join(f"{n}{sym(int(x1[j]), int(x2[j]), '1', '2')}" for j, n in enumerate(names)))
    return "\n".join(lines)


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
                 first_is_chosen: bool, style: ChainStyle = "full") -> OracleChain:
    """The oracle's chain for ``pair`` with ``history``, responses in the given slot order. ``style="compact"``
    names each criterion by its signed attribute token (``+detail``) and leaves reasons out: criteria and scores
    in about half the characters, for small models; its persona also names the weak leanings, so that every
    criterion's direction is stated before the rubric. ``style="table"``: the compact rubric after a persona that
    states every attribute on every line (:func:`table_persona`)."""
    names = world.attribute_names
    hist = np.array([p.differing for p in history]).reshape(-1, len(names))
    mean = prior.posterior_weights(hist) @ prior.samples
    x1, x2 = (pair.x_chosen, pair.x_rejected) if first_is_chosen else (pair.x_rejected, pair.x_chosen)
    differing = [j for j in range(len(names)) if x1[j] != x2[j]]
    scale = max(float(np.abs(mean[differing]).max()), 1e-9) if differing else 1.0
    criteria, scores = [], []
    raw_weights = [max(abs(float(mean[j])), 1e-3) for j in differing]
    for j, pct in zip(differing, percentages(raw_weights)):
        attr = CATALOG[names[j]]
        wants = bool(mean[j] > 0)
        a = 1 + int(round(3 * abs(float(mean[j])) / scale))
        first_fits = bool(x1[j]) == wants
        s1, s2 = (5 + a, 5 - a) if first_fits else (5 - a, 5 + a)
        token = signed(attr.name, int(wants))
        label = attr.aspect(wants) if style == "full" else token
        criteria.append(Criterion(label, pct / 100))
        scores.append(CriterionScore(label, float(s1), float(s2), token if style == "full" else ""))
    persona = table_persona(world, history, mean, x1, x2) if style == "table" else \
        persona_text(world, history, mean, every_attribute=style == "compact")
    sec = SEC(persona=persona, criteria=criteria, scores=scores)
    final = sec.weighted_sums() or {"response_1": 5.0, "response_2": 5.0}
    sec.final = {k: round(v, 4) for k, v in final.items()}
    prefers_first = sec.final["response_1"] > sec.final["response_2"]
    correct = prefers_first == first_is_chosen and sec.final["response_1"] != sec.final["response_2"]
    return OracleChain(pair.pair_id, sec, first_is_chosen, correct, mean)
