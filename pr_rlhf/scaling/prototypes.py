"""User prototypes for test-time user-based scaling (P-GenRM, "prototype" level).

Offline (:func:`build_index`): each member user's persona-analysis text (written by the generative reward model)
is embedded and L2-normalized, K-means groups the users into k prototypes, and a small model
(:class:`PrototypeRefiner`) optionally refines the prototype vectors on the users' preference histories. The
result, a :class:`PrototypeIndex`, is saved as ``prototypes.safetensors`` (arrays) + ``prototypes.json``
(manifest). Online: the current user's persona embedding picks its nearest prototype, and that prototype's n most
similar members are the "neighbours" whose histories then score the current pair (done in
:mod:`pr_rlhf.scaling.scorer`, not here).

Refinement, following the paper: a history triple (query h, chosen r+, rejected r-) is encoded as
``o = tanh(W_o [h ; r+ - r-])``; a user's summary ``s`` is an attention over its history items with logits
``o_j . (a_p + W_q q)`` (a_p: the user's prototype, q: the current query); ``z = a_p + W_q q + W_s s`` scores the
current pair by ``-log sigmoid(z . r+ - z . r-)``. Two regularizers are added to that loss: the prototypes stay
near their K-means centroids (``mean_p ||a_p - c_p||^2``), and the summary computed over the first t history items
changes smoothly with t (``mean_t ||s_t - s_{t-1}||^2``).

Model output and user input are never trusted: shapes, finiteness and ids are checked at every boundary, and a
saved index is validated against its manifest when loaded.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from pr_rlhf.configs.base import StrictModel

FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = (1,)
TENSORS_FILE = "prototypes.safetensors"
MANIFEST_FILE = "prototypes.json"
_REFINER_PREFIX = "refiner."   # refiner weights live beside the index arrays in the one safetensors file
_EPS = 1e-12


def embedder_name(embedder: Any) -> str:
    """The embedder's identifying name; a plain object without ``.name`` is named by its class."""
    return str(getattr(embedder, "name", type(embedder).__name__))


def _normalize_rows(x: np.ndarray) -> np.ndarray:
    # A zero row (e.g. an encoder that maps empty text to zeros) stays zero instead of becoming NaN.
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, _EPS)).astype(np.float32)


def _check_matrix(x: Any, what: str, dim: int | None = None) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim != 2:
        raise ValueError(f"{what} must be a 2-D array, got shape {arr.shape}")
    if dim is not None and arr.shape[1] != dim:
        raise ValueError(f"{what} has {arr.shape[1]} columns, expected {dim}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{what} contains NaN or inf")
    return arr


def _check_unique(ids: Sequence[str], what: str = "user id") -> None:
    for uid in ids:
        if not isinstance(uid, str):
            raise TypeError(f"{what}s must be strings, got {type(uid).__name__} ({uid!r})")
    dupes = [uid for uid, count in Counter(ids).items() if count > 1]
    if dupes:
        raise ValueError(f"duplicate {what} {dupes[0]!r}" + (f" (and {len(dupes) - 1} more)" if len(dupes) > 1 else ""))


# --------------------------------------------------------------------------------------------------------------
# Embedding and clustering
# --------------------------------------------------------------------------------------------------------------

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
    return _normalize_rows(vectors)


@dataclass(eq=False)  # arrays inside: a generated == would raise, not compare
class KMeansResult:
    centroids: np.ndarray   # float32 [k, D]
    labels: np.ndarray      # int64 [U]
    inertia: float          # sum of squared distances of the rows to their centroid


def kmeans(x: np.ndarray, k: int, seed: int = 0, n_init: int = 4, max_iter: int = 100) -> KMeansResult:
    """K-means (scikit-learn, k-means++ init, best of ``n_init``), deterministic under ``seed``."""
    # Imported here: sklearn is slow to import and only the offline build needs it.
    from sklearn.cluster import KMeans

    data = _check_matrix(x, "kmeans input")
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
    data = _check_matrix(x, "explained_variance input").astype(np.float64)
    total = float(((data - data.mean(axis=0, keepdims=True)) ** 2).sum()) if data.shape[0] else 0.0
    out: dict[int, float] = {}
    for k in sorted({int(k) for k in ks}):
        if k < 1:
            raise ValueError(f"candidate k must be >= 1, got {k}")
        if k > data.shape[0]:
            continue
        out[k] = 0.0 if total <= 0 else 1.0 - kmeans(data, k, seed=seed).inertia / total
    return out


# --------------------------------------------------------------------------------------------------------------
# Refinement
# --------------------------------------------------------------------------------------------------------------

class RefineConfig(StrictModel):
    """How the prototypes are refined on the member users' histories."""

    steps: int = Field(200, ge=0, description="optimizer steps (0: the K-means centroids as they are)")
    lr: float = Field(1e-2, gt=0)
    batch_size: int = Field(32, ge=1, description="(user, current item) examples per step")
    centroid_coef: float = Field(0.1, ge=0, description="weight of mean_p ||a_p - c_p||^2")
    smooth_coef: float = Field(0.1, ge=0, description="weight of mean_t ||s_t - s_{t-1}||^2")
    seed: int = 0
    max_history: int = Field(32, ge=1, description="most recent history items attended to: the prefix summaries "
                                                   "cost O(T^2 D) per example, so long histories are capped")


@dataclass(eq=False)
class UserHistory:
    """One member user's preference history, in time order: query, chosen and rejected response embeddings."""

    user_id: str
    h: np.ndarray        # [T, D]
    r_plus: np.ndarray   # [T, D]
    r_minus: np.ndarray  # [T, D]

    def __post_init__(self) -> None:
        if not isinstance(self.user_id, str):
            raise TypeError(f"user_id must be a string, got {type(self.user_id).__name__}")
        self.h = _check_matrix(self.h, f"history of {self.user_id!r}: h")
        self.r_plus = _check_matrix(self.r_plus, f"history of {self.user_id!r}: r_plus", self.h.shape[1])
        self.r_minus = _check_matrix(self.r_minus, f"history of {self.user_id!r}: r_minus", self.h.shape[1])
        if not (self.h.shape[0] == self.r_plus.shape[0] == self.r_minus.shape[0]):
            raise ValueError(f"history of {self.user_id!r}: h, r_plus, r_minus have {self.h.shape[0]}, "
                             f"{self.r_plus.shape[0]}, {self.r_minus.shape[0]} rows")

    def __len__(self) -> int:
        return int(self.h.shape[0])


@dataclass(eq=False)
class RefineBatch:
    """Examples padded to one history length L; ``mask[:, 0]`` is always True (every example has history)."""

    proto: torch.Tensor       # long [B]
    q: torch.Tensor           # [B, D] current query
    r_plus: torch.Tensor      # [B, D]
    r_minus: torch.Tensor     # [B, D]
    hist_h: torch.Tensor      # [B, L, D]
    hist_plus: torch.Tensor   # [B, L, D]
    hist_minus: torch.Tensor  # [B, L, D]
    mask: torch.Tensor        # bool [B, L], left-aligned


class PrototypeRefiner(nn.Module):
    """Learnable prototypes ``a_p`` (initialised to the K-means centroids ``c_p``, kept as a buffer) and the
    history encoder of the paper. ``seed`` makes the linear layers' init independent of the global RNG state."""

    def __init__(self, dim: int, k: int, init_centroids: np.ndarray | torch.Tensor, *, seed: int | None = None):
        super().__init__()
        centroids = torch.as_tensor(np.asarray(init_centroids, dtype=np.float32))
        if tuple(centroids.shape) != (k, dim):
            raise ValueError(f"init_centroids has shape {tuple(centroids.shape)}, expected ({k}, {dim})")
        self.dim, self.k = int(dim), int(k)
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            self.w_o = nn.Linear(2 * dim, dim)
            # No bias on W_q / W_s: a_p already is the per-prototype offset of z.
            self.w_q = nn.Linear(dim, dim, bias=False)
            self.w_s = nn.Linear(dim, dim, bias=False)
        self.prototypes = nn.Parameter(centroids.clone())
        self.register_buffer("centroids", centroids.clone())

    def encode_items(self, h: torch.Tensor, r_plus: torch.Tensor, r_minus: torch.Tensor) -> torch.Tensor:
        """``o = tanh(W_o [h ; r+ - r-])``: the difference carries what the user preferred, h its context."""
        return torch.tanh(self.w_o(torch.cat([h, r_plus - r_minus], dim=-1)))

    def prefix_summaries(self, o: torch.Tensor, mask: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """``[B, L, D]``: row t is the attention summary over the first t+1 history items.

        All prefixes at once (a lower-triangular mask) because both the pairwise loss (the full prefix) and the
        temporal-smoothness term (consecutive prefixes) need them; a prefix past an example's length equals its
        full summary, so padding adds zero change.
        """
        logits = torch.einsum("bld,bd->bl", o, anchor)
        length = o.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=o.device).tril()
        valid = causal.unsqueeze(0) & mask.unsqueeze(1)   # [B, prefix, item]
        weights = torch.softmax(logits.unsqueeze(1).masked_fill(~valid, float("-inf")), dim=-1)
        return weights @ o

    def centroid_penalty(self) -> torch.Tensor:
        """``mean_p ||a_p - c_p||^2``: keeps refined prototypes interpretable as cluster centres."""
        return ((self.prototypes - self.centroids) ** 2).sum(dim=-1).mean()

    def forward(self, batch: RefineBatch) -> dict[str, torch.Tensor]:
        """Per-example ``margin`` (z . r+ - z . r-) and ``pairwise`` loss, the user vector ``z``, and the squared
        summary changes ``smooth_sq`` [B, L-1] with their validity mask ``smooth_mask``."""
        if not bool(batch.mask[:, 0].all()):
            raise ValueError("every example needs at least one history item")
        o = self.encode_items(batch.hist_h, batch.hist_plus, batch.hist_minus)
        anchor = self.prototypes[batch.proto] + self.w_q(batch.q)
        summaries = self.prefix_summaries(o, batch.mask, anchor)
        z = anchor + self.w_s(summaries[:, -1])
        margin = (z * (batch.r_plus - batch.r_minus)).sum(dim=-1)
        return {
            "margin": margin,
            "pairwise": F.softplus(-margin),   # = -log sigmoid(margin), without its underflow for large margins
            "z": z,
            "smooth_sq": ((summaries[:, 1:] - summaries[:, :-1]) ** 2).sum(dim=-1),
            "smooth_mask": batch.mask[:, 1:],
        }


@dataclass
class _UserTensors:
    proto: int
    h: torch.Tensor
    r_plus: torch.Tensor
    r_minus: torch.Tensor


def _resolve_assignments(users: Sequence[UserHistory], assignments: Sequence[int] | np.ndarray | Mapping[str, int],
                         k: int) -> list[int]:
    if isinstance(assignments, Mapping):
        missing = [u.user_id for u in users if u.user_id not in assignments]
        if missing:
            raise ValueError(f"no prototype assignment for user {missing[0]!r}")
        protos = [int(assignments[u.user_id]) for u in users]
    else:
        protos = [int(a) for a in np.asarray(assignments).reshape(-1)]
        if len(protos) != len(users):
            raise ValueError(f"{len(protos)} assignments for {len(users)} users")
    for user, p in zip(users, protos):
        if not 0 <= p < k:
            raise ValueError(f"user {user.user_id!r} is assigned prototype {p}, outside [0, {k})")
    return protos


def _prepare(refiner: PrototypeRefiner, users: Sequence[UserHistory],
             assignments: Sequence[int] | np.ndarray | Mapping[str, int]) -> list[_UserTensors]:
    _check_unique([u.user_id for u in users])
    for user in users:
        if user.h.shape[1] != refiner.dim:
            raise ValueError(f"history of {user.user_id!r} has dim {user.h.shape[1]}, the refiner {refiner.dim}")
    protos = _resolve_assignments(users, assignments, refiner.k)
    return [_UserTensors(p, torch.from_numpy(u.h), torch.from_numpy(u.r_plus), torch.from_numpy(u.r_minus))
            for u, p in zip(users, protos)]


def _examples(data: Sequence[_UserTensors]) -> list[tuple[int, int]]:
    # Each item t >= 1 is a "current" pair with the items before it as history; a user with < 2 items has none.
    return [(u, t) for u, user in enumerate(data) for t in range(1, user.h.shape[0])]


def _collate(data: Sequence[_UserTensors], examples: Sequence[tuple[int, int]], max_history: int) -> RefineBatch:
    spans = [(u, t, max(0, t - max_history)) for u, t in examples]
    length = max(t - lo for _, t, lo in spans)
    dim = data[0].h.shape[1]
    hist = torch.zeros(3, len(spans), length, dim)
    mask = torch.zeros(len(spans), length, dtype=torch.bool)
    for row, (u, t, lo) in enumerate(spans):
        user = data[u]
        for j, part in enumerate((user.h, user.r_plus, user.r_minus)):
            hist[j, row, : t - lo] = part[lo:t]
        mask[row, : t - lo] = True
    return RefineBatch(
        proto=torch.tensor([data[u].proto for u, _, _ in spans], dtype=torch.long),
        q=torch.stack([data[u].h[t] for u, t, _ in spans]),
        r_plus=torch.stack([data[u].r_plus[t] for u, t, _ in spans]),
        r_minus=torch.stack([data[u].r_minus[t] for u, t, _ in spans]),
        hist_h=hist[0], hist_plus=hist[1], hist_minus=hist[2], mask=mask,
    )


def _smooth_mean(out: Mapping[str, torch.Tensor]) -> torch.Tensor:
    mask = out["smooth_mask"].to(out["smooth_sq"].dtype)
    return (out["smooth_sq"] * mask).sum() / mask.sum().clamp(min=1.0)


def refine(refiner: PrototypeRefiner, users: Sequence[UserHistory],
           assignments: Sequence[int] | np.ndarray | Mapping[str, int], cfg: RefineConfig) -> list[dict[str, float]]:
    """Train ``refiner`` in place; per-step metrics ``{step, loss, pairwise, centroid, smooth}`` (unweighted terms).

    ``assignments``: the prototype of each user, aligned with ``users`` or keyed by user id. Batches are drawn
    with a generator seeded by ``cfg.seed`` (the refiner's init is seeded where it is built), so a run repeats.
    """
    data = _prepare(refiner, users, assignments)
    examples = _examples(data)
    if cfg.steps == 0:
        return []
    if not examples:
        raise ValueError("no training examples: every user has fewer than 2 history items")
    generator = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.Adam(refiner.parameters(), lr=cfg.lr)
    batch_size = min(cfg.batch_size, len(examples))
    metrics: list[dict[str, float]] = []
    refiner.train()
    for step in range(cfg.steps):
        pick = torch.randperm(len(examples), generator=generator)[:batch_size].tolist()
        out = refiner(_collate(data, [examples[i] for i in pick], cfg.max_history))
        pairwise, smooth, centroid = out["pairwise"].mean(), _smooth_mean(out), refiner.centroid_penalty()
        loss = pairwise + cfg.centroid_coef * centroid + cfg.smooth_coef * smooth
        if not torch.isfinite(loss):
            raise FloatingPointError(f"refinement loss is {loss.item()} at step {step}; lower lr")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        metrics.append({"step": step, "loss": loss.item(), "pairwise": pairwise.item(),
                        "centroid": centroid.item(), "smooth": smooth.item()})
    refiner.eval()
    return metrics


@torch.no_grad()
def evaluate_refiner(refiner: PrototypeRefiner, users: Sequence[UserHistory],
                     assignments: Sequence[int] | np.ndarray | Mapping[str, int], max_history: int = 32,
                     batch_size: int = 256) -> dict[str, float]:
    """The unweighted terms over ALL examples (not one noisy batch): ``pairwise`` (mean), ``smooth`` (mean over
    every consecutive-prefix pair), ``centroid``, ``accuracy`` (margin > 0) and ``examples``."""
    data = _prepare(refiner, users, assignments)
    examples = _examples(data)
    was_training = refiner.training
    refiner.eval()
    pair_sum = smooth_sum = smooth_count = correct = 0.0
    for start in range(0, len(examples), batch_size):
        out = refiner(_collate(data, examples[start:start + batch_size], max_history))
        pair_sum += out["pairwise"].sum().item()
        correct += (out["margin"] > 0).sum().item()
        smooth_sum += (out["smooth_sq"] * out["smooth_mask"]).sum().item()
        smooth_count += out["smooth_mask"].sum().item()
    refiner.train(was_training)
    n = max(len(examples), 1)
    return {"pairwise": pair_sum / n, "smooth": smooth_sum / max(smooth_count, 1.0),
            "centroid": refiner.centroid_penalty().item(), "accuracy": correct / n, "examples": float(len(examples))}


# --------------------------------------------------------------------------------------------------------------
# The index: artifacts and online lookup
# --------------------------------------------------------------------------------------------------------------

def _atomic_write(path: Path, write: Callable[[str], None]) -> None:
    # A crash mid-save must not leave a torn file that the next run would load.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(eq=False)
class PrototypeIndex:
    """Everything the online lookup needs, in row order of ``user_ids``.

    ``prototypes`` equal ``centroids`` when not refined; ``labels`` are the K-means assignments (membership is
    never recomputed from the refined prototypes, so a neighbour set matches the clustering the user inspected).
    """

    embedder: str
    k: int
    dim: int
    centroids: np.ndarray                 # float32 [k, D]
    prototypes: np.ndarray                # float32 [k, D]
    user_ids: list[str]
    embeddings: np.ndarray                # float32 [U, D], L2-normalized persona embeddings
    labels: np.ndarray                    # int64 [U]
    fingerprint: str | None = None
    refiner_state: dict[str, torch.Tensor] | None = None
    refine_config: dict[str, Any] | None = None
    created: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.embedder, str) or not self.embedder:
            raise ValueError(f"embedder name must be a non-empty string, got {self.embedder!r}")
        self.k, self.dim = int(self.k), int(self.dim)
        if self.k < 1 or self.dim < 1:
            raise ValueError(f"k and dim must be >= 1, got k={self.k}, dim={self.dim}")
        self.user_ids = list(self.user_ids)
        _check_unique(self.user_ids)
        self.centroids = _check_matrix(self.centroids, "centroids", self.dim)
        self.prototypes = _check_matrix(self.prototypes, "prototypes", self.dim)
        self.embeddings = _check_matrix(self.embeddings, "embeddings", self.dim)
        self.labels = np.asarray(self.labels).astype(np.int64).reshape(-1)
        for name, rows in (("centroids", self.centroids.shape[0]), ("prototypes", self.prototypes.shape[0])):
            if rows != self.k:
                raise ValueError(f"{name} has {rows} rows for k={self.k}")
        if self.embeddings.shape[0] != len(self.user_ids) or self.labels.shape[0] != len(self.user_ids):
            raise ValueError(f"{len(self.user_ids)} user ids but {self.embeddings.shape[0]} embedding rows and "
                             f"{self.labels.shape[0]} labels")
        if self.labels.size and (self.labels.min() < 0 or self.labels.max() >= self.k):
            raise ValueError(f"labels must lie in [0, {self.k})")

    @property
    def refined(self) -> bool:
        return self.refiner_state is not None

    # ---------------------------------------------------------------- online lookup

    def _query(self, persona_vec: np.ndarray) -> np.ndarray:
        vec = np.asarray(persona_vec, dtype=np.float64).reshape(-1)
        if vec.shape[0] != self.dim:
            raise ValueError(f"persona vector has {vec.shape[0]} values, the index dim is {self.dim}")
        if not np.isfinite(vec).all():
            raise ValueError("persona vector contains NaN or inf")
        return vec / max(float(np.linalg.norm(vec)), _EPS)

    @staticmethod
    def _cosines(rows: np.ndarray, unit_vec: np.ndarray) -> np.ndarray:
        # float64 and an elementwise row sum (not BLAS gemv): identical rows get bit-identical scores, so ties
        # really are ties and the user-id tie-break decides.
        rows = rows.astype(np.float64)
        norms = np.maximum(np.linalg.norm(rows, axis=1), _EPS)
        return (rows * unit_vec).sum(axis=1) / norms

    def nearest_prototype(self, persona_vec: np.ndarray) -> int:
        """The prototype (refined) with the highest cosine to ``persona_vec``; ties go to the lowest id."""
        return int(np.argmax(self._cosines(self.prototypes, self._query(persona_vec))))

    def neighbours(self, persona_vec: np.ndarray, n: int, exclude: str | None = None) -> list[tuple[str, float]]:
        """Up to n ``(user id, cosine)`` members of the nearest prototype, most similar first, ties by user id;
        ``exclude`` (the current user) is never returned."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        vec = self._query(persona_vec)
        if n == 0:
            return []
        members = np.flatnonzero(self.labels == self.nearest_prototype(vec))
        sims = self._cosines(self.embeddings[members], vec)
        ranked = sorted(((self.user_ids[i], float(s)) for i, s in zip(members, sims) if self.user_ids[i] != exclude),
                        key=lambda item: (-item[1], item[0]))
        return ranked[:n]

    # ---------------------------------------------------------------- artifacts

    def _manifest(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "embedder": self.embedder, "fingerprint": self.fingerprint,
                "k": self.k, "dim": self.dim, "user_ids": self.user_ids, "refined": self.refined,
                "refine_config": self.refine_config, "created": self.created}

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``prototypes.safetensors`` then ``prototypes.json`` (each atomically); returns the directory."""
        from safetensors.torch import save_file

        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {name: torch.from_numpy(np.ascontiguousarray(arr)) for name, arr in (
            ("centroids", self.centroids), ("prototypes", self.prototypes),
            ("embeddings", self.embeddings), ("labels", self.labels))}
        for name, tensor in (self.refiner_state or {}).items():
            tensors[_REFINER_PREFIX + name] = tensor.detach().cpu().contiguous()
        _atomic_write(folder / TENSORS_FILE,
                      lambda tmp: save_file(tensors, tmp, metadata={"format_version": str(FORMAT_VERSION)}))
        manifest = json.dumps(self._manifest(), indent=1, sort_keys=True)
        _atomic_write(folder / MANIFEST_FILE, lambda tmp: Path(tmp).write_text(manifest, encoding="utf-8"))
        return folder

    @classmethod
    def load(cls, directory: str | os.PathLike, expected_embedder: str | None = None) -> PrototypeIndex:
        """Read and validate a saved index. ``expected_embedder``: the name of the embedder that will embed the
        online personas; vectors from another model would land at meaningless places, so a mismatch is an error."""
        from safetensors.torch import load_file

        folder = Path(directory)
        manifest_path, tensors_path = folder / MANIFEST_FILE, folder / TENSORS_FILE
        for path in (manifest_path, tensors_path):
            if not path.is_file():
                raise FileNotFoundError(f"prototype index file not found: {path}")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{manifest_path}: not valid JSON ({err})") from err
        if not isinstance(manifest, dict):
            raise ValueError(f"{manifest_path}: expected a JSON object")  # noqa: TRY004 -- a bad file, not a bad arg
        version = manifest.get("format_version")
        if version not in SUPPORTED_FORMAT_VERSIONS:
            raise ValueError(f"{manifest_path}: unknown format_version {version!r} (supported: "
                             f"{list(SUPPORTED_FORMAT_VERSIONS)})")
        missing = [key for key in ("embedder", "k", "dim", "user_ids", "refined") if key not in manifest]
        if missing:
            raise ValueError(f"{manifest_path}: missing fields {missing}")
        if expected_embedder is not None and manifest["embedder"] != expected_embedder:
            raise ValueError(f"{manifest_path}: built with embedder {manifest['embedder']!r}, but the expected "
                             f"embedder is {expected_embedder!r}; rebuild the index with that embedder")
        try:
            tensors = load_file(str(tensors_path))
        except Exception as err:  # safetensors raises its own error type for a torn or foreign file
            raise ValueError(f"{tensors_path}: not a readable safetensors file ({err})") from err
        k, dim, user_ids = manifest["k"], manifest["dim"], manifest["user_ids"]
        if not isinstance(user_ids, list):
            raise ValueError(f"{manifest_path}: user_ids must be a list")  # noqa: TRY004 -- a bad file, not a bad arg
        expected = {"centroids": (k, dim), "prototypes": (k, dim), "embeddings": (len(user_ids), dim),
                    "labels": (len(user_ids),)}
        for name, shape in expected.items():
            if name not in tensors:
                raise ValueError(f"{tensors_path}: no tensor {name!r}")
            if tuple(tensors[name].shape) != shape:
                raise ValueError(f"{tensors_path}: {name} has shape {tuple(tensors[name].shape)} but "
                                 f"{manifest_path} implies {shape} (k={k}, dim={dim}, {len(user_ids)} user ids)")
        state = {name[len(_REFINER_PREFIX):]: t for name, t in tensors.items() if name.startswith(_REFINER_PREFIX)}
        if bool(manifest["refined"]) != bool(state):
            raise ValueError(f"{manifest_path}: refined={manifest['refined']} but {tensors_path} "
                             f"{'has' if state else 'has no'} refiner weights")
        try:
            return cls(embedder=manifest["embedder"], k=k, dim=dim, centroids=tensors["centroids"].numpy(),
                       prototypes=tensors["prototypes"].numpy(), user_ids=user_ids,
                       embeddings=tensors["embeddings"].numpy(), labels=tensors["labels"].numpy(),
                       fingerprint=manifest.get("fingerprint"), refiner_state=state or None,
                       refine_config=manifest.get("refine_config"), created=manifest.get("created") or {})
        except (TypeError, ValueError) as err:
            raise ValueError(f"{manifest_path}: {err}") from err


def nearest_rows(vectors: np.ndarray, prototypes: np.ndarray) -> np.ndarray:
    """For each row, the prototype with the highest cosine (ties to the lowest id), as PrototypeIndex does."""
    protos = prototypes / np.maximum(np.linalg.norm(prototypes, axis=1, keepdims=True), 1e-12)
    rows = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return np.argmax(rows @ protos.T, axis=1).astype(np.int64)


def build_index(user_ids: Sequence[str], persona_texts: Sequence[str], embedder: Any, k: int, seed: int = 0,
                histories: Sequence[UserHistory] | None = None, refine_cfg: RefineConfig | None = None, *,
                fingerprint: str | None = None) -> PrototypeIndex:
    """Embed the personas, K-means them into k prototypes and, given both ``histories`` and ``refine_cfg``,
    refine the prototypes on those histories (members without a history just do not train).

    Passing only one of the two is an error rather than a silent unrefined index. ``fingerprint`` defaults to the
    embedder's ``fingerprint`` attribute when it has one.
    """
    user_ids = list(user_ids)
    persona_texts = list(persona_texts)
    if len(user_ids) != len(persona_texts):
        raise ValueError(f"{len(user_ids)} user ids but {len(persona_texts)} persona texts")
    _check_unique(user_ids)
    if (histories is None) != (refine_cfg is None):
        raise ValueError("refinement needs both histories and refine_cfg (pass neither for K-means only)")
    embeddings = embed_personas(persona_texts, embedder)
    clusters = kmeans(embeddings, k, seed=seed)
    dim = int(embeddings.shape[1])
    prototypes, state, cfg_dump = clusters.centroids.copy(), None, None
    labels, kept = clusters.labels, 1.0
    if histories is not None and refine_cfg is not None:
        histories = list(histories)
        _check_unique([h.user_id for h in histories], "history user id")
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
               "kmeans_label_kept": kept}
    return PrototypeIndex(embedder=embedder_name(embedder), k=k, dim=dim, centroids=clusters.centroids,
                          prototypes=prototypes, user_ids=user_ids, embeddings=embeddings, labels=labels,
                          fingerprint=fingerprint, refiner_state=state, refine_config=cfg_dump, created=created)


__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "TENSORS_FILE",
    "KMeansResult",
    "PrototypeIndex",
    "PrototypeRefiner",
    "RefineBatch",
    "RefineConfig",
    "UserHistory",
    "build_index",
    "embed_personas",
    "embedder_name",
    "evaluate_refiner",
    "explained_variance",
    "kmeans",
    "refine",
]
