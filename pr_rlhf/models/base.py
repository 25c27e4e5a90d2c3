"""The one engine interface every backend (hf, vllm, openai) implements, and its plain data types.

A prompt is either raw text (sent as is) or a chat: a list of ``{"role", "content"}`` messages, which local
backends render with the model's chat template (adding the assistant turn) and HTTP backends send to the chat
endpoint. Engines never raise on a single failed request: the :class:`Generation` carries ``error`` and callers
count it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Union, runtime_checkable

Message = dict          # {"role": str, "content": str}
Prompt = Union[str, list]  # raw text, or a list of Message


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1                      # samples per prompt (the prompt is computed once for all n)
    temperature: float = 0.0        # 0 means greedy
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None         # per-request seed (sampling is reproducible given the seed)
    stop: tuple[str, ...] = ()
    logprobs: bool = False          # return the log-probability of each generated token

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Sample:
    """One completion. Conventions shared by every backend (the local ones agree token for token):

    ``token_ids`` include the eos token when the model emitted it and the token that completed a stop string
    (HTTP backends fill them only when the server returns them, as vLLM's does); ``text`` excludes special
    tokens and is cut before the first stop string; ``logprobs`` are the model's raw log-probabilities of the
    chosen tokens (temperature 1, before top-p), like vLLM's default.
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None   # one per generated token when requested
    finish_reason: str = "stop"           # "stop" | "length"


@dataclass
class Generation:
    """All samples for one prompt, or the error that prevented them (after retries)."""

    samples: list[Sample] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@runtime_checkable
class Engine(Protocol):
    name: str

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        """One Generation per prompt, in order."""

    def score_continuations(self, prefix: Prompt, continuations: list[str]) -> list[float]:
        """Sum of token log-probabilities of each continuation after the shared prefix (computed once)."""

    def close(self) -> None:
        """Release processes, threads and memory."""
