"""Running a rank's share of a batch through a model in micro-batches while every rank joins every collective.

A rank with fewer micro-batches than another (or only fully masked rows) runs one-token stand-ins whose output
counts zero times, so each FSDP2 all-gather / reduce-scatter is matched. Updates accumulate gradients over the
micro-batches of a mini-batch (synchronizing on the last one), clip them with ``clip_grad_norm_`` and take one
optimizer step; a step with a non-finite norm is skipped.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping

import torch
from torch import nn

from pr_rlhf.algos import GlobalBatchInfo
from pr_rlhf.rl.batches import take_rows
from pr_rlhf.rl.objectives import MicroLoss
from pr_rlhf.rl.update_log import UpdateLog
from workers.learner.ranks import Ranks
from workers.learner.strategy import Strategy

MicroOutput = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]


class MicroBatchRunner:
    """One rank's micro-batch loops: no-grad forwards, accumulated optimizer steps, the update's metrics."""

    def __init__(self, ranks: Ranks, strategy: Strategy, pad_token_id: int, grad_clip: float | None) -> None:
        self.ranks = ranks
        self.strategy = strategy
        self.pad_token_id = pad_token_id
        self.grad_clip = grad_clip

    def stand_in(self) -> dict[str, torch.Tensor]:
        """A one-token micro-batch with nothing in the loss: a rank with no rows left still joins the collectives."""
        one = torch.full((1, 1), self.pad_token_id, dtype=torch.long)
        return {"prompt_ids": one, "prompt_mask": torch.ones_like(one), "response_ids": one.clone(),
                "response_attention_mask": torch.ones_like(one), "response_mask": torch.zeros(1, 1)}

    def count(self, rows: torch.Tensor, size: int) -> int:
        """Number of micro-batches every rank runs for its ``rows`` (the max over ranks)."""
        return int(self.ranks.reduce([math.ceil(len(rows) / size)], op="max")[0])

    def global_batch_info(self, mask: torch.Tensor) -> tuple[GlobalBatchInfo, float, float]:
        """The loss normalizer of a mini-batch whose local loss mask is ``mask``: global tokens and sequences."""
        tokens, seqs = self.ranks.reduce([float(mask.sum()), float((mask.sum(-1) > 0).sum())])
        # gradients are averaged over the ranks (FSDP2 reduce-scatter): dp_size undoes that
        return GlobalBatchInfo(dp_size=self.ranks.world_size, num_tokens=tokens, num_seqs=seqs), tokens, seqs

    @torch.no_grad()
    def forward_all(self, model: nn.Module, batch: Mapping[str, torch.Tensor], size: int,
                    fn: MicroOutput) -> torch.Tensor:
        """``fn(model, micro_batch)`` ``[b, T]`` over the whole batch in eval mode, 0 after each response."""
        n, t = batch["response_ids"].shape
        rows = torch.arange(n)
        out = torch.zeros((n, t), dtype=torch.float32)
        was_training = model.training
        model.eval()
        try:
            for j in range(self.count(rows, size)):
                chunk = rows[j * size:(j + 1) * size]
                if len(chunk) == 0:
                    fn(model, self.stand_in())
                    continue
                mb = take_rows(batch, chunk)
                out[chunk] = fn(model, mb).cpu() * mb["response_attention_mask"]
        finally:
            model.train(was_training)
            self.strategy.reshard(model)
        return out

    def accumulated_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: Mapping[str, torch.Tensor],
                         rows: torch.Tensor, size: int, log: UpdateLog,
                         micro_loss: Callable[[dict[str, torch.Tensor], torch.Tensor], MicroLoss],
                         idle_output: MicroOutput) -> None:
        """One optimizer step over ``rows`` in micro-batches of ``size``: gradients accumulate, ranks synchronize
        on the last micro-batch. ``micro_loss(mb, mask)`` is the loss of a micro-batch with response tokens
        (recorded in ``log``); a rank with fewer rows, or only masked ones, backpropagates zero times
        ``idle_output`` of a stand-in."""
        optimizer.zero_grad(set_to_none=True)
        n_micro = self.count(rows, size)
        for j in range(n_micro):
            chunk = rows[j * size:(j + 1) * size]
            self.strategy.set_gradient_sync(model, j == n_micro - 1)
            mb = take_rows(batch, chunk) if len(chunk) else None
            if mb is None or float(mb["response_mask"].sum()) == 0:
                (idle_output(model, mb or self.stand_in()).sum() * 0.0).backward()
                continue
            mask = mb["response_mask"].to(self.ranks.device)
            micro = micro_loss(mb, mask)
            log.add(mask, micro)
            micro.loss.backward()
        log.record_step(*self._clip_and_step(model, optimizer))
        self.strategy.set_gradient_sync(model, True)

    def _clip_and_step(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[float, float, bool]:
        """Returns (grad norm before clipping, after clipping, stepped)."""
        params = [p for p in model.parameters() if p.requires_grad]
        max_norm = self.grad_clip if self.grad_clip is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if not math.isfinite(norm):
            optimizer.zero_grad(set_to_none=True)
            return norm, norm, False
        post = torch.nn.utils.clip_grad_norm_(params, float("inf"))
        post = float(post.full_tensor() if hasattr(post, "full_tensor") else post)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm, post, True

    def metrics(self, prefix: str, log: UpdateLog, lr: float, t0: float) -> dict[str, float]:
        """The update's global metrics (identical on every rank). Collective."""
        # a rank that only ran stand-ins recorded no stats: agree on the names first
        names = self.ranks.union(list(log.sums))
        loss_names = sorted(log.losses)
        reduced = self.ranks.reduce([log.sums.get(n, 0.0) for n in names] + [log.losses[n] for n in loss_names])
        return log.metrics(prefix, dict(zip(names, reduced[:len(names)])), dict(zip(loss_names, reduced[len(names):])),
                           self.ranks.world_size, lr, time.perf_counter() - t0)
