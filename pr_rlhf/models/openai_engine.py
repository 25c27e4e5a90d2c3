"""The HTTP backend: any OpenAI-compatible server (vLLM's, a hosted API) through ``httpx.AsyncClient``.

- Chat prompts go to ``/chat/completions``, raw text to ``/completions``; at most ``concurrency`` requests are in
  flight; each has a timeout.
- Connection errors, timeouts, 429 and 5xx are retried with exponential backoff and jitter (429's Retry-After
  is honoured, within limits; ``pr_rlhf.retry``); other 4xx are not. When a request has used up its retries on
  connection errors, or max(4, 2 x concurrency) connections in a row were refused with no success in between,
  the server is taken as down for the rest of the call: requests not yet sent (and pending retries) fail at once
  instead of each waiting through its own retries.
- ``stats``: ``requests`` (sent), ``retries`` (extra attempts), ``failures`` (requests that failed for good,
  including those failed fast or cut by the deadline), ``fallbacks`` (optional features dropped).
- Optional features are tried first and dropped, for the rest of the engine's life, when the server rejects
  them with 400/422: ``n`` (then n separate requests are sent) and vLLM's ``return_token_ids``.
- A request that still fails becomes ``Generation(error=...)``, counted in ``stats``; ``generate`` never
  raises and never waits past ``deadline_s``.
- The API key is read from the environment variable named by ``api_key_env`` and sent as a Bearer token. It is
  kept in a :class:`Secret` (its repr is masked), never logged, and removed from every error message.
- ``generate`` is synchronous and safe to call from inside a running event loop (it then runs its own loop in
  a worker thread); ``agenerate`` is the coroutine.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import random
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pr_rlhf.models.base import Generation, Prompt, Sample, SamplingParams
from pr_rlhf.models.prompting import (
    encode_continuation,
    encode_prompt,
    is_chat,
    load_tokenizer,
    replicate,
)
from pr_rlhf.retry import RETRY_STATUS, Backoff, retry_after_s

if TYPE_CHECKING:  # pragma: no cover
    import httpx

    from pr_rlhf.configs.base import OpenAIEngineConfig

log = logging.getLogger(__name__)

FEATURE_REJECTED_STATUS = frozenset({400, 422})
MAX_BACKOFF_S = 30.0


class OpenAIEngineError(RuntimeError):
    """A request that failed for good (after retries), or a server that lacks what was asked."""


class ScoringUnsupportedError(OpenAIEngineError):
    """The server cannot score continuations (no ``echo`` + ``logprobs`` on ``/completions``)."""


class Secret:
    """A string that never shows itself in repr/str/logs."""

    __slots__ = ("_value",)

    def __init__(self, value: str | None) -> None:
        self._value = value or None

    def reveal(self) -> str | None:
        return self._value

    def __bool__(self) -> bool:
        return self._value is not None

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret(None)"

    __str__ = __repr__


@dataclass
class _Failure(Exception):
    message: str
    retryable: bool
    connection: bool = False       # the server could not be reached at all
    retry_after_s: float | None = None
    status: int | None = None


class OpenAIEngine:
    name = "openai"

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY", concurrency: int = 8,
                 timeout_s: float = 60.0, max_retries: int = 3, backoff_s: float = 0.5,
                 deadline_s: float | None = None, tokenizer_dir: str | None = None, seed: int = 0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self._api_key = Secret(os.environ.get(api_key_env))
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff = Backoff(backoff_s, MAX_BACKOFF_S, random.Random(seed))  # seeded jitter
        self.deadline_s = deadline_s  # whole generate/score call; None: bounded by the per-request limits
        self.tokenizer_dir = tokenizer_dir  # optional local tokenizer: exact token ids for scoring
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        self._supports = {"n": True, "return_token_ids": True}
        self.stats: dict[str, int] = {"requests": 0, "retries": 0, "failures": 0, "fallbacks": 0}
        # the tokens the server says it processed (the response's ``usage``): what a hosted API bills
        self.usage: dict[str, int] = {"prompt_tokens": 0, "completion_tokens": 0}

    @classmethod
    def from_config(cls, cfg: OpenAIEngineConfig) -> OpenAIEngine:
        from pr_rlhf.models.sources import ModelSourceError, resolve_model

        # A local spec (tiny, smollm2, a directory) is served under its directory path (vLLM's default served
        # name) and gives us its tokenizer; any other name is the served model name as is.
        try:
            local_dir: str | None = resolve_model(cfg.model)
            if not os.path.isdir(local_dir):
                local_dir = None
        except ModelSourceError:
            local_dir = None
        return cls(cfg.base_url, local_dir or cfg.model, api_key_env=cfg.api_key_env, concurrency=cfg.concurrency,
                   timeout_s=cfg.timeout_s, max_retries=cfg.max_retries, backoff_s=cfg.backoff_s,
                   tokenizer_dir=local_dir, seed=cfg.seed)

    def __repr__(self) -> str:
        return (f"OpenAIEngine(base_url={self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r}, "
                f"api_key={self._api_key!r})")

    __str__ = __repr__

    # -- sync wrappers ---------------------------------------------------------------------------------------
    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        return _run_sync(lambda: self.agenerate(prompts, params))

    def score_continuations(self, prefix: Prompt, continuations: list[str]) -> list[float]:
        return _run_sync(lambda: self.ascore_continuations(prefix, continuations))

    def close(self) -> None:
        pass  # clients live only for the duration of one call

    # -- generation ------------------------------------------------------------------------------------------
    async def agenerate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        import httpx

        call = _Call(asyncio.Semaphore(self.concurrency))
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits, headers=self._headers()) as client:
            tasks = [asyncio.create_task(self._generate_one(client, call, p, params)) for p in prompts]
            _, pending = await asyncio.wait(tasks, timeout=self.deadline_s) if tasks else (set(), set())
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        results = []
        for task in tasks:
            if task in pending:
                self._count("failures")
                results.append(Generation(error=f"deadline of {self.deadline_s}s exceeded"))
            else:
                results.append(task.result())
        return results

    async def _generate_one(self, client: httpx.AsyncClient, call: _Call, prompt: Prompt,
                            params: SamplingParams) -> Generation:
        try:
            if params.greedy:  # all n greedy samples are the same (vLLM refuses n > 1 with greedy): ask once
                samples, prompt_ids = await self._request_samples(client, call, prompt, params, 1)
                return Generation(samples=replicate(samples, params.n), prompt_token_ids=prompt_ids)
            if params.n > 1 and not self._supports["n"]:
                return await self._generate_separately(client, call, prompt, params)
            samples, prompt_ids = await self._request_samples(client, call, prompt, params, params.n)
            if len(samples) < params.n:  # a server that silently ignores n
                samples += (await self._generate_separately(client, call, prompt, params,
                                                            params.n - len(samples))).samples
            return Generation(samples=samples, prompt_token_ids=prompt_ids)
        except _Failure as failure:
            if failure.status in FEATURE_REJECTED_STATUS and params.n > 1 and self._supports["n"]:
                return await self._fall_back_to_single_samples(client, call, prompt, params)
            self._count("failures")
            return Generation(error=self._redact(failure.message))

    async def _fall_back_to_single_samples(self, client: httpx.AsyncClient, call: _Call, prompt: Prompt,
                                           params: SamplingParams) -> Generation:
        """A 400 on an n > 1 request: if n = 1 requests work, the server rejects n; use them from now on."""
        try:
            generation = await self._generate_separately(client, call, prompt, params)
        except _Failure as failure:  # the request itself was bad, not n
            self._count("failures")
            return Generation(error=self._redact(failure.message))
        if self._supports["n"]:
            self._supports["n"] = False
            self._count("fallbacks")
        return generation

    async def _generate_separately(self, client: httpx.AsyncClient, call: _Call, prompt: Prompt,
                                   params: SamplingParams, count: int | None = None) -> Generation:
        count = params.n if count is None else count
        seeds = [None if params.seed is None else params.seed + k for k in range(count)]
        groups = await asyncio.gather(*(self._request_samples(client, call, prompt, params, 1, seed=s)
                                        for s in seeds))
        return Generation(samples=[s for samples, _ in groups for s in samples], prompt_token_ids=groups[0][1])

    async def _request_samples(self, client: httpx.AsyncClient, call: _Call, prompt: Prompt,
                               params: SamplingParams, n: int,
                               seed: int | None = ...) -> tuple[list[Sample], list[int] | None]:
        chat = is_chat(prompt)
        body: dict[str, Any] = {"model": self.model, "max_tokens": params.max_tokens,
                                "temperature": params.temperature, "top_p": params.top_p}
        body["messages" if chat else "prompt"] = prompt
        if n > 1:
            body["n"] = n
        seed = params.seed if seed is ... else seed
        if seed is not None:
            body["seed"] = seed
        if params.stop:
            body["stop"] = list(params.stop)
        if params.logprobs:
            body["logprobs"] = True if chat else 0
        data = await self._post_with_features(client, call, "/chat/completions" if chat else "/completions", body)
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        with self._lock:
            for key in self.usage:
                if isinstance(usage.get(key), int):
                    self.usage[key] += usage[key]
        choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
        if not choices:
            raise _Failure("response has no choices", retryable=False)
        # vLLM's return_token_ids puts the prompt ids at the top (chat) or in each choice (completions).
        prompt_ids = data.get("prompt_token_ids") or choices[0].get("prompt_token_ids")
        return [self._parse_choice(c, chat, params.logprobs) for c in choices], prompt_ids

    @staticmethod
    def _parse_choice(choice: dict, chat: bool, want_logprobs: bool) -> Sample:
        text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
        logprobs = None
        lp = choice.get("logprobs")
        if want_logprobs and lp:
            logprobs = ([float(t["logprob"]) for t in lp.get("content") or []] if chat
                        else [float(x) for x in lp.get("token_logprobs") or [] if x is not None])
        finish = choice.get("finish_reason")
        return Sample(text=text or "", token_ids=list(choice.get("token_ids") or []), logprobs=logprobs,
                      finish_reason="length" if finish == "length" else "stop")

    # -- scoring ---------------------------------------------------------------------------------------------
    async def ascore_continuations(self, prefix: Prompt, continuations: list[str]) -> list[float]:
        """Sum log p(continuation | prefix) via ``/completions`` with ``echo`` and prompt logprobs.

        With a local tokenizer the prompt is sent as token ids (prefix ids + continuation ids, exactly as the
        local engines score); without one, as text, and the continuation's tokens are found by text offset.
        Raises :class:`OpenAIEngineError` when a request fails for good.
        """
        import httpx

        if is_chat(prefix) and self.tokenizer_dir is None:
            raise ScoringUnsupportedError("scoring a chat prefix over HTTP needs the model's chat template: "
                                          "give the engine a local tokenizer_dir")
        call = _Call(asyncio.Semaphore(self.concurrency))
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self._headers()) as client:
            jobs = [self._score_one(client, call, prefix, c) for c in continuations]
            try:
                return list(await asyncio.wait_for(asyncio.gather(*jobs), timeout=self.deadline_s))
            except TimeoutError:
                raise OpenAIEngineError(f"scoring: deadline of {self.deadline_s}s exceeded") from None

    async def _score_one(self, client: httpx.AsyncClient, call: _Call, prefix: Prompt, continuation: str) -> float:
        if not continuation:
            return 0.0
        tok = self._local_tokenizer()
        body: dict[str, Any] = {"model": self.model, "max_tokens": 1, "temperature": 0.0, "echo": True,
                                "logprobs": 0}
        if tok is not None:
            prefix_ids = encode_prompt(tok, prefix)
            cont_ids = encode_continuation(tok, continuation)
            if not cont_ids:
                return 0.0
            body["prompt"] = prefix_ids + cont_ids
        else:
            body["prompt"] = prefix + continuation
        try:
            data = await self._post(client, call, "/completions", body)
        except _Failure as failure:
            self._count("failures")
            if failure.status in FEATURE_REJECTED_STATUS:
                raise ScoringUnsupportedError("the server does not score prompts (/completions with echo and "
                                              f"logprobs): {self._redact(failure.message)}") from None
            raise OpenAIEngineError(f"scoring failed: {self._redact(failure.message)}") from None
        lp = ((data.get("choices") or [{}])[0]).get("logprobs") or {}
        values = lp.get("token_logprobs")
        if not values:
            raise ScoringUnsupportedError("the server returned no prompt logprobs for echo=true")
        if tok is not None:
            start = len(prefix_ids)
            picked = values[start:start + len(cont_ids)]
        else:
            offsets = lp.get("text_offset") or []
            boundary, end = len(prefix), len(prefix) + len(continuation)
            # A token belongs to the continuation when it ends after the boundary (BPE may merge across it).
            ends = offsets[1:] + [end]
            picked = [v for off, stop, v in zip(offsets, ends, values) if stop > boundary and off < end]
        if any(v is None for v in picked):
            raise ScoringUnsupportedError("the server returned no logprob for a continuation token")
        return float(sum(picked))

    # -- HTTP ------------------------------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        key = self._api_key.reveal()
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _post_with_features(self, client: httpx.AsyncClient, call: _Call, path: str, body: dict) -> dict:
        """POST with vLLM's optional extras; drop them for good if the server rejects them."""
        if self._supports["return_token_ids"]:
            try:
                return await self._post(client, call, path, {**body, "return_token_ids": True})
            except _Failure as failure:
                if failure.status not in FEATURE_REJECTED_STATUS or "return_token_ids" not in failure.message:
                    raise
                self._supports["return_token_ids"] = False
                self._count("fallbacks")
        return await self._post(client, call, path, body)

    async def _post(self, client: httpx.AsyncClient, call: _Call, path: str, body: dict) -> dict:
        attempt = 0
        while True:
            if call.server_down:
                raise _Failure("server unreachable (failing fast after earlier connection failures)",
                               retryable=False, connection=True)
            try:
                async with call.semaphore:
                    if call.server_down:
                        continue
                    if attempt == 0:
                        self._count("requests")  # sent, not merely queued
                    data = await self._post_once(client, path, body)
                    call.refused_in_a_row = 0
                    return data
            except _Failure as failure:
                if failure.connection:
                    call.refused_in_a_row += 1
                    if call.refused_in_a_row >= max(4, 2 * self.concurrency):
                        call.server_down = True  # nothing listens any more: stop sending
                if not failure.retryable or attempt >= self.max_retries:
                    if failure.connection and failure.retryable:
                        call.server_down = True
                    raise _Failure(f"{failure.message} (after {attempt + 1} attempts)", retryable=False,
                                   connection=failure.connection, status=failure.status) from None
                attempt += 1
                self._count("retries")
                log.debug("retry %d of %s: %s", attempt, path, self._redact(failure.message))
                await asyncio.sleep(self.backoff.delay(attempt, failure.retry_after_s))

    async def _post_once(self, client: httpx.AsyncClient, path: str, body: dict) -> dict:
        import httpx

        try:
            response = await client.post(self.base_url + path, json=body)
        except httpx.TimeoutException as exc:
            raise _Failure(f"timeout after {self.timeout_s}s ({type(exc).__name__})", retryable=True) from None
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise _Failure(f"connection error ({type(exc).__name__}: {exc})", retryable=True,
                           connection=isinstance(exc, httpx.ConnectError)) from None
        except httpx.HTTPError as exc:
            raise _Failure(f"HTTP error ({type(exc).__name__}: {exc})", retryable=True) from None
        if response.status_code == 200:
            try:
                return response.json()
            except ValueError:
                raise _Failure("response is not JSON", retryable=True) from None
        detail = response.text[:300].replace("\n", " ")
        raise _Failure(f"HTTP {response.status_code} from {path}: {detail}",
                       retryable=response.status_code in RETRY_STATUS,
                       retry_after_s=retry_after_s(response.headers.get("retry-after")),
                       status=response.status_code)

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] = self.stats.get(key, 0) + 1

    def _redact(self, text: str) -> str:
        key = self._api_key.reveal()
        return text.replace(key, "***") if key else text

    def _local_tokenizer(self) -> Any:
        if self._tokenizer is None and self.tokenizer_dir is not None:
            self._tokenizer = load_tokenizer(self.tokenizer_dir)
        return self._tokenizer


@dataclass
class _Call:
    """Per-call state: the concurrency bound and whether the server is known to be down."""

    semaphore: asyncio.Semaphore
    server_down: bool = False
    refused_in_a_row: int = 0      # connection failures with no success in between


def _run_sync(make_coro: Any) -> Any:
    """Run a coroutine to completion from sync code, also when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coro())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="openai-engine") as pool:
        return pool.submit(lambda: asyncio.run(make_coro())).result()
