"""Forward passes of the learner's models over a canonical micro-batch (``pr_rlhf.rl.batches.collate``): the
per-token log-probs (and entropies) of the responses under a causal LM, and the critic's values.

Outputs are float32 ``[b, T]`` aligned with ``response_ids``: ``logprob[i, t] = log pi(response[i, t] | prompt_i +
response[i, :t])`` (logits divided by ``temperature``), ``values[i, t] = V(prompt_i + response[i, :t])``; a reward
model's scores are ``[b]``, read at each row's last response token. Pure torch (no Ray): the model may be a plain
module or an FSDP2-sharded one.
"""
from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from pr_rlhf.algos import entropy_from_logits
from pr_rlhf.rl.packing import pack_shared_prefix


def _inputs(mb: Mapping[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt + response token ids, attention mask, and position ids that skip the left padding."""
    input_ids = torch.cat([mb["prompt_ids"], mb["response_ids"]], dim=1).to(device)
    attention = torch.cat([mb["prompt_mask"], mb["response_attention_mask"]], dim=1).to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention, positions


def response_logprobs(model: nn.Module, mb: Mapping[str, torch.Tensor], *, device: torch.device,
                      autocast: AbstractContextManager, temperature: float = 1.0, shared_prefix: bool = False,
                      pad_token_id: int = 0, with_entropy: bool = False,
                      entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs ``[b, T]`` of the response tokens, and their entropies when ``with_entropy`` (with a
    gradient only when ``entropy_grad``). ``shared_prefix``: a prompt shared by several rows is computed once
    (exactly the same log-probs, fewer tokens); ``autocast`` wraps the model call."""
    packed = None
    if shared_prefix:
        packed = pack_shared_prefix(mb["prompt_ids"], mb["prompt_mask"], mb["response_ids"],
                                    mb["response_attention_mask"], pad_token_id)
    if packed is not None:  # a group's prompt once, its responses after it
        with autocast:
            out = model(input_ids=packed.input_ids.to(device), attention_mask=packed.attention_mask.to(device),
                        position_ids=packed.position_ids.to(device), use_cache=False)
        logits = out.logits[packed.gather_group.to(device), packed.gather_pos.to(device)].float()
    else:
        input_ids, attention, positions = _inputs(mb, device)
        with autocast:
            out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=False,
                        logits_to_keep=mb["response_ids"].shape[1] + 1)
        logits = out.logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = mb["response_ids"].to(device)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    entropy = None
    if with_entropy:
        with torch.no_grad() if not entropy_grad else nullcontext():
            entropy = entropy_from_logits(logits)
    return logp, entropy


def response_values(critic: nn.Module, mb: Mapping[str, torch.Tensor], *, device: torch.device,
                    autocast: AbstractContextManager) -> torch.Tensor:
    """The critic's values ``[b, T]`` before each response token (``pr_rlhf.rl.modeling.CriticModel``)."""
    input_ids, attention, positions = _inputs(mb, device)
    with autocast:
        values = critic(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                        keep_last=mb["response_ids"].shape[1] + 1)
    return values[:, :-1].float()


def sequence_rewards(reward_model: nn.Module, mb: Mapping[str, torch.Tensor], *, device: torch.device,
                     autocast: AbstractContextManager) -> torch.Tensor:
    """A reward model's scores ``[b]`` of prompt + response, read at each row's last response token
    (``pr_rlhf.rl.modeling.RewardModel``)."""
    input_ids, attention, positions = _inputs(mb, device)
    last = mb["prompt_ids"].shape[1] + mb["response_attention_mask"].sum(-1).to(device) - 1
    with autocast:
        scores = reward_model(input_ids=input_ids, attention_mask=attention, position_ids=positions, last=last)
    return scores.float()
