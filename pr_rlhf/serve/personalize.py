"""Online personalization: what the reward service does with the user store (``pr_rlhf.serve.users``).

- :meth:`OnlineUsers.add_feedback`: each feedback is appended to its user's history; with prototypes configured
  it is also embedded (chosen minus rejected, the direction of the user's preference) and the user's mean vector
  re-placed at its nearest prototype: one lookup per feedback, never a re-clustering.
- :meth:`OnlineUsers.personalize`: a scoring request that names a user and carries no history gets the user's
  stored pairs (the most recent, or the most relevant to the query, up to the protocol's history size, in arrival
  order); a user with fewer pairs than that borrows the latest pair of the most similar users of their prototype
  (placed before their own, so their own pair stays the most recent); a request without profile posts gets the
  user's stored chosen answers as posts (what a profile-mode scorer such as the BT RM w/ profile reads); stated
  preferences, when the request has none, are the user's latest. What a request brings itself is never replaced.

Every filled request says what it was given (:class:`Provenance`), so a caller can rebuild the same input offline.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pr_rlhf.configs.serve import UserStoreConfig
from pr_rlhf.serve.schema import FeedbackItem, HistoryTriple, ProfilePost, ScoreItem
from pr_rlhf.serve.users import FeedbackRecord, Receipt, UserState, UserStore


@dataclass
class Provenance:
    """Where a filled request's history came from: how many pairs are the user's own, the users a pair was
    borrowed from (most similar first), ``(user id, seq)`` of each pair in the order shown (oldest first)."""

    own: int = 0
    borrowed_from: list[str] = field(default_factory=list)
    pairs: list[tuple[str, int]] = field(default_factory=list)
    profile_posts: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"own_pairs": self.own, "borrowed_from": self.borrowed_from,
                "pairs": [list(p) for p in self.pairs], "profile_posts": self.profile_posts}


def most_relevant(history: Sequence[dict], query: str, k: int) -> list[int]:
    """Indices of the k pairs whose questions are most relevant to the query (BM25), best first; ties to the more
    recent."""
    from pr_rlhf.models.embedders import BM25Scorer

    scores = BM25Scorer().score(query, [h["question"] for h in history]) if history else []
    return sorted(range(len(history)), key=lambda i: (-float(scores[i]), -i))[:k]


def select_pairs(history: Sequence[dict], query: str, k: int, selection: str) -> list[dict]:
    """Up to k of a user's pairs (oldest first in ``history``): the most recent, or the k most relevant to the
    query, returned in arrival order."""
    if len(history) <= k:
        return list(history)
    if selection == "recent":
        return list(history[-k:])
    return [history[i] for i in sorted(most_relevant(history, query, k))]


def feedback_vectors(embedder: Any, items: Sequence[FeedbackItem]) -> np.ndarray:
    """One vector per feedback: the normalized embedding of the chosen answer minus the rejected one's."""
    from pr_rlhf.scaling.embedding import embed_personas

    vectors = embed_personas([t for it in items for t in (it.chosen, it.rejected)], embedder)
    return vectors[0::2] - vectors[1::2]


class OnlineUsers:
    """The store, and the optional embedder + prototype index that place users; owned by one service replica."""

    def __init__(self, cfg: UserStoreConfig, *, store: UserStore | None = None, embedder: Any = None,
                 index: Any = None):
        self.cfg = cfg
        self.store = store or UserStore(cfg.url)
        self.index, self.embedder = index, embedder
        if cfg.prototypes and index is None:
            from pr_rlhf.models.embedders import make_embedder
            from pr_rlhf.scaling.embedding import embedder_name
            from pr_rlhf.scaling.index import PrototypeIndex

            self.embedder = embedder or make_embedder(cfg.embedder or "minilm", cache=False)
            self.index = PrototypeIndex.load(cfg.prototypes, expected_embedder=embedder_name(self.embedder))

    # ------------------------------------------------------------------------------------------------ feedback

    def check(self, item: FeedbackItem) -> str | None:
        """Why a feedback cannot be stored (the field and the reason), or None."""
        for name in ("query", "chosen", "rejected", "stated_preferences"):
            if len(getattr(item, name)) > self.cfg.max_text_chars:
                return f"{name}: {len(getattr(item, name))} characters, at most {self.cfg.max_text_chars}"
        return None

    def add_feedback(self, tenant: str, items: Sequence[FeedbackItem]) -> list[Receipt]:
        """Store each feedback (one transaction each; a batch shares one embedding call)."""
        vectors: Any = [None] * len(items)
        if self.index is not None:
            vectors = feedback_vectors(self.embedder, items)
        assign = self.index.nearest_prototype if self.index is not None else None
        return [self.store.add_feedback(tenant, FeedbackRecord(it.user_id, it.query, it.chosen, it.rejected,
                                                               it.stated_preferences, it.idempotency_key),
                                        vector=v, assign=assign)
                for it, v in zip(items, vectors)]

    # ------------------------------------------------------------------------------------------------ scoring

    def personalize(self, tenant: str, items: Sequence[ScoreItem]) -> tuple[list[ScoreItem], list[Provenance | None]]:
        """Each item filled from its user's stored state (None: the item was left as it came: it carried its
        own history and profile, or the store does not know the user)."""
        cfg = self.cfg
        wanted = [it.user_id for it in items if not it.history or (cfg.profile_items and not it.profile)]
        read = cfg.max_history_read if (cfg.selection == "relevant" or cfg.profile_items) else cfg.history_pairs
        states = self.store.users(tenant, wanted, history=read)
        out: list[ScoreItem] = []
        provenance: list[Provenance | None] = []
        for item in items:
            state = states.get(item.user_id)
            if state is None or item.user_id not in wanted:
                out.append(item)
                provenance.append(None)
                continue
            update: dict[str, Any] = {}
            prov = Provenance()
            if not item.history:
                own = select_pairs(state.history, item.query, cfg.history_pairs, cfg.selection)
                lent = self._borrow(tenant, state, cfg.history_pairs - len(own))
                pairs = [*lent, *[(state.user_id, h) for h in own]]
                update["history"] = [HistoryTriple(question=h["question"], chosen=h["chosen"],
                                                   rejected=h["rejected"]) for _, h in pairs]
                prov.own, prov.borrowed_from = len(own), [u for u, _ in reversed(lent)]   # most similar first
                prov.pairs = [(u, int(h["seq"])) for u, h in pairs]
            if cfg.profile_items and not item.profile and state.history:
                posts = [state.history[i] for i in most_relevant(state.history, item.query, cfg.profile_items)]
                update["profile"] = [ProfilePost(text=h["chosen"], id=f"feedback-{h['seq']}", category="chosen")
                                     for h in posts]
                prov.profile_posts = len(posts)
            if not item.stated_preferences and state.stated_preferences:
                update["stated_preferences"] = state.stated_preferences
            out.append(item.model_copy(update=update))
            provenance.append(prov)
        return out, provenance

    def _borrow(self, tenant: str, state: UserState, missing: int) -> list[tuple[str, dict]]:
        """The latest pair of up to ``min(missing, neighbours)`` users of the same prototype, most similar first
        (cosine of the mean feedback vectors; ties to more feedback, then user id), oldest-first order back."""
        count = min(missing, self.cfg.neighbours)
        if count <= 0 or state.prototype is None or state.vector is None:
            return []
        candidates = [c for c in self.store.same_prototype(tenant, state.prototype, state.user_id, limit=256)
                      if c.vector is not None and c.vector.shape == state.vector.shape]
        if not candidates:
            return []
        mine = state.vector / max(float(np.linalg.norm(state.vector)), 1e-12)
        sims = [float(c.vector @ mine) / max(float(np.linalg.norm(c.vector)), 1e-12) for c in candidates]
        ranked = sorted(range(len(candidates)), key=lambda i: (-sims[i], -candidates[i].size,
                                                               candidates[i].user_id))[:count]
        lenders = [candidates[i].user_id for i in ranked]
        latest = self.store.users(tenant, lenders, history=1)
        return [(u, latest[u].history[-1]) for u in reversed(lenders) if u in latest and latest[u].history]


def build_feedback_prototypes(histories: dict[str, list[tuple[str, str]]], embedder: Any, k: int,
                              seed: int = 0) -> Any:
    """A prototype index over users' mean feedback vectors (each user's (chosen, rejected) pairs), K-means into
    k prototypes: what ``serve.users.prototypes`` places arriving users with, built offline from a population."""
    from pr_rlhf.scaling.build import build_index

    users = sorted(u for u, pairs in histories.items() if pairs)
    if len(users) < k:
        raise ValueError(f"{len(users)} users with feedback for k={k} prototypes")
    items = [FeedbackItem(user_id=u, query="-", chosen=c, rejected=r, idempotency_key="-")
             for u in users for c, r in histories[u]]
    vectors = feedback_vectors(embedder, items)
    means, start = [], 0
    for u in users:
        means.append(vectors[start:start + len(histories[u])].mean(axis=0))
        start += len(histories[u])
    return build_index(users, None, embedder, k, seed=seed, vectors=np.stack(means), placement="feedback")
