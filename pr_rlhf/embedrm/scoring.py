"""Scoring with a trained embedding reward model: texts embedded once each, every user's state built once per set of
history pairs (a seen user's learned state, or one inferred from the pairs, or the prior)."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pr_rlhf.embedrm.methods import Context, EmbeddingRM
from pr_rlhf.embedrm.train import EmbeddingDataError, load_method


def pair_text(question: str, response: str) -> str:
    """What the encoder reads of one response: the question it answers, then the response."""
    return f"{question}\n\n{response}"


@dataclass
class ScoreItem:
    user_id: str
    question: str
    response: str
    history: list[dict] = field(default_factory=list)   # [{question, chosen, rejected}], oldest first


class EmbeddingRewarder:
    """``rewards(items)``: one float per item from the model in ``folder`` (its method must be ``kind`` when
    given)."""

    def __init__(self, folder: str, *, embedder: Any = "minilm", kind: str | None = None, history_pairs: int = 8,
                 adapt_steps: int = 200) -> None:
        self.model, self.config = load_method(folder)
        if kind is not None and self.config["method"] != kind:
            raise EmbeddingDataError(f"{folder}: a trained {self.config['method']!r} model, but the reward kind is "
                                     f"{kind!r}")
        if isinstance(embedder, str):
            from pr_rlhf.models.embedders import make_embedder

            embedder = make_embedder(embedder)
        self.embedder = embedder
        self.history_pairs = history_pairs
        if hasattr(self.model, "adapt_steps"):
            self.model.adapt_steps = adapt_steps
        self._states: dict[tuple[str, str], Any] = {}
        self.states_built = 0

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        vectors = np.asarray(self.embedder.encode(list(texts)), dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.model.dim:
            raise EmbeddingDataError(f"the encoder gives {vectors.shape[1:]} vectors; the model was trained on "
                                     f"{self.model.dim}-d ones ({self.config.get('embedder', 'its encoder')})")
        return torch.from_numpy(vectors)

    def read_history(self, history: Sequence[dict]) -> list[dict]:
        """The history pairs the state reads (the most recent ``history_pairs``), each checked."""
        pairs = list(history)[-self.history_pairs:] if self.history_pairs else []
        for i, h in enumerate(pairs):
            missing = [k for k in ("question", "chosen", "rejected") if not isinstance(h.get(k), str)]
            if missing:
                raise EmbeddingDataError(f"history pair {i}: field {missing[0]!r} missing or not text")
        return pairs

    def context(self, history: Sequence[dict]) -> Context | None:
        pairs = self.read_history(history)
        if not pairs:
            return None
        vectors = self.embed([pair_text(h["question"], h[side]) for side in ("chosen", "rejected") for h in pairs])
        return Context(vectors[:len(pairs)], vectors[len(pairs):])

    def state(self, user_id: str, history: Sequence[dict]) -> Any:
        key = (user_id, hashlib.sha256(json.dumps(list(history)[-self.history_pairs:] if self.history_pairs else [],
                                                  sort_keys=True).encode()).hexdigest())
        if key not in self._states:
            model: EmbeddingRM = self.model
            known = user_id in model.user_index and not model.reads_context
            context = None if known else self.context(history)
            state = model.state(user_id if known else None, context)
            self._states[key] = state.detach() if isinstance(state, torch.Tensor) else state
            self.states_built += 1
        return self._states[key]

    def rewards(self, items: Sequence[ScoreItem]) -> list[float]:
        if not items:
            return []
        x = self.embed([pair_text(it.question, it.response) for it in items])
        out = [0.0] * len(items)
        by_user: dict[tuple[str, str], list[int]] = {}
        for i, it in enumerate(items):
            by_user.setdefault((it.user_id, json.dumps(it.history, sort_keys=True)), []).append(i)
        for (user, _), rows in by_user.items():
            state = self.state(user, items[rows[0]].history)
            with torch.no_grad():
                values = self.model.reward(x[rows], state)
            for i, v in zip(rows, values.tolist()):
                out[i] = float(v)
        return out
