"""What one learner update accumulates on a rank (loss terms, token-weighted statistics, step outcomes) and the
metrics it reports once the ranks' sums are added up. Pure (no Ray, no process group): the learner does the
reduction."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from pr_rlhf.rl.objectives import MicroLoss

TOKENS = "_tokens"  # the token count behind the token-weighted statistics


@dataclass
class UpdateLog:
    """One update call on this rank: loss-term sums, token-weighted stat sums, gradient norms, step outcomes."""

    losses: dict[str, float]
    epochs: int = 1                                    # passes over the data (num_tokens is per pass)
    sums: dict[str, float] = field(default_factory=dict)
    norms: list[float] = field(default_factory=list)
    post_norms: list[float] = field(default_factory=list)
    steps: int = 0
    skipped: int = 0

    @classmethod
    def of(cls, terms: Iterable[str], epochs: int = 1) -> UpdateLog:
        return cls({name: 0.0 for name in terms}, epochs=epochs)

    def add(self, mask: torch.Tensor, micro: MicroLoss) -> None:
        """A micro-batch's loss terms and statistics (means over its tokens, weighted by their count; plain sums)."""
        for k, v in micro.terms.items():
            self.losses[k] += v
        w = float(mask.sum())
        for k, v in micro.token_means.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v) * w
        for k, v in micro.token_sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.sums[TOKENS] = self.sums.get(TOKENS, 0.0) + w

    def record_step(self, norm: float, post: float, stepped: bool) -> None:
        self.norms.append(norm)
        self.post_norms.append(post)
        self.steps += int(stepped)
        self.skipped += int(not stepped)

    def metrics(self, prefix: str, stat_totals: Mapping[str, float], loss_totals: Mapping[str, float],
                world_size: int, lr: float, elapsed_s: float) -> dict[str, float]:
        """The update's metrics (keys ``prefix/...``) from the sums over all ranks of ``sums`` (``stat_totals``,
        holding ``_tokens``) and of ``losses`` (``loss_totals``): identical on every rank."""
        tokens = stat_totals.get(TOKENS, 0.0)
        n_updates = max(1, len(self.norms))
        out: dict[str, float] = {}
        for name, total in stat_totals.items():
            if name != TOKENS:
                out[f"{prefix}/{name}"] = total / tokens if tokens else 0.0
        for name, total in loss_totals.items():
            # each micro-batch loss is (global normalizer) x dp_size: the sum over ranks / dp is the global loss
            out[f"{prefix}/{name}"] = total / world_size / n_updates
        finite = [n for n in self.norms if math.isfinite(n)]
        out[f"{prefix}/grad_norm"] = float(np.mean(finite)) if finite else float("nan") if self.norms else 0.0
        out[f"{prefix}/grad_norm_max"] = max(finite) if finite else 0.0
        out[f"{prefix}/grad_norm_post_clip"] = max((p for p in self.post_norms if math.isfinite(p)), default=0.0)
        out[f"{prefix}/lr"] = lr
        out[f"{prefix}/optimizer_steps"] = float(self.steps)
        out[f"{prefix}/skipped_steps"] = float(self.skipped)
        out[f"{prefix}/num_tokens"] = tokens / self.epochs
        out[f"{prefix}/update_time_s"] = elapsed_s
        return out
