"""Top-k profile retrieval: rank a user's past posts by relevance to a query (docs/protocols.md section 2).

PRB feeds the reward model the top-10 posts of a dense retriever, each rendered as ``Post i (Category: c):``
then the text (:func:`pr_rlhf.reward.inputs.render_profile`). The public ranking scripts reorder texts but keep
the *old* ids, so id and text disagree after ranking; here every ranked item is the input item itself (id, text
and category travel together) plus its score.
Ties break deterministically: score descending, then the item's original position.

Scorers: any :class:`~pr_rlhf.models.embedders.Embedder` (dot product of embeddings), the
:class:`~pr_rlhf.models.embedders.BM25Scorer`, or a plain ``callable(query, texts) -> scores``.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from pr_rlhf.models.embedders import DEFAULT_BATCH_SIZE, BM25Scorer, Embedder, is_lexical, make_embedder
from pr_rlhf.records import Pair, Profile, Query

Scorer = Embedder | BM25Scorer | Callable[[str, list[str]], Sequence[float]]
DEFAULT_TOP_K = 10
_ENCODE_CHUNK = 2048  # texts per encode call in batched retrieval: bounds memory and paces the progress bar


@lru_cache(maxsize=1)
def default_embedder() -> Embedder:
    """The shared, cached MiniLM embedder (loaded on first use)."""
    return make_embedder("minilm")  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------------------------
# Single query
# --------------------------------------------------------------------------------------------------------------

def profile_item(item: Any) -> dict:
    """A profile item as ``{id, text, category}`` from a dict or a ProfileItem-like object."""
    get = item.get if isinstance(item, Mapping) else (lambda k, d=None: getattr(item, k, d))
    return {"id": str(get("id", "")), "text": str(get("text", "") or ""), "category": str(get("category", "") or "")}


def ranking_order(scores: Sequence[float] | np.ndarray, top_k: int | None = None) -> np.ndarray:
    """Indices by score descending, ties by original index; NaN ranks last. ``top_k=None`` keeps all."""
    values = np.asarray(scores, dtype=np.float64).copy()
    values[np.isnan(values)] = -np.inf
    order = np.argsort(-values, kind="stable")  # stable sort = original index breaks ties
    return order if top_k is None else order[: max(int(top_k), 0)]


def score_texts(query: str, texts: Sequence[str], scorer: Scorer) -> np.ndarray:
    """Relevance of each text to the query under any supported scorer."""
    texts = list(texts)
    if not texts:
        return np.zeros(0, dtype=np.float32)
    if is_lexical(scorer):
        return np.asarray(scorer.score(query, texts), dtype=np.float32)  # type: ignore[union-attr]
    if hasattr(scorer, "encode"):
        vectors = scorer.encode([query] + texts)  # type: ignore[union-attr]
        return vectors[1:] @ vectors[0]
    if callable(scorer):
        scores = np.asarray(scorer(query, texts), dtype=np.float32)
        if scores.shape != (len(texts),):
            raise ValueError(f"scorer returned shape {scores.shape} for {len(texts)} texts")
        return scores
    raise TypeError(f"not a scorer: {type(scorer).__name__} (need .encode, .score_many, or a callable)")


def _ranked(items: Sequence[dict], scores: np.ndarray, top_k: int | None) -> list[dict]:
    # records.RetrievedItem as a plain dict (asdict is slow over millions of items; a test checks the fields).
    return [{"id": items[i]["id"], "text": items[i]["text"], "category": items[i]["category"],
             "score": float(scores[i])}
            for i in ranking_order(scores, top_k)]


def rank_profile(query: str, items: Iterable[Any], top_k: int | None = DEFAULT_TOP_K,
                 scorer: Scorer | None = None) -> list[dict]:
    """The ``top_k`` most relevant items (``None``: all), each ``RetrievedItem`` as a dict with its own id/text.

    ``scorer`` defaults to the shared MiniLM embedder.
    """
    items = [profile_item(i) for i in items]
    scores = score_texts(query, [i["text"] for i in items], scorer if scorer is not None else default_embedder())
    return _ranked(items, scores, top_k)


# --------------------------------------------------------------------------------------------------------------
# Batched over many queries
# --------------------------------------------------------------------------------------------------------------

@dataclass
class RetrievalStats:
    queries: int = 0
    missing_profile: int = 0     # queries whose user has no profile: left with an empty ``retrieved``
    items_ranked: int = 0        # profile items scored, summed over queries
    unique_texts: int = 0        # distinct texts (queries + posts) handed to the embedder
    encode_s: float = 0.0
    rank_s: float = 0.0

    @property
    def seconds(self) -> float:
        return self.encode_s + self.rank_s


def query_text(query: Query) -> str:
    """What retrieval matches on: the question, else the last user turn of the context."""
    if query.question.strip():
        return query.question
    for turn in reversed(query.context):
        if turn.get("role") == "user" and str(turn.get("content", "")).strip():
            return str(turn["content"])
    return ""


def _find_profile(query: Query, profiles_by_user: Mapping[Hashable, Any]) -> Any:
    # A profile is identified by (user_id, subset) in the records; plain user_id keys are accepted too.
    for key in ((query.user_id, query.subset), query.user_id):
        if key in profiles_by_user:
            return profiles_by_user[key]
    return None


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="text" if desc == "embed" else "user", leave=False)


def retrieve_for_queries(queries: Sequence[Query], profiles_by_user: Mapping[Hashable, Profile | Sequence[Any]],
                         top_k: int | None = DEFAULT_TOP_K, embedder: Scorer | None = None, *,
                         batch_size: int = DEFAULT_BATCH_SIZE, progress: bool = False) -> RetrievalStats:
    """Fill ``query.retrieved`` for every query with its user's top-k profile items (in place).

    ``profiles_by_user`` maps ``user_id`` or ``(user_id, subset)`` to a :class:`Profile` or a list of items.
    Dense scorers: every distinct query and post text is encoded once (through the embedder's cache when it
    has one, which is then saved if it has a cache dir), then each user's queries are scored against the
    user's posts with one matrix product.
    """
    scorer = embedder if embedder is not None else default_embedder()
    stats = RetrievalStats(queries=len(queries))
    # Group queries by the profile object they read, so each profile is normalized and scored as one block.
    # The profile object itself is kept in the group so its id() cannot be reused while we run.
    groups: dict[int, tuple[Any, list[dict], list[Query]]] = {}
    for query in queries:
        profile = _find_profile(query, profiles_by_user)
        if profile is None:
            query.retrieved = []
            stats.missing_profile += 1
            continue
        if id(profile) not in groups:
            raw = profile.items if isinstance(profile, Profile) else profile
            groups[id(profile)] = (profile, [profile_item(i) for i in raw], [])
        groups[id(profile)][2].append(query)

    dense = not is_lexical(scorer) and hasattr(scorer, "encode")
    vectors = np.zeros((0, 0), dtype=np.float32)
    row: dict[str, int] = {}
    if dense:
        for _, items, members in groups.values():
            for text in [query_text(q) for q in members] + [i["text"] for i in items]:
                row.setdefault(text, len(row))
        stats.unique_texts = len(row)
        start = time.perf_counter()
        texts = list(row)
        bar = _progress(len(texts), "embed", progress)
        chunks = []
        for lo in range(0, len(texts), _ENCODE_CHUNK):
            chunks.append(np.asarray(scorer.encode(texts[lo:lo + _ENCODE_CHUNK], batch_size=batch_size),  # type: ignore[union-attr]
                                     dtype=np.float32))
            if bar is not None:
                bar.update(len(chunks[-1]))
        if bar is not None:
            bar.close()
        vectors = np.concatenate(chunks) if chunks else vectors
        save = getattr(scorer, "save", None)
        if callable(save):  # a CachedEmbedder with a cache_dir persists what this pass embedded
            save()
        stats.encode_s = time.perf_counter() - start

    start = time.perf_counter()
    bar = _progress(len(groups), "rank", progress)
    for _, items, members in groups.values():
        item_texts = [i["text"] for i in items]
        if dense and items:
            scores = vectors[[row[query_text(q)] for q in members]] @ vectors[[row[t] for t in item_texts]].T
        elif is_lexical(scorer):
            scores = scorer.score_many([query_text(q) for q in members], item_texts)  # type: ignore[union-attr]
        else:
            scores = [score_texts(query_text(q), item_texts, scorer) for q in members]
        for query, query_scores in zip(members, scores):
            query.retrieved = _ranked(items, np.asarray(query_scores), top_k)
            stats.items_ranked += len(items)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    stats.rank_s = time.perf_counter() - start
    return stats


def copy_retrieved_to_pairs(queries: Iterable[Query], pairs: Iterable[Pair]) -> int:
    """Give each pair its query's ``retrieved`` list (by ``query_id``); returns how many pairs were filled."""
    by_id = {q.query_id: q.retrieved for q in queries}
    filled = 0
    for pair in pairs:
        retrieved = by_id.get(pair.query_id)
        if retrieved is not None:
            pair.retrieved = [dict(item) for item in retrieved]  # own copies: editing one pair never edits another
            filled += 1
    return filled


__all__ = [
    "DEFAULT_TOP_K", "RetrievalStats", "Scorer", "copy_retrieved_to_pairs", "default_embedder", "profile_item",
    "query_text", "rank_profile", "ranking_order", "retrieve_for_queries", "score_texts",
]
