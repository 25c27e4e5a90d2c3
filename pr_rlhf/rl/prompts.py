"""The prompts an RL run trains and evaluates on, read from the shards; the seeded order it visits them in; the
token ids of a supervised (prompt, target) example.

Pure (no Ray, no torch): the controller, the P-GenRM stages, the Best-of-N sweep and the benchmarks load and order
prompts the same way, and a resumed run finds the same prompts at the same data position.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from pr_rlhf.configs.rl import RLConfig, RLDataConfig
from pr_rlhf.models.prompting import encode_continuation, encode_prompt
from pr_rlhf.reward.inputs import history_rows_by_user, history_triple, policy_messages
from pr_rlhf.shards import ShardReader

T = TypeVar("T")
SFTExample = tuple[list[int], list[int]]   # (prompt token ids, target token ids ending in EOS)


@dataclass(frozen=True)
class PromptItem:
    prompt_id: str
    user_id: str
    subset: str
    question: str
    messages: list
    retrieved: tuple = ()   # the query's retrieved profile posts, for reward models that read them
    history: tuple = ()     # the user's earlier pairs as {question, chosen, rejected}, for reward models only

    def reward_meta(self) -> dict[str, Any]:
        """What a reward request about this prompt carries for the scorer (the user's retrieved posts and, when
        the run sends one, the user's history)."""
        meta: dict[str, Any] = {"subset": self.subset, "retrieved": [dict(post) for post in self.retrieved]}
        if self.history:
            meta["history"] = [dict(t) for t in self.history]
        return meta


def query_plans(reader: ShardReader, data: RLDataConfig) -> dict[str, list[str]]:
    """query id -> the aspects the policy is shown (``data.plan``: none, or the shards' rubrics)."""
    if data.plan == "none":
        return {}
    plans = {r["query_id"]: [a["aspect"] for a in r["aspects"]][:data.plan_max_aspects]
             for r in reader.iter_rows("rubrics")}
    if not plans:
        raise ValueError(f"{data.shards}: train.data.plan='rubrics' but the shards hold no rubrics")
    return plans


def user_histories(reader: ShardReader, size: int) -> dict[tuple[str, str], tuple[dict, ...]]:
    """(user id, subset) -> the user's first ``size`` train pairs as {question, chosen, rejected} (empty when
    ``size`` is 0 or the shards have no train pairs)."""
    if size <= 0 or "train" not in reader.splits("pairs"):
        return {}
    rows = history_rows_by_user(reader.iter_rows("histories"), reader.iter_rows("pairs", "train"))
    return {key: tuple(history_triple(p) for p in past[:size]) for key, past in rows.items()}


def make_item(row: dict, data: RLDataConfig, plans: dict[str, list[str]],
              histories: dict[tuple[str, str], tuple[dict, ...]] | None = None) -> PromptItem:
    """The policy prompt of a query (or pair) row: its question, ``data.profile_top_k`` retrieved posts, its plan;
    the user's history (from ``histories``) travels with the item for the reward model only."""
    if data.plan != "none" and row["query_id"] not in plans:
        raise ValueError(f"{data.shards}: query {row['query_id']!r} has no rubric (train.data.plan='rubrics')")
    return PromptItem(row["query_id"], row["user_id"], row["subset"], row["question"],
                      policy_messages(row["question"], row["retrieved"], data.profile_top_k,
                                      plans.get(row["query_id"])),
                      tuple(dict(post) for post in row.get("retrieved") or ()),
                      (histories or {}).get((row["user_id"], row["subset"]), ()))


def load_prompts(cfg: RLConfig) -> tuple[list[PromptItem], list[PromptItem]]:
    """Training prompts (queries of seen users) and held-out prompts (cold-start users, or the test split)."""
    reader = ShardReader(cfg.data.shards)
    cold = reader.cold_start_users()
    plans = query_plans(reader, cfg.data)
    histories = user_histories(reader, cfg.data.history_pairs)

    def items(rows: Iterable[dict[str, Any]]) -> list[PromptItem]:
        return [make_item(r, cfg.data, plans, histories) for r in rows]

    train = items(r for r in reader.iter_rows("queries", cfg.data.train_split)
                  if (r["user_id"], r["subset"]) not in cold)
    if cfg.data.heldout == "cold_start" and cold:
        held = items(r for r in reader.iter_rows("queries") if (r["user_id"], r["subset"]) in cold)
    else:
        held = items(reader.iter_rows("queries", "test"))
    if not train or not held:
        raise ValueError(f"{cfg.data.shards}: {len(train)} training and {len(held)} held-out prompts; need both")
    held = [held[i] for i in np.random.default_rng(0).permutation(len(held))[:cfg.data.heldout_prompts]]
    return train, held


def load_warmup_answers(cfg: RLConfig, seed: int = 0) -> list[tuple[PromptItem, str]]:
    """(prompt, answer) pairs from the training users' pairs: both answers of each pair, so a warm start learns
    what answers look like without learning whom they suit; with ``warmup_sft_target='rubric'``
    (:func:`rubric_following_answers`) answers that do what the prompt's aspects ask."""
    reader = ShardReader(cfg.data.shards)
    plans = query_plans(reader, cfg.data)
    if cfg.warmup_sft_target == "rubric":
        return rubric_following_answers(reader, cfg, seed)
    out = []
    for r in reader.iter_rows("pairs", cfg.data.train_split):
        item = make_item(r, cfg.data, plans)
        out += [(item, r["chosen"]), (item, r["rejected"])]
    return out


def sft_example(tokenizer: Any, messages: list, target: str, max_target_tokens: int | None = None) -> SFTExample:
    """A supervised example: the chat prompt's token ids, and the target's (at most ``max_target_tokens``) + EOS."""
    return (encode_prompt(tokenizer, messages),
            encode_continuation(tokenizer, target)[:max_target_tokens] + [tokenizer.eos_token_id])


def prompt_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order ``epoch`` visits ``n`` prompts in (each epoch reshuffles with its own seed)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def batch_at(items: Sequence[T], position: int, count: int, seed: int) -> list[T]:
    """``count`` items starting at global data ``position`` (epochs reshuffle with their own seed)."""
    out = []
    n = len(items)
    for pos in range(position, position + count):
        epoch, offset = divmod(pos, n)
        out.append(items[prompt_order(n, seed, epoch)[offset]])
    return out


def rubric_following_answers(reader: ShardReader, cfg: RLConfig, seed: int = 0) -> list[tuple[PromptItem, str]]:
    """Two answers per training query of a compact synthetic world, each with every attribute its rubric names set
    as the aspect asks and every other attribute drawn at random (seeded): the answer depends on what the prompt
    shows, never on a preference label, so the warm policy follows instructions without knowing anyone's taste."""
    from pr_rlhf.configs.world import WorldConfig
    from pr_rlhf.world.attributes import render_compact

    world = reader.manifest.get("config", {}).get("world") or {}
    if world.get("rendering") != "compact":
        raise ValueError(f"{cfg.data.shards}: warmup_sft_target='rubric' renders answers of a compact synthetic "
                         f"world (shards of rendering {world.get('rendering')!r})")
    # the rubric's aspects and its meta's attributes are in the same order (most important first)
    wanted = {r["query_id"]: {a["name"]: int(a["wants"])
                              for a in json.loads(r["meta"])["attributes"][:cfg.data.plan_max_aspects]}
              for r in reader.iter_rows("rubrics")}
    names = WorldConfig.model_validate(world).attribute_names   # the world's order, as its answers are rendered
    rng = np.random.default_rng([seed, 23])
    out = []
    for item in load_prompts(cfg)[0]:   # the training prompts: seen users only
        for _ in range(2):
            drawn = rng.integers(0, 2, size=len(names))
            values = {n: wanted[item.prompt_id].get(n, int(v)) for n, v in zip(names, drawn)}
            out.append((item, render_compact(values)))
    return out
