"""What the leaderboard trains on and evaluates, from a synthetic world: the seen users' train pairs, and the
evaluation pairs (seen users' val + test, cold-start users' test: the P-GenRM study's groups) each with the user's
pairs a method is given, and the world's reference predictors on the same pairs."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pr_rlhf.embedrm.scoring import pair_text
from pr_rlhf.embedrm.train import PairData
from pr_rlhf.eval.groups import EVAL_GROUPS, group_of
from pr_rlhf.world.generator import World, WorldPair
from pr_rlhf.world.reference import held_out_by_user, reference_scores


@dataclass
class Item:
    """An evaluation pair and what a method is given about its user: their pairs (oldest first) and, for a row
    reading posts, the user's profile posts retrieved for the question (best first)."""

    pair_id: str
    user_id: str
    group: str
    question: str
    chosen: str
    rejected: str
    history: list[dict] = field(default_factory=list)
    profile: list[dict] = field(default_factory=list)


def first_users(items: Sequence[Item], per_group: int | None) -> list[Item]:
    """The items of the first ``per_group`` users (by id) of each group, in their order (None: every item)."""
    if per_group is None:
        return list(items)
    kept = {group: sorted({it.user_id for it in items if it.group == group})[:per_group]
            for group in {it.group for it in items}}
    chosen = {(group, user) for group, users in kept.items() for user in users}
    return [it for it in items if (it.group, it.user_id) in chosen]


def first_pairs(items: Sequence[Item], per_user: int | None) -> list[Item]:
    """Each user's first ``per_user`` items, in their order (None: every item): a slow model on a set of few users."""
    if per_user is None:
        return list(items)
    seen: dict[str, int] = {}
    kept = []
    for it in items:
        seen[it.user_id] = seen.get(it.user_id, 0) + 1
        if seen[it.user_id] <= per_user:
            kept.append(it)
    return kept


def history_of(pairs: Sequence[WorldPair]) -> list[dict]:
    return [{"question": p.question, "chosen": p.chosen, "rejected": p.rejected} for p in pairs]


def evaluation_items(world: World, seen_history: int | None = None, cold_history: int | None = None) -> list[Item]:
    """Every evaluation pair in world order, seen users' then cold-start users' (as ``held_out_by_user`` orders
    them), each with the user's first ``*_history`` train pairs (None: all of them)."""
    out = []
    for group in EVAL_GROUPS.values():
        size = seen_history if group.name == "seen" else cold_history
        for user, held_out in held_out_by_user(world, group.users, group.splits):
            history = history_of(world.history(user.user_id, size))
            out += [Item(p.pair_id, p.user_id, group.name, p.question, p.chosen, p.rejected, history)
                    for p in held_out]
    return out


def with_profiles(items: Sequence[Item], shards: str) -> list[Item]:
    """``items`` each with the profile posts its pair row holds in ``shards`` (`pr-rlhf data build`'s ``retrieved``:
    what `pr-rlhf train-rm`'s w/ profile RM was trained to read)."""
    from dataclasses import replace

    from pr_rlhf.shards import ShardReader

    retrieved = {r["pair_id"]: list(r.get("retrieved") or []) for r in ShardReader(shards).iter_rows("pairs")}
    missing = [it.pair_id for it in items if it.pair_id not in retrieved]
    if missing:
        raise ValueError(f"{shards}: no pair rows for evaluation pairs {missing[:3]} ({len(missing)} in all)")
    return [replace(it, profile=retrieved[it.pair_id]) for it in items]


def training_pairs(world: World) -> list[WorldPair]:
    """Every seen user's train pairs (cold-start users never train anything)."""
    return [p for u in world.users if not u.cold_start for p in world.pairs_of(u.user_id, "train")]


def embed_training(pairs: Sequence[WorldPair], embedder) -> PairData:
    texts = [pair_text(p.question, side) for p in pairs for side in (p.chosen, p.rejected)]
    vectors = np.asarray(embedder.encode(texts), dtype=np.float32)
    return PairData.from_arrays([p.user_id for p in pairs], [p.pair_id for p in pairs], vectors[0::2],
                                vectors[1::2], source="the world's training pairs")


def reference_outcomes(world: World, predictors: Sequence[str]) -> dict[str, dict[str, float]]:
    """``row -> pair id -> 1 / 0.5 / 0`` for each reference predictor on the evaluation pairs: with the user's first
    3 train pairs (``<name>``, P-GenRM's history) and, for seen users, all of them (``<name>@all``: what the
    embedding methods learn a seen user from)."""
    out: dict[str, dict[str, float]] = {}
    histories = {"": 3, "@all": world.config.history_size}
    for suffix, size in histories.items():
        for group in EVAL_GROUPS.values():
            names = [n for n in predictors if not (suffix and n == "no_history")]   # the prior reads no pairs
            if suffix and group.cold_start or not names:
                continue
            scores = reference_scores(world, size, users=group.users, splits=group.splits, predictors=tuple(names))
            for name in names:
                row = out.setdefault(name + suffix, {})
                row.update(zip(scores["pair_ids"], (float(v) for v in scores[name])))
    return out


@dataclass
class TrainPair:
    """A training pair of a dataset read from shards (the fields ``embed_training`` reads, as a world pair has)."""

    pair_id: str
    user_id: str
    question: str
    chosen: str
    rejected: str


def shard_dataset(shards: str, history_pairs: int, cluster: str = "user") -> tuple[list[TrainPair], list[Item],
                                                                                 list[str]]:
    """(training pairs, evaluation items, each item's bootstrap unit) of a shard folder (`pr-rlhf data build`):
    seen users' train pairs train; their val + test pairs and cold-start users' test pairs are evaluated, each with
    the user's first ``history_pairs`` history pairs (the histories table's order); the unit is the user or, with
    ``cluster="query"``, the query (for a set with few users)."""
    from pr_rlhf.shards import ShardReader

    reader = ShardReader(shards)
    cold = {u for u, _ in reader.cold_start_users()}
    pairs = {r["pair_id"]: r for r in reader.iter_rows("pairs")}
    if not pairs:
        raise ValueError(f"{shards}: no pairs")
    history: dict[str, list[dict]] = {}
    for row in reader.iter_rows("histories"):
        missing = [p for p in row["pair_ids"] if p not in pairs]
        if missing:
            raise ValueError(f"{shards}: the history of user {row['user_id']!r} names pairs the pairs table lacks "
                             f"({missing[:3]})")
        history.setdefault(row["user_id"], []).extend(
            {"question": pairs[p]["question"], "chosen": pairs[p]["chosen"], "rejected": pairs[p]["rejected"]}
            for p in row["pair_ids"])
    training = [TrainPair(r["pair_id"], r["user_id"], r["question"], r["chosen"], r["rejected"])
                for r in pairs.values() if r["split"] == "train" and r["user_id"] not in cold]
    items, units = [], []
    for r in pairs.values():
        group = group_of(r["user_id"] in cold)
        if r["split"] not in group.splits:
            continue
        items.append(Item(r["pair_id"], r["user_id"], group.name, r["question"], r["chosen"], r["rejected"],
                          history.get(r["user_id"], [])[:history_pairs]))
        units.append(r["query_id"] if cluster == "query" else r["user_id"])
    return training, items, units
