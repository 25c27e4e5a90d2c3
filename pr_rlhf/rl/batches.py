"""The learner's batch format, its canonical padded layout (``collate``) and how a batch is shared out over ranks.

Pure torch (no Ray, no process group): the learner ranks and the driver that splits batches for them use it.

Batch format (a dict; what the controller sends)
================================================

Required by every learner method:

``prompt_ids``      ragged ``list[list[int]]`` (or 1-D tensors), or a LongTensor ``[B, P]`` with ``prompt_mask``
                    ``[B, P]`` (1 on real tokens; any padding side). Every prompt needs at least one token.
``response_ids``    ragged ``list[list[int]]``, or a LongTensor ``[B, T]`` right-padded with ``response_mask``.
``response_mask``   optional (default: every response token). 1 on the response tokens that count in the losses;
                    a 0 keeps the token in the context but out of the losses (e.g. tool output in a multi-turn
                    rollout). Ragged input: a ragged mask, the response is its full list. Tensor input: the
                    response ends at the last 1 of its mask, unless ``response_attention_mask`` ``[B, T]`` (1 on
                    every present token) says otherwise.

Per-token fields (ragged lists of per-response-token floats, or ``[B, T]`` tensors aligned with
``response_ids``' columns):

``old_logprobs``    ``update_policy`` (required): log-probs of the behaviour policy (``compute_logprobs``).
``advantages``      ``update_policy`` (required); a ``[B]`` tensor / list of floats is broadcast over each response.
``behaviour_logprobs`` ``update_policy`` (optional): the rollout engine's log-probs of samples older weights
                    drew (one-step-off rollout); the loss then weights each token by the truncated
                    pi_prox / pi_behaviour (``pr_rlhf.algos.behaviour_weights``), ``old_logprobs`` (or, in a single
                    on-policy update, the update's own forward) being the proximal policy's. NaN: no engine log-prob
                    (weight 1).
``ref_logprobs``    ``update_policy`` when ``kl.where == 'loss'`` and ``kl.coef > 0`` (computed there if absent).
``values``          ``update_critic`` (required): the critic's values at rollout time (``compute_values``).
``returns``         ``update_critic`` (required).

A reward model reads one score per sequence at its last token, so its rows (:func:`scored_rows`) are each
sequence's tokens but the last as the prompt and that token as a one-token response; ``update_reward_model`` takes
pairs (:func:`reward_model_batch`): the chosen rows under the usual keys, the rejected ones under
``rejected_``-prefixed keys (a pair never splits across ranks or micro-batches), and ``margin`` ``[B]``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

PER_TOKEN_FIELDS = ("old_logprobs", "ref_logprobs", "advantages", "values", "returns", "behaviour_logprobs")
SEQUENCE_KEYS = ("prompt_ids", "prompt_mask", "response_ids", "response_attention_mask", "response_mask")
REJECTED = "rejected_"
SEQUENCE_BROADCAST_FIELDS = ("advantages",)  # may be given per sequence ([B]) and broadcast over the response


def _rows(value: Any) -> list[list[Any]]:
    if isinstance(value, torch.Tensor):
        if value.dim() != 2:
            raise ValueError(f"expected a 2-D tensor, got shape {tuple(value.shape)}")
        return value.tolist()
    return [list(r.tolist()) if isinstance(r, torch.Tensor) else list(r) for r in value]


def _pad_ragged(rows: list[list[Any]], width: int, left: bool, fill: Any, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            if len(row) > width:
                raise ValueError(f"row {i}: {len(row)} values do not fit width {width}")
            values = torch.as_tensor(row, dtype=dtype)
            if left:
                out[i, width - len(row):] = values
            else:
                out[i, :len(row)] = values
    return out


def _is_per_sequence(value: Any, n: int) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() == 1
    return len(value) == n and all(isinstance(v, (int, float)) for v in value)


def collate(batch: Mapping[str, Any], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Normalize a batch (see the module docstring) to the canonical padded layout used by the learner:

    ``prompt_ids`` / ``prompt_mask`` ``[B, P]`` left-padded; ``response_ids`` / ``response_attention_mask`` /
    ``response_mask`` ``[B, T]`` right-padded (attention: every token of the response, loss: ``response_mask``);
    per-token fields ``[B, T]`` float32 (0 on padding); ``minibatch_index`` ``[B]`` passes through.
    Tensor inputs keep their width (P, T); ragged inputs are padded to the longest row. Idempotent.
    """
    if "prompt_ids" not in batch or "response_ids" not in batch:
        raise KeyError(f"a learner batch needs 'prompt_ids' and 'response_ids'; got keys {sorted(batch)}")
    # ---- prompts: keep the masked tokens in order, left-padded
    p_in = batch["prompt_ids"]
    if isinstance(p_in, torch.Tensor):
        if p_in.dim() != 2:
            raise ValueError(f"prompt_ids: expected [B, P], got shape {tuple(p_in.shape)}")
        p_mask = batch.get("prompt_mask")
        p_mask = torch.ones_like(p_in) if p_mask is None else torch.as_tensor(p_mask).to(torch.long).ne(0).long()
        order = torch.sort(p_mask, dim=1, stable=True).indices  # pads first, tokens keep their order
        prompt_mask = p_mask.gather(1, order)
        prompt_ids = torch.where(prompt_mask.bool(), p_in.long().gather(1, order), pad_token_id)
    else:
        rows = _rows(p_in)
        width = max((len(r) for r in rows), default=1)
        prompt_ids = _pad_ragged(rows, width, True, pad_token_id, torch.long)
        prompt_mask = _pad_ragged([[1] * len(r) for r in rows], width, True, 0, torch.long)
    n = prompt_ids.shape[0]
    if n and bool((prompt_mask.sum(-1) == 0).any()):
        raise ValueError("every prompt needs at least one token (the first response token is predicted from the "
                         "last prompt token)")
    # ---- responses: right-padded; a response extends to the last 1 of its mask (or of response_attention_mask)
    r_in = batch["response_ids"]
    r_mask_in = batch.get("response_mask")
    if isinstance(r_in, torch.Tensor):
        if r_in.dim() != 2:
            raise ValueError(f"response_ids: expected [B, T], got shape {tuple(r_in.shape)}")
        width_t = max(int(r_in.shape[1]), 1)
        r_ids = torch.nn.functional.pad(r_in.long(), (0, width_t - r_in.shape[1]), value=pad_token_id)
        r_mask = torch.ones_like(r_ids, dtype=torch.float32) if r_mask_in is None else \
            torch.nn.functional.pad(torch.as_tensor(r_mask_in).ne(0).float(), (0, width_t - r_in.shape[1]))
        presence = r_mask  # a padded tensor: the response ends at the last 1 of its mask
    else:
        rows = _rows(r_in)
        width_t = max(max((len(r) for r in rows), default=0), 1)
        r_ids = _pad_ragged(rows, width_t, False, pad_token_id, torch.long)
        r_mask = _pad_ragged([[1.0] * len(r) for r in rows], width_t, False, 0.0, torch.float32) \
            if r_mask_in is None else _pad_ragged([[float(bool(m)) for m in r] for r in _rows(r_mask_in)],
                                                  width_t, False, 0.0, torch.float32)
        presence = _pad_ragged([[1.0] * len(r) for r in rows], width_t, False, 0.0, torch.float32)
    if r_ids.shape[0] != n:
        raise ValueError(f"prompt_ids has {n} rows but response_ids has {r_ids.shape[0]}")
    attn_in = batch.get("response_attention_mask")
    presence = presence if attn_in is None else (
        torch.as_tensor(attn_in) if isinstance(attn_in, torch.Tensor) else
        _pad_ragged(_rows(attn_in), width_t, False, 0, torch.long)).ne(0).float()
    positions = torch.arange(1, width_t + 1)
    lengths = (presence[:, :width_t] * positions).amax(-1).long() if n else torch.zeros(0, dtype=torch.long)
    response_attn = (positions[None, :] <= lengths[:, None]).long()
    out = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
           "response_ids": torch.where(response_attn.bool(), r_ids, pad_token_id),
           "response_attention_mask": response_attn, "response_mask": r_mask * response_attn}
    # ---- per-token fields, aligned with the response columns
    for name in PER_TOKEN_FIELDS:
        value = batch.get(name)
        if value is None:
            continue
        if name in SEQUENCE_BROADCAST_FIELDS and _is_per_sequence(value, n):
            dense = torch.as_tensor(value, dtype=torch.float32).reshape(n)[:, None].expand(n, width_t)
        elif isinstance(value, torch.Tensor):
            if value.dim() != 2 or value.shape[0] != n:
                raise ValueError(f"{name}: expected [{n}, T], got shape {tuple(value.shape)}")
            dense = torch.nn.functional.pad(value.float(), (0, max(0, width_t - value.shape[1])))[:, :width_t]
            if n and value.shape[1] < int(lengths.max()):
                raise ValueError(f"{name} has {value.shape[1]} columns for responses of up to {int(lengths.max())}")
        else:
            rows = _rows(value)
            if len(rows) != n:
                raise ValueError(f"{name} has {len(rows)} rows, the batch has {n}")
            short = [i for i, row in enumerate(rows) if len(row) < int(lengths[i])]
            if short:
                i = short[0]
                raise ValueError(f"{name} row {i} has {len(rows[i])} values for a {int(lengths[i])}-token response")
            dense = _pad_ragged([row[:int(k)] for row, k in zip(rows, lengths)], width_t, False, 0.0, torch.float32)
        out[name] = (dense * response_attn).contiguous()
    if "minibatch_index" in batch:
        out["minibatch_index"] = torch.as_tensor(batch["minibatch_index"], dtype=torch.long).reshape(n)
    return out


def take_rows(batch: Mapping[str, torch.Tensor], rows: Any) -> dict[str, torch.Tensor]:
    """Rows ``rows`` of a canonical batch (every value is a tensor with the batch as its first dimension)."""
    idx = torch.as_tensor(np.asarray(rows, dtype=np.int64))
    return {k: v.index_select(0, idx) for k, v in batch.items()}


def contiguous_shares(batch: Mapping[str, torch.Tensor], world_size: int) -> list[dict[str, torch.Tensor]]:
    """A canonical batch cut into ``world_size`` contiguous runs of rows (as even as possible), one per rank."""
    n = batch["response_ids"].shape[0]
    return [take_rows(batch, idx) for idx in np.array_split(np.arange(n), world_size)]


def mini_batch_shares(batch: Mapping[str, torch.Tensor], world_size: int,
                      mini_batch_size: int | None) -> list[dict[str, torch.Tensor]]:
    """Each rank's rows for an update: every global mini-batch (``mini_batch_size`` samples in batch order, the
    whole batch when ``None``) is split across the ranks, and ``minibatch_index`` tells a rank which mini-batch a
    row belongs to, so an optimizer step sees the same samples whatever the world size."""
    n = batch["response_ids"].shape[0]
    size = mini_batch_size or max(n, 1)
    per_rank: list[list[int]] = [[] for _ in range(world_size)]
    mini_of: list[list[int]] = [[] for _ in range(world_size)]
    for k, start in enumerate(range(0, n, size)):
        for r, idx in enumerate(np.array_split(np.arange(start, min(start + size, n)), world_size)):
            per_rank[r].extend(int(i) for i in idx)
            mini_of[r].extend([k] * len(idx))
    shares = []
    for rows, minis in zip(per_rank, mini_of):
        share = take_rows(batch, rows)
        share["minibatch_index"] = torch.tensor(minis, dtype=torch.long)
        shares.append(share)
    return shares


def minibatch_index(batch: Mapping[str, torch.Tensor], world_size: int, mini_batch_size: int | None) -> torch.Tensor:
    """This rank's mini-batch number per row: ``minibatch_index`` when the driver set it (``mini_batch_shares``),
    else consecutive runs of ``ceil(mini_batch_size / world_size)`` rows (the whole batch when ``None``)."""
    if "minibatch_index" in batch:
        return batch["minibatch_index"]
    n = batch["response_ids"].shape[0]
    local = n if mini_batch_size is None else max(1, math.ceil(mini_batch_size / world_size))
    return torch.arange(n) // max(local, 1)


def scored_rows(sequences: Any) -> dict[str, list[list[int]]]:
    """Whole sequences (token ids) as learner rows whose one-token response is the token a score is read at."""
    seqs = _rows(sequences)
    short = [i for i, seq in enumerate(seqs) if len(seq) < 2]
    if short:
        raise ValueError(f"sequence {short[0]} has {len(seqs[short[0]])} token(s): a scored sequence needs at least 2")
    return {"prompt_ids": [seq[:-1] for seq in seqs], "response_ids": [seq[-1:] for seq in seqs]}


def reward_model_batch(batch: Mapping[str, Any], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """``{"chosen_ids", "rejected_ids"[, "margin"]}`` (ragged token ids per pair) -> the canonical pair batch:
    both sides padded to one width, the rejected side under ``rejected_`` keys, ``margin`` ``[B]`` (default 0).
    A canonical pair batch passes through."""
    if "chosen_ids" not in batch:
        if REJECTED + "response_ids" not in batch:
            raise KeyError(f"a reward-model batch needs 'chosen_ids' and 'rejected_ids'; got keys {sorted(batch)}")
        return dict(batch)
    chosen, rejected = _rows(batch["chosen_ids"]), _rows(batch["rejected_ids"])
    if len(chosen) != len(rejected):
        raise ValueError(f"{len(chosen)} chosen but {len(rejected)} rejected sequences")
    n = len(chosen)
    both = collate(scored_rows(chosen + rejected), pad_token_id)
    out = {k: both[k][:n] for k in SEQUENCE_KEYS}
    out.update({REJECTED + k: both[k][n:] for k in SEQUENCE_KEYS})
    margin = batch.get("margin")
    out["margin"] = torch.zeros(n) if margin is None else torch.as_tensor(margin, dtype=torch.float32).reshape(n)
    return out


def join_pair_sides(mb: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The chosen rows then the rejected rows of a (micro-)batch of pairs, as one batch of ``2b`` sequences."""
    return {k: torch.cat([mb[k], mb[REJECTED + k]]) for k in SEQUENCE_KEYS}
