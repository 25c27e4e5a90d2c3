"""The middleware Serve's proxy loads so that the reward service's routes answer 503 + Retry-After, never 404,
while it starts (`pr_rlhf.serve.starting`): the proxy's own not-found under the route prefix becomes a 503; the
application's own 404 (JSON) and a 404 outside the prefix pass unchanged."""
from __future__ import annotations

import asyncio
import json

from pr_rlhf.serve.starting import RETRY_AFTER_S, StartingMiddleware


def proxy_not_found(path: str):
    """Ray Serve's proxy answering a path no application serves (its plain-text body)."""
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": f"Path '{path}' not found. Ping http://... ".encode()})
    return app


async def application_not_found(scope, receive, send):
    await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"detail": "unknown user u-9"}'})


async def created(scope, receive, send):
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def call(app, path: str, prefix: str = "/") -> list[dict]:
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    asyncio.run(StartingMiddleware(app, prefix=prefix)({"type": "http", "path": path}, receive, send))
    return sent


def test_the_proxys_not_found_under_the_prefix_becomes_503_with_retry_after():
    start, body = call(proxy_not_found("/reward/feedback"), "/reward/feedback", prefix="/reward")
    assert start["status"] == 503
    assert dict(start["headers"])[b"retry-after"] == str(RETRY_AFTER_S).encode()
    assert json.loads(body["body"])["retry_after_s"] == RETRY_AFTER_S


def test_the_applications_own_404_and_other_answers_pass_unchanged():
    start, body = call(application_not_found, "/reward/users/u-9", prefix="/reward")
    assert (start["status"], body["body"]) == (404, b'{"detail": "unknown user u-9"}')
    assert call(created, "/feedback")[0]["status"] == 201


def test_a_404_outside_the_prefix_passes_unchanged():
    start, _ = call(proxy_not_found("/elsewhere"), "/elsewhere", prefix="/reward")
    assert start["status"] == 404
    # a path that merely starts with the prefix's letters is not under it
    assert call(proxy_not_found("/rewards"), "/rewards", prefix="/reward")[0]["status"] == 404
