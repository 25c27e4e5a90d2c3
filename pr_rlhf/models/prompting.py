"""Prompt rendering and tokenization shared by the local engines, so hf and vllm see identical token ids.

- A chat prompt (list of messages) is rendered with the model's chat template plus the assistant opener and
  tokenized without extra special tokens (the template already holds them).
- A raw text prompt is tokenized as the tokenizer does by default (what vLLM does with a text prompt).
- A continuation is tokenized on its own (no special tokens) and appended to the prefix ids: scores then do
  not depend on how BPE would merge across the boundary, and both local engines agree exactly.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from pr_rlhf.models.base import Generation, Prompt, Sample


def load_tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def is_chat(prompt: Prompt) -> bool:
    return isinstance(prompt, list)


def render_chat(tokenizer: Any, messages: list) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    if is_chat(prompt):
        return list(tokenizer(render_chat(tokenizer, prompt), add_special_tokens=False).input_ids)
    if not isinstance(prompt, str):
        raise TypeError(f"a prompt is a string or a list of messages, got {type(prompt).__name__}")
    return list(tokenizer(prompt).input_ids)


def encode_prompts(tokenizer: Any, prompts: list[Prompt], max_model_len: int
                   ) -> tuple[list[Generation | None], list[tuple[int, list[int]]]]:
    """Token ids of each prompt that fits the model, and a failed Generation in the slot of each one that does not
    (a malformed or too-long prompt fails alone instead of failing the whole batch)."""
    results: list[Generation | None] = [None] * len(prompts)
    encoded: list[tuple[int, list[int]]] = []
    for i, prompt in enumerate(prompts):
        try:
            ids = encode_prompt(tokenizer, prompt)
        except Exception as exc:  # noqa: BLE001 -- a malformed prompt fails alone
            results[i] = Generation(error=f"bad prompt: {exc}")
            continue
        if not ids or len(ids) >= max_model_len:
            results[i] = Generation(prompt_token_ids=ids, error=f"prompt has {len(ids)} tokens; the model "
                                    f"accepts 1..{max_model_len - 1}")
            continue
        encoded.append((i, ids))
    return results, encoded


def encode_continuation(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Index where the earliest stop string starts in ``text``, or None."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


def replicate(samples: list[Sample], n: int) -> list[Sample]:
    """Greedy decoding is computed once; the n requested samples are independent copies of it."""
    if len(samples) >= n:
        return samples
    return samples + [dataclasses.replace(samples[0], token_ids=list(samples[0].token_ids),
                                          logprobs=None if samples[0].logprobs is None else list(samples[0].logprobs))
                      for _ in range(n - len(samples))]
