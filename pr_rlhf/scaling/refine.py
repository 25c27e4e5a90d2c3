"""Prototype refinement on the member users' preference histories (P-GenRM, "prototype" level).

Following the paper, a history triple (query h, chosen r+, rejected r-) is encoded as
``o = tanh(W_o [h ; r+ - r-])``; a user's summary ``s`` is an attention over its history items with logits
``o_j . (a_p + W_q q)`` (a_p: the user's prototype, q: the current query); ``z = a_p + W_q q + W_s s`` scores the
current pair by ``-log sigmoid(z . r+ - z . r-)``. Two regularizers are added to that loss: the prototypes stay
near their K-means centroids (``mean_p ||a_p - c_p||^2``), and the summary computed over the first t history items
changes smoothly with t (``mean_t ||s_t - s_{t-1}||^2``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pr_rlhf.configs.scaling import RefineConfig
from pr_rlhf.scaling.validation import check_matrix, check_unique


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
        self.h = check_matrix(self.h, f"history of {self.user_id!r}: h")
        self.r_plus = check_matrix(self.r_plus, f"history of {self.user_id!r}: r_plus", self.h.shape[1])
        self.r_minus = check_matrix(self.r_minus, f"history of {self.user_id!r}: r_minus", self.h.shape[1])
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
    check_unique([u.user_id for u in users])
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
