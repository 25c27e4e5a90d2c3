"""Persona embeddings: each member user's persona-analysis text (written by the generative reward model) embedded
and L2-normalized, so K-means and the online lookup work on cosine; or, by placement, only what the persona
concludes, or the user's profile posts (``scaling.prototypes.placement``)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pr_rlhf.scaling.validation import EPS


def embedder_name(embedder: Any) -> str:
    """The embedder's identifying name; a plain object without ``.name`` is named by its class."""
    return str(getattr(embedder, "name", type(embedder).__name__))


def normalize_rows(x: np.ndarray) -> np.ndarray:
    # A zero row (e.g. an encoder that maps empty text to zeros) stays zero instead of becoming NaN.
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, EPS)).astype(np.float32)


CONCLUSION_PREFIXES = ("Type:", "Prefers:", "Weakly:")   # the vote / trace / compact chains' conclusions


def conclusion_text(persona: str) -> str:
    """The lines of a persona that state what it concludes about the user (its type and preferred values), without
    the evidence lines that transliterate the history; the whole persona when it has none."""
    lines = [line.strip() for line in persona.splitlines() if line.strip().startswith(CONCLUSION_PREFIXES)]
    return "\n".join(lines) if lines else persona


def placement_text(persona: str, placement: str) -> str:
    """The text that places a user by ``placement`` ('persona' or 'conclusion')."""
    if placement == "profile":
        raise ValueError("placement 'profile' places users by their posts, not by a persona text")
    return conclusion_text(persona) if placement == "conclusion" else persona


def profile_vectors(posts_by_user: dict[str, list[str]], embedder: Any) -> dict[str, np.ndarray]:
    """Each user's profile as one L2-normalized vector: the mean of their posts' normalized embeddings (one
    encoder call for all posts). A user without posts gets none."""
    users = [u for u, posts in posts_by_user.items() if posts]
    texts = [t for u in users for t in posts_by_user[u]]
    if not texts:
        return {}
    vectors = embed_personas(texts, embedder)
    out, start = {}, 0
    for u in users:
        end = start + len(posts_by_user[u])
        out[u] = normalize_rows(vectors[start:end].mean(axis=0, keepdims=True))[0]
        start = end
    return out


def embed_personas(texts: Sequence[str], embedder: Any) -> np.ndarray:
    """float32 ``[U, D]`` persona embeddings, each row L2-normalized so K-means and lookups work on cosine.

    Texts are embedded as given (an empty persona is allowed: it is what the model wrote); a non-string is a
    caller bug and raises ``TypeError``. The embedder's output is checked, since a wrong row count would silently
    attach vectors to the wrong users.
    """
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"persona text {i} is {type(text).__name__}, not str")
    name = embedder_name(embedder)
    vectors = np.asarray(embedder.encode(texts), dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
        raise ValueError(f"embedder {name!r} returned shape {vectors.shape} for {len(texts)} texts")
    if not np.isfinite(vectors).all():
        raise ValueError(f"embedder {name!r} returned NaN or inf")
    return normalize_rows(vectors)
