"""A client of the reward service that retries what is retryable and fails loudly on what is not.

Retried: connection errors (the service is not listening yet, or restarting), timeouts, and the transient statuses
(429, 500, 502, 503, 504; 503 + Retry-After is what the service answers while it starts, ``pr_rlhf.serve.starting``),
waiting as :class:`pr_rlhf.retry.Backoff` says, at least what Retry-After asks. Anything else that is not 2xx
raises :class:`ServiceError` with the status and the service's detail at once: a 4xx means the request itself is
wrong, and repeating it cannot help. Retrying a write is safe where the service makes it idempotent (feedback with
an ``idempotency_key``; scoring has no side effect).
"""
from __future__ import annotations

import random
import time
from typing import Any

from pr_rlhf.retry import RETRY_STATUS, Backoff, retry_after_s


class ServiceError(RuntimeError):
    """A request the service refused (or kept failing after every retry); ``status`` is the last HTTP status
    (None when it never answered)."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.status = status


class ServiceClient:
    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 120.0, retries: int = 8,
                 backoff_s: float = 0.25, max_backoff_s: float = 10.0, seed: int | None = None) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff = Backoff(backoff_s, max_backoff_s, random.Random(seed))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(timeout=timeout_s, headers=headers)
        self.retried = 0   # requests sent again, over this client's life

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """The response's JSON (2xx); raises :class:`ServiceError` otherwise (after the retries, where retryable)."""
        import httpx

        url = self.base_url + path
        failure, status = "", None
        for attempt in range(self.retries + 1):
            wait: float | None = None
            try:
                response = self.http.request(method, url, json=body)
            except (httpx.TransportError, OSError) as exc:   # not listening, reset, timed out
                failure, status = f"{type(exc).__name__}: {exc}", None
            else:
                if response.is_success:
                    return response.json()
                status = response.status_code
                failure = f"HTTP {status}: {response.text[:300]}"
                if status not in RETRY_STATUS:
                    raise ServiceError(f"{method} {path}: {failure}", status)
                wait = retry_after_s(response.headers.get("retry-after"))
            if attempt < self.retries:
                self.retried += 1
                time.sleep(self.backoff.delay(attempt + 1, wait))
        raise ServiceError(f"{method} {path}: gave up after {self.retries + 1} tries: {failure}", status)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
