"""Training the embedding reward models (:mod:`pr_rlhf.embedrm.methods`) on users' pairs, deterministic under a
seed, and saving / loading them (a folder: ``config.json`` + ``model.safetensors``).

- ``bt_embedding``, ``pal``, ``lore`` learn from mini-batches of pairs: the global reward, or each seen user's
  weights and the shared prototypes / basis together.
- ``vpl``, ``gpo`` are meta-trained over users: each step takes some users and splits each one's pairs at random
  into a context (1 to k-1 pairs, at most ``max_context``) and targets (the rest, at most ``max_targets``); the
  loss is the Bradley-Terry likelihood of the targets given the context (VPL adds the latent's KL to its prior,
  annealed in over the first half of training).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pr_rlhf.embedrm.methods import (
    VPL,
    Context,
    EmbeddingRM,
    WeightedRM,
    build_method,
    pair_loss,
)

CONFIG, WEIGHTS = "config.json", "model.safetensors"


class EmbeddingDataError(ValueError):
    """Training or scoring input that cannot be used; the message names the user, pair or field."""


@dataclass
class PairData:
    """Users' pairs as embeddings: ``contexts[user]`` in the user's order, ``pair_ids[user]`` beside them."""

    contexts: dict[str, Context]
    pair_ids: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_arrays(cls, users: Sequence[str], pair_ids: Sequence[str], chosen: np.ndarray,
                    rejected: np.ndarray, source: str = "pairs") -> PairData:
        """Group aligned rows by user (keeping their order). Refuses a non-finite embedding or mismatched lengths,
        naming ``source`` and the pair."""
        chosen, rejected = np.asarray(chosen, dtype=np.float32), np.asarray(rejected, dtype=np.float32)
        if not (len(users) == len(pair_ids) == len(chosen) == len(rejected)):
            raise EmbeddingDataError(f"{source}: {len(users)} users, {len(pair_ids)} pair ids, {len(chosen)} chosen "
                                     f"and {len(rejected)} rejected embeddings: one each per pair")
        if chosen.ndim != 2 or chosen.shape != rejected.shape:
            raise EmbeddingDataError(f"{source}: embeddings must be [pairs, dim] alike, got {chosen.shape} and "
                                     f"{rejected.shape}")
        for name, matrix in (("chosen", chosen), ("rejected", rejected)):
            bad = np.flatnonzero(~np.isfinite(matrix).all(axis=1))
            if bad.size:
                raise EmbeddingDataError(f"{source}: pair {pair_ids[bad[0]]!r} (user {users[bad[0]]!r}): its {name} "
                                         f"embedding is not finite ({bad.size} such pairs)")
        rows: dict[str, list[int]] = {}
        for i, user in enumerate(users):
            if not user:
                raise EmbeddingDataError(f"{source}: pair {pair_ids[i]!r} has no user_id")
            rows.setdefault(str(user), []).append(i)
        contexts = {u: Context(torch.from_numpy(chosen[idx]), torch.from_numpy(rejected[idx]))
                    for u, idx in rows.items()}
        return cls(contexts, {u: [str(pair_ids[i]) for i in idx] for u, idx in rows.items()})

    @property
    def users(self) -> list[str]:
        return list(self.contexts)

    @property
    def dim(self) -> int:
        return int(next(iter(self.contexts.values())).chosen.shape[1])

    def __len__(self) -> int:
        return sum(len(c) for c in self.contexts.values())

    def flat(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(chosen, rejected, user index) over every pair."""
        users = self.users
        chosen = torch.cat([self.contexts[u].chosen for u in users])
        rejected = torch.cat([self.contexts[u].rejected for u in users])
        index = torch.cat([torch.full((len(self.contexts[u]),), i, dtype=torch.long) for i, u in enumerate(users)])
        return chosen, rejected, index


@dataclass
class TrainSettings:
    steps: int = 1000
    batch_size: int = 64          # pairs per step (bt_embedding, pal, lore)
    users_per_step: int = 16      # episodes per step (vpl, gpo)
    lr: float = 3e-3
    user_lr: float = 3e-2         # pal, lore: the seen users' weights (each sees only its own few pairs per step)
    weight_decay: float = 1e-4    # not on the users' weights (it would pull them to the uniform mixture)
    kl_weight: float = 0.01       # vpl: the KL term's final weight
    max_context: int = 16         # vpl, gpo: the most pairs an episode's context holds (a user may have thousands)
    max_targets: int = 32         # vpl, gpo: the most target pairs an episode scores
    seed: int = 0


def _batch_reward(model: EmbeddingRM, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rewards of ``x[i]`` for seen user ``index[i]`` (the methods trained on mini-batches of pairs)."""
    if not isinstance(model, WeightedRM):
        return model.reward(x, None)
    return model.mix(model.features(x), model.weights(model.user_logits[index]))


def _episode_loss(model: EmbeddingRM, context: Context, targets: Context, kl_weight: float) -> torch.Tensor:
    if isinstance(model, VPL):
        mean, logvar = model.encode(context)
        z = mean + torch.randn_like(mean) * torch.exp(0.5 * logvar)
        kl = 0.5 * (mean.pow(2) + logvar.exp() - 1.0 - logvar).sum()
        return pair_loss(model.reward(targets.chosen, z), model.reward(targets.rejected, z)) + kl_weight * kl
    state = model.state(context=context)
    return pair_loss(model.reward(targets.chosen, state), model.reward(targets.rejected, state))


def train_method(method: str, data: PairData, settings: TrainSettings | None = None,
                 progress: Callable[[int, float], None] | None = None, **hyper: Any) -> EmbeddingRM:
    """A trained ``method`` (``hyper``: its own settings, e.g. ``prototypes=4``). ``progress(step, loss)`` is called
    every 100 steps."""
    s = settings or TrainSettings()
    if len(data) == 0:
        raise EmbeddingDataError("no training pairs")
    empty = [u for u, c in data.contexts.items() if len(c) == 0]
    if empty:
        raise EmbeddingDataError(f"user {empty[0]!r} has no pairs ({len(empty)} such users)")
    torch.manual_seed(s.seed)
    rng = np.random.default_rng(s.seed)
    model = build_method(method, data.dim, data.users, **hyper)
    users_own = [p for n, p in model.named_parameters() if n == "user_logits"]
    shared = [p for n, p in model.named_parameters() if n != "user_logits"]
    optimizer = torch.optim.AdamW([{"params": shared}, {"params": users_own, "lr": s.user_lr, "weight_decay": 0.0}],
                                  lr=s.lr, weight_decay=s.weight_decay)
    episodic = model.reads_context
    if episodic:
        users = [u for u in data.users if len(data.contexts[u]) >= 2]
        if not users:
            raise EmbeddingDataError(f"{method} learns from users with 2 or more pairs: none has")
    else:
        chosen, rejected, index = data.flat()
    model.train()
    running = 0.0
    for step in range(1, s.steps + 1):
        optimizer.zero_grad()
        if episodic:
            losses = []
            kl_weight = s.kl_weight * min(1.0, 2.0 * step / s.steps)
            for u in rng.choice(users, size=min(s.users_per_step, len(users)), replace=False):
                pairs = data.contexts[str(u)]
                order = torch.from_numpy(rng.permutation(len(pairs)))
                m = int(rng.integers(1, min(len(pairs), s.max_context + 1)))
                losses.append(_episode_loss(model, pairs.subset(order[:m]),
                                            pairs.subset(order[m:m + s.max_targets]), kl_weight))
            loss = torch.stack(losses).mean()
        else:
            pick = torch.from_numpy(rng.integers(0, len(index), size=min(s.batch_size, len(index))))
            loss = pair_loss(_batch_reward(model, chosen[pick], index[pick]),
                             _batch_reward(model, rejected[pick], index[pick]))
        loss.backward()
        optimizer.step()
        running = loss.item() if step == 1 else 0.98 * running + 0.02 * loss.item()
        if progress is not None and (step % 100 == 0 or step == s.steps):
            progress(step, running)
    model.eval()
    return model


def pair_probability(model: EmbeddingRM, chosen: torch.Tensor, rejected: torch.Tensor, state: Any) -> torch.Tensor:
    """P(first beats second) for each row, for one user's state."""
    with torch.no_grad():
        return torch.sigmoid(model.reward(chosen, state) - model.reward(rejected, state))


def save_method(model: EmbeddingRM, folder: str | Path, extra: dict[str, Any] | None = None) -> Path:
    from safetensors.torch import save_file

    from pr_rlhf.files import atomic_write_text

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / WEIGHTS))
    atomic_write_text(folder / CONFIG, json.dumps({**model.config(), **(extra or {})}, indent=1) + "\n")
    return folder


def load_method(folder: str | Path) -> tuple[EmbeddingRM, dict[str, Any]]:
    """(the model, its config) from a folder :func:`save_method` wrote; errors name the file."""
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        config = json.loads((folder / CONFIG).read_text())
    except FileNotFoundError:
        raise EmbeddingDataError(f"{folder / CONFIG}: no trained embedding reward model there") from None
    except json.JSONDecodeError as exc:
        raise EmbeddingDataError(f"{folder / CONFIG}: unreadable: {exc}") from None
    for key in ("method", "dim", "users", "hyper"):
        if key not in config:
            raise EmbeddingDataError(f"{folder / CONFIG}: field {key!r} missing")
    model = build_method(config["method"], int(config["dim"]), list(config["users"]), **config["hyper"])
    model.load_state_dict(load_file(str(folder / WEIGHTS)))
    model.eval()
    return model, config
