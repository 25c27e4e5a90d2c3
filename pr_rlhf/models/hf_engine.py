"""The transformers backend: generation and continuation scoring with the prompt computed once.

HF ``generate(num_return_sequences=n)`` prefills n copies of the prompt. Here a batch of prompts (left padded)
is prefilled once into a ``DynamicCache``, the cache is expanded with ``batch_repeat_interleave(n)``, and a
small decode loop samples the n continuations. Owning the loop gives per-token log-probabilities for free,
per-prompt seeded generators (samples do not depend on how prompts were batched), stop strings and
per-sequence length limits, with the same conventions as vLLM:

- ``token_ids`` include the eos token when the model emitted it, and the token that completed a stop string;
- ``text`` is the decoded tokens without special tokens, cut before the first stop string;
- ``logprobs`` are log-softmax of the raw logits (the model's distribution at temperature 1, before top-p),
  like vLLM's default ``raw_logprobs``.
"""
from __future__ import annotations

import copy
import functools
import dataclasses
import itertools
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pr_rlhf.models.base import Generation, Prompt, Sample, SamplingParams
from pr_rlhf.models.prompting import (
    encode_continuation,
    encode_prompt,
    encode_prompts,
    find_stop,
    load_tokenizer,
    replicate,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pr_rlhf.configs.base import HFEngineConfig


def quiet_hf_loading() -> None:
    """Silence transformers' per-model loading bars and load reports (a fresh score head is expected here):
    they would interleave with the pipeline's own progress output."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _torch_dtype(name: str) -> Any:
    import torch

    return "auto" if name == "auto" else getattr(torch, name)


class HFEngine:
    name = "hf"

    def __init__(self, model_dir: str, *, dtype: str = "float32", device: str = "cpu", max_model_len: int = 2048,
                 seed: int = 0, max_batch_sequences: int = 64, share_prefix: bool = True) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.model_dir = model_dir
        self.device = torch.device(device)
        self.max_model_len = max_model_len
        self.seed = seed
        self.max_batch_sequences = max_batch_sequences  # prompts x n decoded together
        self.share_prefix = share_prefix  # False only to measure or test against the n-copies prefill
        quiet_hf_loading()
        self.tokenizer = load_tokenizer(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=_torch_dtype(dtype),
                                                          attn_implementation="sdpa").to(self.device).eval()
        self.eos_ids = self._eos_ids()
        self._calls = itertools.count()

    @classmethod
    def from_config(cls, cfg: HFEngineConfig) -> HFEngine:
        from pr_rlhf.models.sources import resolve_model

        return cls(resolve_model(cfg.model), dtype=cfg.dtype, device=cfg.device, max_model_len=cfg.max_model_len,
                   seed=cfg.seed)

    def __repr__(self) -> str:
        return f"HFEngine(model_dir={self.model_dir!r}, device={str(self.device)!r})"

    def sleep(self, level: int = 1) -> None:
        """A colocated learner updates: on a GPU the model moves to host memory (any level; it holds no KV cache
        between calls); on CPU there is nothing to free."""
        if self.device.type == "cuda":
            import torch

            self.model.to("cpu")
            torch.cuda.empty_cache()

    def wake_up(self, tags: list[str] | None = None) -> None:
        if self.device.type == "cuda" and (tags is None or "weights" in tags):
            self.model.to(self.device)

    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        config_eos = self.model.generation_config.eos_token_id
        ids |= set(config_eos) if isinstance(config_eos, list) else {config_eos}
        return {i for i in ids if i is not None}

    # -- generation ------------------------------------------------------------------------------------------
    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        call_seed = params.seed if params.seed is not None else self.seed * 1_000_003 + next(self._calls)
        results, encoded = encode_prompts(self.tokenizer, prompts, self.max_model_len)
        # Similar lengths together: less padding. Results go back to their prompt's slot.
        encoded.sort(key=lambda item: len(item[1]))
        # Greedy samples are all the same: decode once, copy (as the vllm backend must).
        decode_params = dataclasses.replace(params, n=1) if params.greedy else params
        per_batch = max(1, self.max_batch_sequences // decode_params.n)
        for start in range(0, len(encoded), per_batch):
            chunk = encoded[start:start + per_batch]
            batch = self._generate_batch([ids for _, ids in chunk], decode_params, call_seed)
            for (i, ids), samples in zip(chunk, batch):
                results[i] = Generation(samples=replicate(samples, params.n), prompt_token_ids=ids)
        return [r if r is not None else Generation(error="not generated") for r in results]

    def _generate_batch(self, batch: list[list[int]], params: SamplingParams, seed: int) -> list[list[Sample]]:
        import torch
        from transformers import DynamicCache

        n, dev = params.n, self.device
        input_ids, mask = self._left_pad(batch)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        limits = [min(params.max_tokens, self.max_model_len - len(ids)) for ids in batch]
        expand = n if self.share_prefix else 1
        if not self.share_prefix:  # reference path: n full copies of each prompt, as HF generate does
            input_ids, mask, positions = (t.repeat_interleave(n, dim=0) for t in (input_ids, mask, positions))
        cache = growing_cache(DynamicCache(config=self.model.config))
        with torch.inference_mode():
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                             past_key_values=cache, use_cache=True, logits_to_keep=1)
            # The prompt was computed once per prompt; now its n rows share that cache.
            cache.batch_repeat_interleave(expand)
            logits = out.logits[:, -1, :].float().repeat_interleave(expand, dim=0)
            mask = mask.repeat_interleave(expand, dim=0)
            next_pos = positions[:, -1:].repeat_interleave(expand, dim=0) + 1
            rows = len(batch) * n
            row_limit = [limits[r // n] for r in range(rows)]
            generators = [torch.Generator(device=dev).manual_seed(seed) for _ in batch]  # one per prompt
            tokens: list[list[int]] = [[] for _ in range(rows)]
            logps: list[list[float]] = [[] for _ in range(rows)]
            finish: list[str | None] = [None] * rows
            for step in range(max(row_limit)):
                logprobs = torch.log_softmax(logits, dim=-1)
                chosen = self._choose(logits, params, generators, n)
                chosen_lp = logprobs.gather(1, chosen[:, None])[:, 0].tolist()
                for r, tok in enumerate(chosen.tolist()):
                    if finish[r] is not None:
                        continue
                    tokens[r].append(tok)
                    logps[r].append(chosen_lp[r])
                    if tok in self.eos_ids or (params.stop and find_stop(self._decode(tokens[r]), params.stop)
                                               is not None):
                        finish[r] = "stop"
                    elif len(tokens[r]) >= row_limit[r]:
                        finish[r] = "length"
                if all(f is not None for f in finish):
                    break
                mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=1)
                out = self.model(input_ids=chosen[:, None], attention_mask=mask, position_ids=next_pos,
                                 past_key_values=cache, use_cache=True)
                logits = out.logits[:, -1, :].float()
                next_pos = next_pos + 1
        samples: list[list[Sample]] = []
        for b in range(len(batch)):
            group = []
            for r in range(b * n, (b + 1) * n):
                text = self._decode(tokens[r])
                cut = find_stop(text, params.stop) if params.stop else None
                group.append(Sample(text=text if cut is None else text[:cut], token_ids=tokens[r],
                                    logprobs=logps[r] if params.logprobs else None,
                                    finish_reason=finish[r] or "length"))
            samples.append(group)
        return samples

    def _choose(self, logits: torch.Tensor, params: SamplingParams, generators: list, n: int) -> torch.Tensor:
        import torch

        if params.greedy:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            outside = sorted_probs.cumsum(-1) - sorted_probs > params.top_p  # keep the smallest nucleus
            sorted_probs = sorted_probs.masked_fill(outside, 0.0)
            probs = torch.zeros_like(probs).scatter(1, order, sorted_probs)
        return torch.cat([torch.multinomial(probs[b * n:(b + 1) * n], 1, generator=g)[:, 0]
                          for b, g in enumerate(generators)])

    def _left_pad(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        width = max(len(ids) for ids in batch)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=self.device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=self.device)
        return input_ids, mask

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # -- scoring ---------------------------------------------------------------------------------------------
    def score_continuations(self, prefix: Prompt, continuations: list[str]) -> list[float]:
        """Sum log p(continuation tokens | prefix); the prefix is run once and its cache shared by all."""
        import torch
        from transformers import DynamicCache

        prefix_ids, conts = self._encode_for_scoring(prefix, continuations)
        scores = [0.0] * len(conts)
        todo = [i for i, c in enumerate(conts) if c]
        if not todo:
            return scores
        with torch.inference_mode():
            prefix_cache = DynamicCache(config=self.model.config)
            out = self.model(input_ids=torch.tensor([prefix_ids], device=self.device),
                             past_key_values=prefix_cache, use_cache=True, logits_to_keep=1)
            first_logprobs = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            for start in range(0, len(todo), self.max_batch_sequences):
                chunk = todo[start:start + self.max_batch_sequences]
                cache = copy.deepcopy(prefix_cache)  # the forward appends to it; the prefix stays reusable
                cache.batch_repeat_interleave(len(chunk))
                ids, cont_mask = self._right_pad([conts[i] for i in chunk])
                mask = torch.cat([cont_mask.new_ones(len(chunk), len(prefix_ids)), cont_mask], dim=1)
                positions = torch.arange(len(prefix_ids), len(prefix_ids) + ids.shape[1], device=self.device)
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions.expand_as(ids),
                                    past_key_values=cache, use_cache=True).logits.float()
                for row, total in enumerate(self._sum_logprobs(first_logprobs, logits, ids, cont_mask)):
                    scores[chunk[row]] = total
        return scores

    def score_continuations_naive(self, prefix: Prompt, continuations: list[str]) -> list[float]:
        """Reference: each candidate as one full sequence (prefix recomputed for every candidate)."""
        import torch

        prefix_ids, conts = self._encode_for_scoring(prefix, continuations)
        scores = [0.0] * len(conts)
        with torch.inference_mode():
            for start in range(0, len(conts), self.max_batch_sequences):
                chunk = [i for i in range(start, min(len(conts), start + self.max_batch_sequences)) if conts[i]]
                if not chunk:
                    continue
                ids, mask = self._right_pad([prefix_ids + conts[i] for i in chunk])
                logprobs = torch.log_softmax(self.model(input_ids=ids, attention_mask=mask).logits.float(), -1)
                for row, i in enumerate(chunk):
                    p, c = len(prefix_ids), len(conts[i])
                    targets = ids[row, p:p + c]
                    scores[i] = float(logprobs[row, p - 1:p + c - 1].gather(1, targets[:, None]).sum())
        return scores

    def _encode_for_scoring(self, prefix: Prompt, continuations: list[str]) -> tuple[list[int], list[list[int]]]:
        prefix_ids = encode_prompt(self.tokenizer, prefix)
        conts = [encode_continuation(self.tokenizer, c) for c in continuations]
        longest = len(prefix_ids) + max((len(c) for c in conts), default=0)
        if not prefix_ids:
            raise ValueError("score_continuations needs a non-empty prefix")
        if longest > self.max_model_len:
            raise ValueError(f"prefix + continuation is {longest} tokens; max_model_len is {self.max_model_len}")
        return prefix_ids, conts

    def _right_pad(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        width = max(len(s) for s in seqs)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=self.device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=self.device)
        return ids, mask

    @staticmethod
    def _sum_logprobs(first_logprobs: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor,
                      mask: torch.Tensor) -> list[float]:
        import torch

        # Token 0 is predicted by the prefix's last position; token j>0 by the continuation's position j-1.
        first = first_logprobs[ids[:, 0]]
        rest = torch.log_softmax(logits[:, :-1], dim=-1).gather(2, ids[:, 1:, None])[..., 0]
        return (first + (rest * mask[:, 1:]).sum(dim=1)).tolist()

    # -- weights ---------------------------------------------------------------------------------------------
    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Copy new weights into the model in place (RL weight sync), converted to the model's dtype/device.

        Keys are the model's own ``state_dict`` names; tied weights (``lm_head.weight`` when tied) may be left
        out. Any other missing or unknown key is an error and nothing is half-loaded silently.
        """
        import torch

        known = self.model.state_dict()
        tied = set(getattr(self.model, "_tied_weights_keys", None) or ())
        unexpected = sorted(set(state_dict) - set(known))
        missing = sorted(set(known) - set(state_dict) - tied)
        if unexpected or missing:
            raise ValueError(f"load_weights: state dict does not match the model (missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]})")
        with torch.no_grad():
            self.model.load_state_dict(dict(state_dict), strict=False)

    # weight transfer (pr_rlhf.models.weight_transfer: vLLM's update protocol over gloo); one receiver
    def weight_receivers(self) -> tuple[int, str, str]:
        """(receiving processes, the dtype they take, the transfer backend)."""
        return 1, str(self.model.dtype).removeprefix("torch."), "gloo"

    def _receiver(self):
        from pr_rlhf.models.weight_transfer import ModuleReceiver

        if getattr(self, "_weights_in", None) is None:
            self._weights_in = ModuleReceiver(self.model)
        return self._weights_in

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._receiver().init(init_info)

    def start_weight_update(self) -> None:
        self._receiver().start()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._receiver().update(update_info)

    def finish_weight_update(self) -> None:
        self._receiver().finish()

    def abort_weight_update(self) -> None:
        self._receiver().finish()

    def shutdown_weight_transfer_engine(self) -> None:
        self._receiver().shutdown()

    def close(self) -> None:
        self.model = None
        import gc

        gc.collect()


@functools.lru_cache(maxsize=1)
def _growing_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A dynamic layer whose keys/values are views of a buffer with spare room (capacity doubling)."""

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            old = self.keys.shape[-2] if self.keys.numel() else 0
            new = old + key_states.shape[-2]
            kbuf = getattr(self, "_kbuf", None)
            # a fresh buffer when there is none, it is full, or keys were replaced (e.g. batch_repeat_interleave)
            if kbuf is None or kbuf.shape[-2] < new or kbuf.shape[0] != key_states.shape[0] or \
                    (old and self.keys.data_ptr() != kbuf.data_ptr()):
                shape = (*key_states.shape[:-2], max(2 * new, 64), key_states.shape[-1])
                kbuf, vbuf = key_states.new_empty(shape), value_states.new_empty(shape)
                if old:
                    kbuf[..., :old, :] = self.keys
                    vbuf[..., :old, :] = self.values
                self._kbuf, self._vbuf = kbuf, vbuf
            self._kbuf[..., old:new, :] = key_states
            self._vbuf[..., old:new, :] = value_states
            self.keys, self.values = self._kbuf[..., :new, :], self._vbuf[..., :new, :]
            return self.keys, self.values

    return GrowingLayer


def growing_cache(cache: Any) -> Any:
    """``cache`` with its plain dynamic layers appending into a buffer with spare room, so a decoding step writes
    one token instead of copying the whole cache (``torch.cat`` made decoding quadratic in the generated length:
    at 64 rows x 64 tokens it was 60% of the decoding time of a 4M-parameter model; 92 -> 33 ms per step)."""
    from transformers.cache_utils import DynamicLayer

    for layer in cache.layers:
        if type(layer) is DynamicLayer:
            layer.__class__ = _growing_layer_class()
    return cache
