"""K-means over persona embeddings (the k user prototypes) and the explained variance that guides the choice of k."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pr_rlhf.scaling.validation import check_matrix


@dataclass(eq=False)  # arrays inside: a generated == would raise, not compare
class KMeansResult:
    centroids: np.ndarray   # float32 [k, D]
    labels: np.ndarray      # int64 [U]
    inertia: float          # sum of squared distances of the rows to their centroid


def kmeans(x: np.ndarray, k: int, seed: int = 0, n_init: int = 4, max_iter: int = 100) -> KMeansResult:
    """K-means (scikit-learn, k-means++ init, best of ``n_init``), deterministic under ``seed``."""
    # Imported here: sklearn is slow to import and only the offline build needs it.
    from sklearn.cluster import KMeans

    data = check_matrix(x, "kmeans input")
    rows = data.shape[0]
    if not isinstance(k, (int, np.integer)) or k < 1 or k > rows:
        raise ValueError(f"k must be between 1 and the number of rows ({rows}), got k={k!r}")
    model = KMeans(n_clusters=int(k), n_init=n_init, max_iter=max_iter, random_state=seed)
    labels = model.fit_predict(data)
    return KMeansResult(centroids=np.asarray(model.cluster_centers_, dtype=np.float32),
                        labels=np.asarray(labels, dtype=np.int64), inertia=float(model.inertia_))


def explained_variance(x: np.ndarray, ks: Sequence[int], seed: int = 0) -> dict[int, float]:
    """``1 - inertia / total sum of squares`` per candidate k: the elbow a user reads to choose k.

    A k above the row count cannot be fitted and is skipped (a candidate grid is usually written before the
    number of users is known). Identical rows have nothing to explain: every k gets 0.0.
    """
    data = check_matrix(x, "explained_variance input").astype(np.float64)
    total = float(((data - data.mean(axis=0, keepdims=True)) ** 2).sum()) if data.shape[0] else 0.0
    out: dict[int, float] = {}
    for k in sorted({int(k) for k in ks}):
        if k < 1:
            raise ValueError(f"candidate k must be >= 1, got {k}")
        if k > data.shape[0]:
            continue
        out[k] = 0.0 if total <= 0 else 1.0 - kmeans(data, k, seed=seed).inertia / total
    return out
