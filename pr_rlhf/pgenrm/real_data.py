"""The P-GenRM pipeline on real data (``psi.source: teacher``): shards built by ``pr-rlhf data build`` from
PersonalRewardBench (Chatbot Arena, PRISM), Personalized RewardBench or LaMP-QA, instead of the synthetic world.

- **Examples.** Every seen user's first ``history_size`` train pairs (in the histories table's order) are their
  history; each later train pair is one example, its chosen answer in a seeded slot (``reward.judge.chosen_slot``).
  The held-out val / test pairs and the cold-start users are the evaluation's, never trained on.
- **What each stage sees** (the paper's information structure): the PSI teacher and the PSI prompts carry the
  user's stated preferences (PRISM's survey ``system_string``) and the history; CRE, the curriculum and the
  evaluation see the history only (``sec_prompt(use_stated=False)``).
- **Gold criteria** for the LLM-judged PR (``pgenrm.pr_judge``): the gold rubric's aspects for the query where the
  data has them, else the stated preferences, else none (no PR for that pair).
- **Hard negatives**, a data-computable rule: where the source records a rating of each answer (PRISM's
  ``chosen_score`` / ``rejected_score``, kept in the pair's meta) the *label margin* chosen - rejected, and the
  hard pairs are the ``hard_quantile`` share of the training pool with the smallest margin (near-equal ratings:
  only fit to the user decides). Where no pair has both ratings, the margin is the responses' word-set distance
  (1 - Jaccard similarity): the hard pairs are the most similar answers. The threshold comes from the training
  pool and applies to every pair, the evaluation's included.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from pr_rlhf.pgenrm.psi_data import PSIExample
from pr_rlhf.reward.inputs import RMInput, history_rows_by_user, rm_input
from pr_rlhf.reward.judge import chosen_slot
from pr_rlhf.reward.sec import sec_prompt
from pr_rlhf.shards import ShardReader

HardRule = Literal["label_margin", "response_similarity"]
_WORD = re.compile(r"\w+")


@dataclass
class RealExample:
    inp: RMInput                       # with the history and the stated preferences
    first_is_chosen: bool              # the seeded slot of the chosen answer
    hard: bool
    history_ids: tuple[str, ...]
    gold_criteria: str = ""


@dataclass
class RealData:
    shards: str
    examples: list[RealExample]
    hard: dict[str, bool]                          # pair id -> hard, for every pair of the shards
    hard_rule: HardRule
    margin_threshold: float
    gold: dict[str, str] = field(default_factory=dict)   # pair id -> gold criteria (may be "")

    def summary(self) -> dict:
        users = {e.inp.user_id for e in self.examples}
        return {"shards": self.shards, "examples": len(self.examples), "users": len(users),
                "hard_rule": self.hard_rule, "margin_threshold": self.margin_threshold,
                "hard_share_train": float(np.mean([e.hard for e in self.examples])) if self.examples else 0.0,
                "with_stated_preferences": sum(bool(e.inp.stated_preferences.strip()) for e in self.examples),
                "with_gold_criteria": sum(bool(e.gold_criteria.strip()) for e in self.examples)}


def label_margin(meta: str) -> float | None:
    """chosen_score - rejected_score from a pair's meta, when the source recorded both as numbers."""
    try:
        extras = json.loads(meta or "{}")
    except json.JSONDecodeError:
        return None
    a, b = extras.get("chosen_score"), extras.get("rejected_score")
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or \
            not isinstance(b, (int, float)):
        return None
    return float(a) - float(b)


def response_distance(chosen: str, rejected: str) -> float:
    """1 - the Jaccard similarity of the two answers' lower-cased word sets (0: the same words)."""
    a, b = set(_WORD.findall(chosen.lower())), set(_WORD.findall(rejected.lower()))
    return 1.0 - (len(a & b) / len(a | b) if a | b else 1.0)


def hard_flags(pairs: Sequence[dict], pool_ids: set[str], quantile: float) -> tuple[dict[str, bool], HardRule,
                                                                                    float]:
    """(pair id -> hard, the rule used, the margin threshold): the label margin where any pair has both ratings,
    else the response distance; hard = margin <= the ``quantile`` quantile of the pool's margins."""
    margins = {p["pair_id"]: label_margin(p.get("meta", "{}")) for p in pairs}
    rule: HardRule = "label_margin" if any(m is not None for m in margins.values()) else "response_similarity"
    if rule == "response_similarity":
        margins = {p["pair_id"]: response_distance(p["chosen"], p["rejected"]) for p in pairs}
    pool = [m for pid, m in margins.items() if pid in pool_ids and m is not None]
    if not pool:
        return {pid: False for pid in margins}, rule, float("nan")
    threshold = float(np.quantile(pool, quantile))
    return {pid: m is not None and m <= threshold for pid, m in margins.items()}, rule, threshold


def gold_criteria(rubric: dict | None, stated: str) -> str:
    """The gold rubric's aspects (one per line) where there is a rubric, else the stated preferences."""
    aspects = [str(a.get("aspect", "")).strip() for a in (rubric or {}).get("aspects") or []]
    aspects = [a for a in aspects if a]
    if aspects:
        return "\n".join(f"- {a}" for a in aspects)
    return stated.strip()


def load_real_data(shards: str, history_size: int, seed: int, hard_quantile: float = 1 / 3) -> RealData:
    """The training examples of the seen users and the hard flags of every pair (see the module docstring)."""
    reader = ShardReader(shards)
    if "train" not in reader.splits("pairs"):
        raise ValueError(f"{shards}: no train pairs (splits: {reader.splits('pairs')}); P-GenRM trains on them")
    profiles = {(r["user_id"], r["subset"]): r for r in reader.iter_rows("profiles")}
    rubrics = {(r["query_id"], r["user_id"]): r for r in reader.iter_rows("rubrics")}
    train = list(reader.iter_rows("pairs", "train"))
    every = train + [r for split in reader.splits("pairs") if split != "train"
                     for r in reader.iter_rows("pairs", split)]
    histories = history_rows_by_user(reader.iter_rows("histories"), train)
    examples: list[RealExample] = []
    for (user_id, subset), rows in histories.items():
        profile = profiles.get((user_id, subset)) or {}
        if profile.get("cold_start"):
            continue
        stated = str(profile.get("stated_preferences") or "")
        history = rows[:history_size]
        for row in rows[history_size:]:
            examples.append(RealExample(
                rm_input(row, history, stated), chosen_slot(seed, row["pair_id"]) == "A", False,
                tuple(h["pair_id"] for h in history),
                gold_criteria(rubrics.get((row["query_id"], user_id)), stated)))
    if not examples:
        raise ValueError(f"{shards}: no seen user has more than {history_size} train pairs (history_size): "
                         f"nothing to train on")
    hard, rule, threshold = hard_flags(every, {e.inp.pair_id for e in examples}, hard_quantile)
    for e in examples:
        e.hard = hard[e.inp.pair_id]
    gold = {e.inp.pair_id: e.gold_criteria for e in examples}
    return RealData(shards, examples, hard, rule, threshold, gold)


def slot_order(inp: RMInput, first_is_chosen: bool) -> tuple[str, str]:
    return (inp.chosen, inp.rejected) if first_is_chosen else (inp.rejected, inp.chosen)


def grpo_item(example: RealExample, first_is_chosen: bool | None = None) -> PSIExample:
    """A GRPO prompt of CRE / the curriculum: the history-only P-GenRM prompt (no stated preferences), the chosen
    answer in the example's slot (or the other one: ``first_is_chosen``)."""
    first = example.first_is_chosen if first_is_chosen is None else first_is_chosen
    messages = sec_prompt(example.inp, *slot_order(example.inp, first), use_stated=False)
    return PSIExample(example.inp.pair_id, example.inp.user_id, messages, "", first, True,
                      "hard" if example.hard else "standard", False, example.history_ids)
