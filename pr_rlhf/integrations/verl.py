"""verl custom reward function: the personalized reward from the pr_rlhf reward service.

verl (``custom_reward_function.path=pr_rlhf/integrations/verl.py``, ``custom_reward_function.name=compute_score``)
calls ``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`` once per response.
This sends (user, query, response, profile / history / plan) to ``POST /score`` of ``pr-rlhf serve-reward`` and
returns ``{"score": float, "reward_status": str, "reward_latency_ms": float}`` (verl logs the extra keys).

Where things come from:
- the service URL: ``extra_info["reward_url"]``, else ``$PR_RLHF_REWARD_URL`` (default http://127.0.0.1:8000);
- the user: ``extra_info["user_id"]`` (required), the query: ``extra_info["query"]`` (else ``ground_truth``);
  optional ``profile``, ``history``, ``plan``, ``reference``, ``stated_preferences``, ``subset``;
- a bearer token: ``$PR_RLHF_REWARD_TOKEN`` when set (never logged).

Transient failures (connection errors, timeouts, 5xx, 429; the service answers 503 + Retry-After while it starts
or restarts) are retried ``$PR_RLHF_REWARD_RETRIES`` times (default 8: about 20 s of backoff, at least what
Retry-After asks); after that, or on an unscored response, the score is ``$PR_RLHF_REWARD_FAILURE`` (default 0.0)
and ``reward_status`` says why, so a failed reward is visible in verl's logs instead of silently neutral. A row the
adapter cannot turn into a request (no user id, no query) or a request the service refuses (a 4xx other than 429)
raises ``ValueError`` naming the row's fields: retrying cannot help, and scoring it would train a whole run on the
failure value. ``PR_RLHF_REWARD_ON_BAD_INPUT=score`` keeps the failure score for those instead.
Standard library only: verl's workers need nothing else installed.
"""
from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from typing import Any

_FORWARDED = ("profile", "history", "plan", "reference", "stated_preferences", "subset")


class BadRequest(ValueError):
    """A row or request that no retry can score."""


def _request_body(solution_str: str, ground_truth: Any, extra_info: dict | None) -> dict:
    if extra_info is None:
        raise BadRequest("extra_info is None: each row needs extra_info['user_id'] (whose reward this is) and "
                         "extra_info['query'] (data_pipelines/verl_export.py writes both)")
    extra = dict(extra_info)
    if not extra.get("user_id"):
        raise BadRequest(f"extra_info['user_id'] is required (whose reward this is); the row has "
                         f"{sorted(extra) or 'no fields'}")
    query = extra.get("query") or (ground_truth if isinstance(ground_truth, str) else "")
    if not query:
        raise BadRequest(f"extra_info['query'] (or a string ground_truth) is required; the row has {sorted(extra)}")
    body = {"user_id": str(extra["user_id"]), "query": str(query), "response": solution_str}
    body.update({k: extra[k] for k in _FORWARDED if extra.get(k) is not None})
    if body.get("profile"):   # only the fields the service takes (retrieval rows also carry a score)
        body["profile"] = [{"text": str(p.get("text", "")), "id": str(p.get("id", "")),
                            "category": str(p.get("category", "") or "")} for p in body["profile"]]
    return body


def _post(url: str, body: dict, timeout_s: float) -> dict:
    headers = {"Content-Type": "application/json"}
    token = os.environ.get("PR_RLHF_REWARD_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def _retry_after_s(value: str | None) -> float:
    try:
        seconds = float(value) if value is not None else 0.0
    except ValueError:   # an HTTP date: wait the backoff alone
        return 0.0
    return seconds if math.isfinite(seconds) and seconds >= 0 else 0.0


def compute_score(data_source: Any = None, solution_str: str = "", ground_truth: Any = None,
                  extra_info: dict | None = None, **_: Any) -> dict:
    """verl's reward function signature; see the module docstring."""
    failure = float(os.environ.get("PR_RLHF_REWARD_FAILURE", "0.0"))
    keep_score = os.environ.get("PR_RLHF_REWARD_ON_BAD_INPUT", "raise") == "score"
    retries = int(os.environ.get("PR_RLHF_REWARD_RETRIES", "8"))
    timeout_s = float(os.environ.get("PR_RLHF_REWARD_TIMEOUT", "120"))
    base = str((extra_info or {}).get("reward_url") or os.environ.get("PR_RLHF_REWARD_URL", "http://127.0.0.1:8000"))
    try:
        body = _request_body(solution_str, ground_truth, extra_info)
        status = "unreachable"
        for attempt in range(retries + 1):
            wait_s = 0.0
            try:
                result = _post(base.rstrip("/") + "/score", body, timeout_s)
                if result.get("score") is None:
                    return {"score": failure, "reward_status": f"unscored: {result.get('status')}",
                            "reward_latency_ms": float(result.get("latency_ms", 0.0))}
                return {"score": float(result["score"]), "reward_status": "ok",
                        "reward_latency_ms": float(result.get("latency_ms", 0.0))}
            except urllib.error.HTTPError as exc:
                status = f"http_{exc.code}"
                if exc.code < 500 and exc.code != 429:     # the request itself is wrong: retrying cannot help
                    detail = exc.read().decode(errors="replace")[:300]
                    raise BadRequest(f"the service refused the row ({sorted(extra_info or {})}): HTTP {exc.code}: "
                                     f"{detail}") from None
                wait_s = _retry_after_s(exc.headers.get("Retry-After") if exc.headers else None)
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
                status = f"unreachable: {type(exc).__name__}"
            if attempt < retries:
                time.sleep(min(max(0.2 * 2 ** attempt, wait_s), 5.0))
    except BadRequest as exc:
        if not keep_score:
            raise BadRequest(f"pr_rlhf reward: {exc} (PR_RLHF_REWARD_ON_BAD_INPUT=score scores such rows "
                             f"{failure} instead)") from None
        return {"score": failure, "reward_status": f"bad_input: {exc}", "reward_latency_ms": 0.0}
    return {"score": failure, "reward_status": f"gave_up after {retries + 1} tries: {status}",
            "reward_latency_ms": 0.0}
