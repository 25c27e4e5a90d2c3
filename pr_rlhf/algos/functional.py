"""Masked reductions and small tensor helpers used by every algorithm module (each written once, here).

Masks are `[B, T]` tensors (bool, int or float) with 1 on the tokens that count; values outside the mask never
reach a result, even when they are NaN or inf.
"""
from __future__ import annotations

import torch

_EPS_COUNT = 1e-8  # floor for a mask's total, so an all-zero mask gives 0 instead of NaN


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Sum of `values * mask` over `dim` (all elements when None); entries outside the mask are ignored entirely."""
    mask = mask.to(values.dtype) if mask.dtype == torch.bool else mask
    kept = torch.where(mask != 0, values, torch.zeros((), dtype=values.dtype, device=values.device))
    prod = kept * mask
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Mean of `values` over the masked elements along `dim`; 0 where the mask is empty."""
    total = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / total.to(values.dtype).clamp_min(_EPS_COUNT)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked elements (all of them together). `unbiased` applies Bessel's n/(n-1) correction,
    which needs at least two masked elements (ValueError otherwise, as in verl)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = float(mask.sum())
        if n <= 1:
            raise ValueError(f"unbiased masked variance needs at least 2 masked elements, got {n:g}")
        var = var * (n / (n - 1))
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) with mean and unbiased variance taken over the mask.

    The result is defined at every position (callers multiply by the mask where padding must be 0). With
    `shift_mean=False` the mean is added back, so only the scale changes.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    out = (values - mean) * torch.rsqrt(var + 1e-8)
    return out + mean if not shift_mean else out


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dimension: logsumexp(z) - sum(softmax(z) * z).

    Shape `logits[..., 0]`."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def as_group_ids(index, batch_size: int, device: torch.device | None = None) -> tuple[torch.Tensor, int]:
    """Map arbitrary group labels (np array / list of str or int, or a tensor) to dense ids 0..G-1.

    Returns `(ids [B] long tensor, G)`. Labels are compared by value, as verl's dict-based grouping does.
    """
    import numpy as np

    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    labels = np.asarray(index)
    if labels.ndim != 1 or labels.shape[0] != batch_size:
        raise ValueError(f"index must have one group label per sample ({batch_size}), got shape {labels.shape}")
    uniques, inverse = np.unique(labels, return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device), len(uniques)
