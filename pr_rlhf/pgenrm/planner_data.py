"""Planner SFT data and its metric: (query, top-k profile posts) -> the gold rubric's aspects.

Examples come from any shards that hold rubrics (the synthetic world's gold rubrics; PRB / LaMP-QA rubrics on real
data): the prompt is the planner's own (``prompts/planner.txt``), the target the gold aspects as the numbered list
:func:`pr_rlhf.reward.planner.parse_aspects` reads back. Aspect precision / recall compare a predicted list with
the gold one under a matching rule: normalized text equality by default; on the synthetic world every aspect is
a catalog wording, so :func:`world_aspect_key` maps it to its (attribute, direction) exactly.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pr_rlhf.pgenrm.cre_reward import criterion_attribute
from pr_rlhf.reward.inputs import RMInput
from pr_rlhf.reward.planner import plan_prompt
from pr_rlhf.shards import ShardReader


@dataclass
class PlannerExample:
    query_id: str
    user_id: str
    split: str
    input: RMInput               # what the Planner builds its prompt from
    messages: list[dict]
    target: str
    aspects: list[str]


def planner_target(aspects: Sequence[str]) -> str:
    return "\n".join(f"{i}. {a}" for i, a in enumerate(aspects, 1))


def planner_examples(shards: str, splits: Sequence[str] = ("train",), top_k: int = 10) -> list[PlannerExample]:
    """One example per query that has a rubric, in shard order."""
    reader = ShardReader(shards)
    rubrics = {r["query_id"]: [a["aspect"] for a in r["aspects"]] for r in reader.iter_rows("rubrics")}
    out = []
    for q in reader.iter_rows("queries"):
        aspects = rubrics.get(q["query_id"])
        if not aspects or q["split"] not in splits:
            continue
        inp = RMInput(pair_id=q["query_id"], user_id=q["user_id"], subset=q["subset"], question=q["question"],
                      chosen="", rejected="", retrieved=[dict(r) for r in q["retrieved"]])
        out.append(PlannerExample(q["query_id"], q["user_id"], q["split"], inp, plan_prompt(inp, top_k),
                                  planner_target(aspects), aspects))
    return out


def text_key(aspect: str) -> str | None:
    return " ".join(aspect.lower().split()).rstrip(".") or None


def world_aspect_key(aspect: str) -> tuple[str, bool] | None:
    """(attribute, wants) of a synthetic-world aspect, None for anything else."""
    return criterion_attribute(aspect.strip().rstrip("."))


def aspect_precision_recall(predicted: Sequence[str], gold: Sequence[str],
                            key: Callable[[str], object | None] = text_key) -> tuple[float, float]:
    """Precision (share of predicted aspects that are gold) and recall (share of gold aspects predicted); an
    aspect without a key matches nothing. Empty predictions: precision 0 (recall 0 unless gold is empty too)."""
    keys = [key(a) for a in predicted if a.strip()]
    pred = {k for k in keys if k is not None}
    misses = sum(k is None for k in keys)          # an aspect no rule recognizes is a wrong prediction
    want = {k for k in map(key, gold) if k is not None}
    hit = len(pred & want)
    precision = hit / (len(pred) + misses) if pred or misses else 0.0
    recall = hit / len(want) if want else 1.0
    return precision, recall
