"""Reward models on frozen text embeddings: the global Bradley-Terry floor and four personalized methods, written
from their papers (their repositories read to understand, not copied).

Every method scores an embedding ``x`` of (question, response) for a user: ``reward(x, state)``, where the user's
state comes from one of three places (:meth:`EmbeddingRM.state`):

- a **seen** user (one the method was trained on): what training learned for them (PAL's and LoRe's per-user
  weights); the context-based methods (VPL, GPO) read the user's pairs instead, like any other user;
- a **new** user with a context of their (chosen, rejected) pairs: PAL and LoRe fit the user's weights on those
  pairs with everything else frozen (:meth:`WeightedRM.fit_weights`); VPL encodes them into a latent; GPO attends
  to them;
- nobody known and no pairs: the population's prior (uniform weights, the latent's prior mean, GPO's null token).

The methods:

- ``bt_embedding`` (the floor every personalized method must beat): one reward MLP for everybody, Bradley-Terry loss.
- ``pal`` (Chen et al., ICLR 2025, "PAL: pluralistic alignment"): K prototypes with per-user simplex weights over
  them. ``variant="heads"`` (PAL-B): K reward heads over a shared projection, ``r_u(x) = sum_k a_uk w_k . f(x)``;
  ``variant="points"`` (PAL-A, ideal points): K prototype points in the projection's space, the user's ideal point
  their mixture, ``r_u(x) = -||f(x) - sum_k a_uk p_k||^2``.
- ``lore`` (Bose et al., COLM 2025, "LoRe: low-rank reward modeling"): a linear basis ``B`` (d x K) on the frozen
  embeddings shared by everyone, per-user simplex weights, ``r_u(x) = a_u . (B^T x)``.
- ``vpl`` (Poddar et al., NeurIPS 2024, "variational preference learning"): an encoder of the user's context pairs
  (a pair MLP, one self-attention layer, mean pooling) into a Gaussian latent ``z``; a reward decoder MLP on
  ``[x; z]``; trained with the Bradley-Terry likelihood of held-out pairs plus a KL to ``N(0, I)``.
- ``gpo`` (Zhao, Dang and Grover, ICLR 2024, "group preference optimization"): a transformer over context points
  ``(x, preference)`` -- each context pair gives its chosen response the label 1 and its rejected 0 -- and target
  points ``(x, ?)``; targets attend to the context only and the model predicts each target's preference logit,
  which is the reward. Meta-trained over users (episodes: some of a user's pairs as context, the rest as targets).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class Context:
    """One user's pairs as embeddings: ``chosen[i]`` was preferred to ``rejected[i]``."""

    chosen: torch.Tensor     # [k, d]
    rejected: torch.Tensor   # [k, d]

    def __len__(self) -> int:
        return int(self.chosen.shape[0])

    def subset(self, index: torch.Tensor | list[int]) -> Context:
        return Context(self.chosen[index], self.rejected[index])


def _mlp(dim: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, out))


def pair_loss(chosen_reward: torch.Tensor, rejected_reward: torch.Tensor) -> torch.Tensor:
    """Bradley-Terry negative log-likelihood of the chosen response winning, averaged."""
    return -F.logsigmoid(chosen_reward - rejected_reward).mean()


class EmbeddingRM(nn.Module):
    """The interface: :meth:`state` for a user, :meth:`reward` of embeddings for that state."""

    method: ClassVar[str]
    reads_context: ClassVar[bool] = False   # the state is inferred from the user's pairs (VPL, GPO)

    def __init__(self, dim: int, users: list[str], **hyper: Any) -> None:
        super().__init__()
        self.dim = dim
        self.users = list(users)
        self.user_index = {u: i for i, u in enumerate(self.users)}
        self.hyper = dict(hyper)

    def state(self, user: str | None = None, context: Context | None = None) -> Any:
        return None

    def reward(self, x: torch.Tensor, state: Any) -> torch.Tensor:
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        return {"method": self.method, "dim": self.dim, "users": self.users, "hyper": self.hyper}


class GlobalBT(EmbeddingRM):
    method = "bt_embedding"

    def __init__(self, dim: int, users: list[str], hidden: int = 128) -> None:
        super().__init__(dim, users, hidden=hidden)
        self.net = _mlp(dim, hidden, 1)

    def reward(self, x: torch.Tensor, state: Any) -> torch.Tensor:
        return self.net(x).squeeze(-1)


class WeightedRM(EmbeddingRM):
    """K prototypes mixed by per-user simplex weights (PAL, LoRe): learned for seen users, fitted for new ones. A
    method gives the ``features`` of a response (what the prototypes see) and how weights ``mix`` them."""

    def __init__(self, dim: int, users: list[str], prototypes: int, **hyper: Any) -> None:
        super().__init__(dim, users, prototypes=prototypes, **hyper)
        self.prototypes = prototypes
        self.adapt_steps = 200   # optimizer steps fitting a new user's weights
        self.user_logits = nn.Parameter(torch.zeros(len(users), prototypes))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``[n, K]``: each prototype's reward of each response (the heads, LoRe's basis)."""
        raise NotImplementedError

    def mix(self, features: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The rewards ``[n]`` of responses with these features for weights ``[K]`` (or ``[n, K]``, one per row)."""
        return features @ weights if weights.dim() == 1 else (features * weights).sum(-1)

    def weights(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits, dim=-1)

    def state(self, user: str | None = None, context: Context | None = None) -> torch.Tensor:
        if user is not None and user in self.user_index:
            return self.weights(self.user_logits[self.user_index[user]]).detach()
        if context is not None and len(context) > 0:
            return self.fit_weights(context, steps=self.adapt_steps)
        return torch.full((self.prototypes,), 1.0 / self.prototypes)

    def reward(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.mix(self.features(x), state)

    def fit_weights(self, context: Context, steps: int = 200, lr: float = 0.1, l2: float = 1e-2) -> torch.Tensor:
        """A new user's weights from their pairs, everything else frozen (convex for the heads and LoRe): Adam from
        the uniform mixture, a small pull towards it so that one pair does not decide alone."""
        with torch.no_grad():
            chosen, rejected = self.features(context.chosen), self.features(context.rejected)
        logits = torch.zeros(self.prototypes, requires_grad=True)
        optimizer = torch.optim.Adam([logits], lr=lr)
        for _ in range(steps):
            optimizer.zero_grad()
            w = self.weights(logits)
            loss = pair_loss(self.mix(chosen, w), self.mix(rejected, w)) + l2 * logits.pow(2).sum()
            loss.backward()
            optimizer.step()
        return self.weights(logits.detach())


class PAL(WeightedRM):
    method = "pal"

    def __init__(self, dim: int, users: list[str], prototypes: int = 4, hidden: int = 128, proj: int = 32,
                 variant: str = "heads") -> None:
        if variant not in ("heads", "points"):
            raise ValueError(f"pal variant {variant!r}: 'heads' (PAL-B) or 'points' (PAL-A)")
        super().__init__(dim, users, prototypes, hidden=hidden, proj=proj, variant=variant)
        self.variant = variant
        self.proj = _mlp(dim, hidden, proj)
        # heads: K reward vectors; points: K ideal points, both in the projection's space
        self.protos = nn.Parameter(torch.randn(prototypes, proj) / math.sqrt(proj))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Heads: each head's reward ``[n, K]``; points: the response's place in the projection ``[n, proj]``."""
        f = self.proj(x)
        return f @ self.protos.T if self.variant == "heads" else f

    def mix(self, features: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if self.variant == "heads":
            return super().mix(features, weights)
        ideal = weights @ self.protos   # the user's ideal point: their mixture of the prototypes' points
        return -(features - ideal).pow(2).sum(-1)


class LoRe(WeightedRM):
    method = "lore"

    def __init__(self, dim: int, users: list[str], prototypes: int = 4) -> None:
        super().__init__(dim, users, prototypes)
        self.basis = nn.Parameter(torch.randn(dim, prototypes) / math.sqrt(dim))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.basis


class VPL(EmbeddingRM):
    method = "vpl"
    reads_context = True

    def __init__(self, dim: int, users: list[str], latent: int = 16, hidden: int = 128) -> None:
        super().__init__(dim, users, latent=latent, hidden=hidden)
        self.latent = latent
        self.pair = _mlp(2 * dim, hidden, hidden)
        self.attend = nn.MultiheadAttention(hidden, num_heads=4, batch_first=True)
        self.posterior = nn.Linear(hidden, 2 * latent)
        self.decoder = _mlp(dim + latent, hidden, 1)

    def encode(self, context: Context) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log-variance) of the user's latent from their pairs."""
        h = self.pair(torch.cat([context.chosen, context.rejected], dim=-1)).unsqueeze(0)   # [1, k, hidden]
        h = h + self.attend(h, h, h, need_weights=False)[0]
        mean, logvar = self.posterior(h.mean(dim=1).squeeze(0)).chunk(2, dim=-1)
        return mean, logvar.clamp(-8.0, 8.0)

    def state(self, user: str | None = None, context: Context | None = None) -> torch.Tensor:
        if context is None or len(context) == 0:
            return torch.zeros(self.latent)            # the prior's mean
        return self.encode(context)[0]                 # the posterior's mean at test time

    def reward(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        z = state.expand(x.shape[0], -1)
        return self.decoder(torch.cat([x, z], dim=-1)).squeeze(-1)


class GPO(EmbeddingRM):
    method = "gpo"
    reads_context = True

    def __init__(self, dim: int, users: list[str], width: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__(dim, users, width=width, layers=layers, heads=heads)
        self.embed = nn.Linear(dim, width)
        self.label = nn.Embedding(3, width)             # 0 rejected, 1 chosen, 2 a target (to predict)
        self.null = nn.Parameter(torch.zeros(1, width))  # the context of a user with no pairs
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=2 * width, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 1)

    def state(self, user: str | None = None, context: Context | None = None) -> torch.Tensor:
        """The context tokens ``[2k + 1, width]``: each pair's responses with their labels, and the null token."""
        tokens = [self.null]
        if context is not None and len(context) > 0:
            k = len(context)
            tokens.append(self.embed(context.chosen) + self.label(torch.ones(k, dtype=torch.long)))
            tokens.append(self.embed(context.rejected) + self.label(torch.zeros(k, dtype=torch.long)))
        return torch.cat(tokens, dim=0)

    def reward(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Each target attends to the context and to itself only (never to another target), so a response's
        reward does not depend on what it is scored with."""
        c, n = state.shape[0], x.shape[0]
        targets = self.embed(x) + self.label(torch.full((n,), 2, dtype=torch.long))
        tokens = torch.cat([state, targets], dim=0).unsqueeze(0)
        blocked = torch.ones(c + n, c + n, dtype=torch.bool)
        blocked[:, :c] = False                                       # everyone sees the context
        blocked[c:, c:] = ~torch.eye(n, dtype=torch.bool)            # a target sees itself, no other target
        out = self.body(tokens, mask=blocked)
        return self.head(out[0, c:]).squeeze(-1)


METHODS: dict[str, type[EmbeddingRM]] = {cls.method: cls for cls in (GlobalBT, PAL, LoRe, VPL, GPO)}


def build_method(method: str, dim: int, users: list[str], **hyper: Any) -> EmbeddingRM:
    if method not in METHODS:
        raise ValueError(f"unknown embedding reward method {method!r}: expected one of {sorted(METHODS)}")
    return METHODS[method](dim, users, **hyper)
