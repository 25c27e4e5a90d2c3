"""The offline build of a :class:`~pr_rlhf.scaling.index.PrototypeIndex`: the member users' personas embedded,
K-means into k prototypes and, given their histories, the prototypes refined on them."""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pr_rlhf.configs.scaling import RefineConfig
from pr_rlhf.scaling.embedding import embed_personas, embedder_name
from pr_rlhf.scaling.index import PrototypeIndex
from pr_rlhf.scaling.kmeans import kmeans
from pr_rlhf.scaling.refine import PrototypeRefiner, UserHistory, refine
from pr_rlhf.scaling.validation import EPS, check_unique


def nearest_rows(vectors: np.ndarray, prototypes: np.ndarray) -> np.ndarray:
    """For each row, the prototype with the highest cosine (ties to the lowest id), as PrototypeIndex does."""
    protos = prototypes / np.maximum(np.linalg.norm(prototypes, axis=1, keepdims=True), EPS)
    rows = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), EPS)
    return np.argmax(rows @ protos.T, axis=1).astype(np.int64)


def build_index(user_ids: Sequence[str], persona_texts: Sequence[str] | None, embedder: Any, k: int, seed: int = 0,
                histories: Sequence[UserHistory] | None = None, refine_cfg: RefineConfig | None = None, *,
                fingerprint: str | None = None, vectors: np.ndarray | None = None,
                placement: str = "persona") -> PrototypeIndex:
    """Embed the personas (or take the members' ``vectors`` as they are, e.g. profile embeddings), K-means them
    into k prototypes and, given both ``histories`` and ``refine_cfg``, refine the prototypes on those histories
    (members without a history just do not train). ``placement`` is recorded in the index: a lookup must place
    users the same way.

    Passing only one of the two is an error rather than a silent unrefined index. ``fingerprint`` defaults to the
    embedder's ``fingerprint`` attribute when it has one.
    """
    user_ids = list(user_ids)
    if (persona_texts is None) == (vectors is None):
        raise ValueError("pass persona_texts or vectors, exactly one of them")
    rows = len(persona_texts) if persona_texts is not None else len(vectors)   # type: ignore[arg-type]
    if len(user_ids) != rows:
        raise ValueError(f"{len(user_ids)} user ids but {rows} persona texts / vectors")
    check_unique(user_ids)
    if (histories is None) != (refine_cfg is None):
        raise ValueError("refinement needs both histories and refine_cfg (pass neither for K-means only)")
    embeddings = embed_personas(persona_texts, embedder) if persona_texts is not None else \
        np.asarray(vectors, dtype=np.float32)
    clusters = kmeans(embeddings, k, seed=seed)
    dim = int(embeddings.shape[1])
    prototypes, state, cfg_dump = clusters.centroids.copy(), None, None
    labels, kept = clusters.labels, 1.0
    if histories is not None and refine_cfg is not None:
        histories = list(histories)
        check_unique([h.user_id for h in histories], "history user id")
        row = {uid: i for i, uid in enumerate(user_ids)}
        unknown = [h.user_id for h in histories if h.user_id not in row]
        if unknown:
            raise ValueError(f"history for user {unknown[0]!r}, who is not among the index's users")
    if histories is not None and refine_cfg is not None and refine_cfg.steps > 0:  # 0 steps: centroids as they are
        refiner = PrototypeRefiner(dim, k, clusters.centroids, seed=seed)
        refine(refiner, histories, [int(clusters.labels[row[h.user_id]]) for h in histories], refine_cfg)
        prototypes = refiner.prototypes.detach().numpy().copy()
        state = {name: t.detach().clone() for name, t in refiner.state_dict().items()}
        cfg_dump = refine_cfg.model_dump()
        # Online, a persona is placed by its nearest REFINED prototype; members are re-assigned the same way, so
        # a member's own persona finds its own cluster (refinement moves the prototypes away from the centroids)
        labels = nearest_rows(embeddings, prototypes)
        kept = float(np.mean(labels == clusters.labels))
    if fingerprint is None and isinstance(getattr(embedder, "fingerprint", None), str):
        fingerprint = embedder.fingerprint
    created = {"utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seed": seed,
               "users": len(user_ids), "inertia": clusters.inertia, "torch": torch.__version__,
               "kmeans_label_kept": kept, "placement": placement}
    return PrototypeIndex(embedder=embedder_name(embedder), k=k, dim=dim, centroids=clusters.centroids,
                          prototypes=prototypes, user_ids=user_ids, embeddings=embeddings, labels=labels,
                          fingerprint=fingerprint, refiner_state=state, refine_config=cfg_dump, created=created)
