"""Persona embeddings: each member user's persona-analysis text (written by the generative reward model) embedded
and L2-normalized, so K-means and the online lookup work on cosine."""
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
