"""While the reward service starts (or its application is redeployed), its routes answer 503 with Retry-After,
never 404.

Ray Serve's HTTP proxy binds its port before the application's routes exist and answers every request for a path
no application serves with a plain-text 404 ("Path '/feedback' not found"); a client is right to treat a 404 as
final, so a write sent then is lost. This ASGI middleware runs inside Serve's proxy (Serve's own hook: the
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` variable names :func:`middlewares`) and turns exactly that response,
for a path under the service's route prefix, into ``503 Service Unavailable`` with ``Retry-After``. The
application's own 404s (an unknown user: JSON from the application) pass unchanged, as does a 404 for a path
outside the prefix.
"""
from __future__ import annotations

import json
import os
from typing import Any

CALLBACK_VARIABLE = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
CALLBACK = "pr_rlhf.serve.starting:middlewares"
PREFIX_VARIABLE = "PR_RLHF_SERVE_ROUTE_PREFIX"
RETRY_AFTER_S = 1
# the start of the proxy's own not-found body (ray.serve._private.proxy.HTTPProxy.not_found_response)
_PROXY_NOT_FOUND = b"Path '"


def proxy_environment(route_prefix: str) -> dict[str, str]:
    """The variables Serve's proxy processes need to load this middleware for a service at ``route_prefix``."""
    return {CALLBACK_VARIABLE: CALLBACK, PREFIX_VARIABLE: route_prefix}


class StartingMiddleware:
    """Pure ASGI: a 404 the proxy itself produced for a path under ``prefix`` becomes a 503 with Retry-After."""

    def __init__(self, app: Any, prefix: str = "/") -> None:
        self.app = app
        self.prefix = "/" + prefix.strip("/")

    def _ours(self, path: str) -> bool:
        return self.prefix == "/" or path == self.prefix or path.startswith(self.prefix + "/")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or not self._ours(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        held: list[dict] = []

        async def checked_send(message: dict) -> None:
            if message["type"] == "http.response.start" and message.get("status") == 404:
                held.append(message)   # decide on the body: the proxy's own text, or the application's JSON
                return
            if held and message["type"] == "http.response.body":
                start = held.pop()
                if bytes(message.get("body", b"")).startswith(_PROXY_NOT_FOUND):
                    await _send_starting(send)
                    return
                await send(start)
            await send(message)

        await self.app(scope, receive, checked_send)


async def _send_starting(send: Any) -> None:
    body = json.dumps({"detail": "the reward service is starting: retry", "retry_after_s": RETRY_AFTER_S}).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"retry-after", str(RETRY_AFTER_S).encode()),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def middlewares() -> list:
    """Serve's proxy callback: the middleware for the route prefix in ``$PR_RLHF_SERVE_ROUTE_PREFIX``."""
    from starlette.middleware import Middleware

    return [Middleware(StartingMiddleware, prefix=os.environ.get(PREFIX_VARIABLE, "/"))]
