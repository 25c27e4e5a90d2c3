"""The CRE stage's reward for one generated evaluation chain: R = alpha * PR + beta * OR, or ``format_penalty`` when
the chain does not parse (docs/protocols.md section 4; defaults 0.5 / 1.0 / -0.1).

- OR (outcome): 1 when the chain's final scores prefer the chosen response (a tie prefers neither: 0).
- PR (process), on the synthetic world exact from the ground truth: how well the chain's criteria cover the
  user's true criteria on this pair. The attributes on which the two responses differ are the criteria that can
  matter; each counts with its true importance |w_user| and is covered when the chain has a criterion on that
  attribute in the user's true direction:  PR = sum_j |w_j| [covered_j] / sum_j |w_j|  over differing j.
  Criteria on other attributes neither help nor hurt. A criterion is read as a signed attribute token
  (``+detail`` / ``-detail``, the compact chain style) or as the catalog's rubric wording of either direction.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pr_rlhf.reward.sec import SEC, parse_sec
from pr_rlhf.world.attributes import CATALOG

_BY_WORDING = {a.aspect(w).strip().lower(): (a.name, w) for a in CATALOG.values() for w in (True, False)}


@dataclass(frozen=True)
class CREReward:
    reward: float
    outcome: float | None        # None when the chain did not parse
    process: float | None
    parsed: bool
    prefers_first: bool | None = None   # the chain's verdict by slot (None: unparsed or a tie)


def criterion_attribute(name: str) -> tuple[str, bool] | None:
    """(attribute, wants) of a criterion name, or None when it names no catalog attribute."""
    text = name.strip()
    if text[:1] in "+-" and text[1:] in CATALOG:
        return text[1:], text[0] == "+"
    return _BY_WORDING.get(text.lower())


def process_reward(sec: SEC, names: Sequence[str], x_1: Sequence[int], x_2: Sequence[int],
                   true_weights: Sequence[float]) -> float:
    """PR in [0, 1] (1 when the responses differ in nothing: there is nothing to miss)."""
    claimed = dict(found for found in map(criterion_attribute, (c.name for c in sec.criteria)) if found)
    total = covered = 0.0
    for name, v1, v2, w in zip(names, x_1, x_2, true_weights):
        if v1 == v2:
            continue
        total += abs(w)
        if name in claimed and claimed[name] == (w > 0):
            covered += abs(w)
    return covered / total if total > 0 else 1.0


def combine(sec: SEC | None, first_is_chosen: bool, process: float | None, alpha: float = 0.5, beta: float = 1.0,
            format_penalty: float = -0.1) -> CREReward:
    """R = alpha * PR + beta * OR of a parsed chain (``process`` None: no PR for this pair, R = beta * OR), or
    ``format_penalty`` when the chain did not parse (``sec`` None)."""
    if sec is None:
        return CREReward(format_penalty, None, None, False)
    prefers_first = sec.prefers_first
    outcome = 0.0 if prefers_first is None else float(prefers_first == first_is_chosen)
    return CREReward(alpha * (process or 0.0) + beta * outcome, outcome, process, True, prefers_first)


def cre_reward(text: str, first_is_chosen: bool, names: Sequence[str], x_1: Sequence[int], x_2: Sequence[int],
               true_weights: Sequence[float], alpha: float = 0.5, beta: float = 1.0,
               format_penalty: float = -0.1) -> CREReward:
    """The reward of one generated chain for a pair shown as (response_1, response_2) with attribute vectors
    ``x_1`` / ``x_2``, with the exact PR. Never raises on model output: an unparseable chain gets
    ``format_penalty``."""
    parsed = parse_sec(text)
    sec = parsed.value if parsed.ok else None
    process = None if sec is None else process_reward(sec, names, x_1, x_2, true_weights)
    return combine(sec, first_is_chosen, process, alpha, beta, format_penalty)
