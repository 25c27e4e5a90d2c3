"""Shared-prefix packing: the samples of a GRPO group share one prompt, so the learner computes it once per group.

A canonical micro-batch (left-padded prompts ``[b, P]``, right-padded responses ``[b, T]``) becomes one packed
sequence per distinct prompt: the prompt's tokens, then each of its responses in turn. A 4-D attention mask lets
every response token see the prompt and the earlier tokens of its own response only, and position ids restart
after the prompt for each response, so every response is computed exactly as if it followed the prompt alone.
With 8 responses of ~64 tokens to a 64-token prompt, a group costs 64 + 8 x 64 tokens instead of 8 x 128.

``gather_group`` / ``gather_pos`` ``[b, T]`` say where the logits predicting response token t of row i sit in the
packed output (the last prompt token for t = 0). Padding positions point at a valid position, so that everything
computed there stays finite; callers mask them as usual.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedBatch:
    input_ids: torch.Tensor        # [G, L]
    attention_mask: torch.Tensor   # [G, 1, L, L] bool, True = may attend
    position_ids: torch.Tensor     # [G, L]
    gather_group: torch.Tensor     # [b, T]
    gather_pos: torch.Tensor       # [b, T]

    @property
    def tokens(self) -> int:
        return int(self.input_ids.numel())


def shared_prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """Row indices grouped by identical prompt (same tokens, same padding), in order of first appearance."""
    groups: dict[tuple, list[int]] = {}
    for i, (ids, mask) in enumerate(zip(prompt_ids.tolist(), prompt_mask.tolist())):
        groups.setdefault((tuple(ids), tuple(mask)), []).append(i)
    return list(groups.values())


def pack_shared_prefix(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                       response_attention_mask: torch.Tensor, pad_token_id: int = 0,
                       min_group: int = 2) -> PackedBatch | None:
    """Pack a canonical micro-batch by shared prompt; None when no prompt is shared by ``min_group`` rows (then
    packing saves nothing and the caller runs the plain padded forward)."""
    groups = shared_prompt_groups(prompt_ids, prompt_mask)
    if not groups or max(len(g) for g in groups) < min_group:
        return None
    b, t_width = response_ids.shape
    lengths = response_attention_mask.sum(-1).tolist()
    seqs, segs, poss = [], [], []
    gather_group = torch.zeros((b, t_width), dtype=torch.long)
    gather_pos = torch.zeros((b, t_width), dtype=torch.long)
    for g, rows in enumerate(groups):
        prompt = prompt_ids[rows[0]][prompt_mask[rows[0]].bool()]
        p = int(prompt.numel())
        ids, seg, pos = [prompt], [torch.zeros(p, dtype=torch.long)], [torch.arange(p)]
        start = p
        for j, row in enumerate(rows, 1):
            n = int(lengths[row])
            ids.append(response_ids[row, :n])
            seg.append(torch.full((n,), j, dtype=torch.long))
            pos.append(torch.arange(p, p + n))
            # token 0 is predicted from the last prompt token, token t from the response's token t-1
            where = torch.full((t_width,), p - 1, dtype=torch.long)
            if n > 1:
                where[1:n] = torch.arange(start, start + n - 1)
            gather_group[row] = g
            gather_pos[row] = where
            start += n
        seqs.append(torch.cat(ids))
        segs.append(torch.cat(seg))
        poss.append(torch.cat(pos))
    width = max(int(s.numel()) for s in seqs)
    n_groups = len(groups)
    input_ids = torch.full((n_groups, width), pad_token_id, dtype=torch.long)
    segment = torch.full((n_groups, width), -1, dtype=torch.long)   # -1: tail padding
    position_ids = torch.zeros((n_groups, width), dtype=torch.long)
    for g, (s, sg, ps) in enumerate(zip(seqs, segs, poss)):
        input_ids[g, :s.numel()] = s
        segment[g, :s.numel()] = sg
        position_ids[g, :s.numel()] = ps
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    q_seg, k_seg = segment[:, :, None], segment[:, None, :]
    # causal, and the key is in the prompt or in the query's own segment (tail padding sees only tail padding)
    allowed = causal[None] & (((k_seg == 0) & (q_seg >= 0)) | (k_seg == q_seg))
    return PackedBatch(input_ids, allowed[:, None], position_ids, gather_group, gather_pos)
