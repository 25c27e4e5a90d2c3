"""The prototype index: everything the online lookup needs (a persona embedding picks its nearest prototype, and
that prototype's n most similar members are the "neighbours" whose histories then score the current pair, in
:mod:`pr_rlhf.scaling.scorer`), saved as ``prototypes.safetensors`` (arrays) + ``prototypes.json`` (manifest) and
validated against its manifest when loaded."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pr_rlhf.files import atomic_write, atomic_write_text
from pr_rlhf.scaling.validation import EPS, check_matrix, check_unique

FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = (1,)
TENSORS_FILE = "prototypes.safetensors"
MANIFEST_FILE = "prototypes.json"
_REFINER_PREFIX = "refiner."   # refiner weights live beside the index arrays in the one safetensors file


@dataclass(eq=False)
class PrototypeIndex:
    """Everything the online lookup needs, in row order of ``user_ids``.

    ``prototypes`` equal ``centroids`` when not refined; ``labels`` are each member's prototype: its K-means
    assignment, or after refinement its nearest refined prototype (how the online lookup places a persona, so a
    member's own persona finds its own cluster).
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
        check_unique(self.user_ids)
        self.centroids = check_matrix(self.centroids, "centroids", self.dim)
        self.prototypes = check_matrix(self.prototypes, "prototypes", self.dim)
        self.embeddings = check_matrix(self.embeddings, "embeddings", self.dim)
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
        return vec / max(float(np.linalg.norm(vec)), EPS)

    @staticmethod
    def _cosines(rows: np.ndarray, unit_vec: np.ndarray) -> np.ndarray:
        # float64 and an elementwise row sum (not BLAS gemv): identical rows get bit-identical scores, so ties
        # really are ties and the user-id tie-break decides.
        rows = rows.astype(np.float64)
        norms = np.maximum(np.linalg.norm(rows, axis=1), EPS)
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
        # each file atomically: a crash mid-save must not leave a torn file that the next run would load
        atomic_write(folder / TENSORS_FILE,
                     lambda tmp: save_file(tensors, tmp, metadata={"format_version": str(FORMAT_VERSION)}))
        atomic_write_text(folder / MANIFEST_FILE, json.dumps(self._manifest(), indent=1, sort_keys=True))
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
