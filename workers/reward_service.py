"""The personalized reward as a Ray Serve application: any scorer of :mod:`pr_rlhf.scorers` (planner + P-GenRM with
optional test-time scaling, scalar RM, rubric / HTTP judge, gold) behind a FastAPI ingress.

Routes (schema in ``pr_rlhf.serve.schema``):
- ``GET /health``: 200 when the replica's scorer is loaded (no auth: load balancers probe it).
- ``GET /info``: what the replica hosts (kind, model, batching; never the token).
- ``POST /score``: one item -> ScoreResult; ``POST /score_batch``: ``{"items": [...]}`` -> ``{"results": [...]}``.
- ``POST /get_reward``: OpenRLHF's remote reward model (``--remote_rm_url http://HOST:PORT/get_reward``).
- With ``serve.users`` (the user store, ``pr_rlhf.serve.personalize``): ``POST /feedback`` (one
  :class:`FeedbackItem`) and ``POST /feedback_batch`` (``{"items": [...]}``) append to the user's history (201;
  a retried idempotency key 200 with ``duplicate: true``; the key reused for other content 409);
  ``GET /users/{id}`` (size, last update, prototype; 404 for a user the store does not hold) and
  ``DELETE /users/{id}``. A scoring request that names a stored user and brings no history is scored with the
  stored one. With ``tenant_tokens_env`` each bearer token reads and writes only its own tenant's users.

While the service starts (Serve's proxy listens before the routes exist) and while its application is redeployed,
its routes answer 503 with ``Retry-After`` instead of Serve's 404 (``pr_rlhf.serve.starting``, loaded into Serve's
proxies by ``run_reward_service``); clients retry it (``pr_rlhf.serve.client``, the verl adapter).

Concurrent requests are merged by ``@serve.batch`` into one scorer call (up to ``max_batch_size``, waiting at most
``batch_wait_timeout_s``); inside a call the planner runs once per distinct (user, query, profile) and the engine
sees the whole batch. A malformed request gets 422 naming the field; a request without the bearer token (when
``auth_token_env`` is set) 401; a scorer that raises a 500 naming the failure; a request not scored within
``request_timeout_s`` a 504. A parse failure of the model's output is not a server error: 200, ``score: null``,
``status`` the failure's kind; an engine failure (the model backend itself) is a 502 on ``/score`` and
``/get_reward`` and a per-item status in ``/score_batch``.
"""
from __future__ import annotations

import asyncio
import hmac
import math
import os
import time
from collections.abc import Callable

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from ray import serve

from pr_rlhf.actors import cpus_needed, replica_group
from pr_rlhf.configs.reward import RewardConfig
from pr_rlhf.configs.serve import ServeConfig
from pr_rlhf.scorers import Evaluation, RewardRequest, Scorer, build_scorer
from pr_rlhf.serve.schema import (
    BodyError,
    FeedbackBatch,
    FeedbackItem,
    OpenRLHFRequest,
    ScoreBatch,
    ScoreItem,
    ScoreResult,
    read_json_body,
)
from pr_rlhf.serve.users import DEFAULT_TENANT, IdempotencyConflict

app = FastAPI(title="pr_rlhf personalized reward")


def _evaluate(scorer: Scorer, items: list[ScoreItem]) -> list[ScoreResult]:
    """One scorer call for the whole batch. A pair becomes one request for a GenRM whose chain scores a response and
    its reference together (both scores from one chain), two requests otherwise: for a judge comparing with a
    reference, each response against the other (both orders, so the position bias cancels)."""
    requests, owners = [], []
    for i, item in enumerate(items):
        meta = item.meta()
        if item.responses is not None and not scorer.scores_reference_too:
            for j, text in enumerate(item.responses):
                own = {k: v for k, v in meta.items() if k != "reference"}
                if scorer.compares_with_reference:
                    own["reference"] = item.responses[1 - j]
                requests.append(RewardRequest(f"{i}.{j}", item.user_id, item.query, text, own))
                owners.append((i, j))
        else:
            requests.append(RewardRequest(str(i), item.user_id, item.query, item.target, meta))
            owners.append((i, 0))
    evaluations = scorer.evaluate(requests)
    parts: dict[int, list[Evaluation]] = {}
    for (i, _), ev in zip(owners, evaluations):
        parts.setdefault(i, []).append(ev)
    results = []
    for i, item in enumerate(items):
        evs = parts[i]
        failed = next((e for e in evs if e.scores is None), None)
        if failed is not None:
            kind = str(failed.error or "unscored").split(":", 1)[0]
            results.append(ScoreResult(status=kind, error=failed.error, plan=evs[0].plan))
            continue
        # a pair scored as two requests: each one's own score; one request: all its scores (a GenRM's chain
        # scores the response and the reference or the pair's second response)
        scores = [float(e.scores[0]) for e in evs] if len(evs) > 1 else [float(x) for x in evs[0].scores]
        results.append(ScoreResult(score=scores[0], scores=scores, persona=evs[0].persona, rubric=evs[0].rubric,
                                   plan=evs[0].plan))
    return results


@serve.deployment
@serve.ingress(app)
class RewardService:
    def __init__(self, cfg: dict, scorer_factory: Callable[[RewardConfig], Scorer] | None = None):
        """``scorer_factory``: what builds the scorer from ``cfg.reward`` (default :func:`build_scorer`; tests pass
        an instrumented one, as to :class:`workers.reward.RewardPool`)."""
        self.cfg = ServeConfig.model_validate(cfg)
        # bearer token -> tenant; the plain auth_token_env token is the default tenant's
        self.tokens: dict[str, str] = {}
        for tenant, env in [*(([(DEFAULT_TENANT, self.cfg.auth_token_env)]) if self.cfg.auth_token_env else []),
                            *self.cfg.tenant_tokens_env.items()]:
            token = os.environ.get(env) or None
            if token is None:
                raise RuntimeError(f"the token variable {env!r} (tenant {tenant!r}) is empty in the replica's "
                                   "environment")
            self.tokens[token] = tenant
        self.users = None
        if self.cfg.users is not None:
            from pr_rlhf.serve.personalize import OnlineUsers

            self.users = OnlineUsers(self.cfg.users)
        self.scorer = (scorer_factory or build_scorer)(self.cfg.reward)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self._score.set_max_batch_size(self.cfg.max_batch_size)
        self._score.set_batch_wait_timeout_s(self.cfg.batch_wait_timeout_s)
        self.batches = 0
        self.items = 0

    def _tenant(self, authorization: str | None) -> str:
        """The caller's tenant (401 without a known token when auth is on)."""
        if not self.tokens:
            return DEFAULT_TENANT
        given = (authorization or "").removeprefix("Bearer ").strip().encode()
        found = None
        for token, tenant in self.tokens.items():   # every token compared: the time does not tell which matched
            if hmac.compare_digest(given, token.encode()):
                found = tenant
        if not given or found is None:
            raise HTTPException(status_code=401, detail="missing or wrong bearer token",
                                headers={"WWW-Authenticate": "Bearer"})
        return found

    def _store(self):
        if self.users is None:
            raise HTTPException(status_code=404, detail="this service keeps no user state (serve.users is not set)")
        return self.users

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)
    async def _score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        self.batches += 1
        self.items += len(items)
        return await asyncio.to_thread(_evaluate, self.scorer, items)   # the event loop keeps taking requests

    async def _score_many(self, items: list[ScoreItem], tenant: str) -> list[ScoreResult]:
        if len(items) > self.cfg.max_pairs_per_request:
            raise HTTPException(status_code=413, detail=f"{len(items)} items; at most "
                                                        f"{self.cfg.max_pairs_per_request} per request")
        start = time.perf_counter()
        provenance: list = [None] * len(items)
        if self.users is not None:
            items, provenance = await asyncio.to_thread(self.users.personalize, tenant, items)
        try:
            results = await asyncio.wait_for(asyncio.gather(*(self._score(it) for it in items)),
                                             timeout=self.cfg.request_timeout_s)
        except asyncio.TimeoutError:
            raise HTTPException(status_code=504, detail=f"not scored within {self.cfg.request_timeout_s} s") from None
        except HTTPException:
            raise
        except Exception as exc:  # noqa: BLE001 - the scorer failed: a clear 500, never a hang
            raise HTTPException(status_code=500, detail=f"scorer failed: {type(exc).__name__}: {exc}"[:500]) from None
        latency = 1000 * (time.perf_counter() - start)
        return [r.model_copy(update={"latency_ms": latency, "replica": self.replica,
                                     "user_state": p.as_dict() if p is not None else None})
                for r, p in zip(results, provenance)]

    @app.get("/health")
    async def health(self) -> dict:
        return {"status": "ok", "replica": self.replica}

    @app.get("/info")
    async def info(self, authorization: str | None = Header(None)) -> dict:
        self._tenant(authorization)
        reward = self.cfg.reward
        return {"kind": reward.kind, "judge": reward.judge.model if reward.kind in ("genrm", "http", "rubric")
                else None, "replica": self.replica, "max_batch_size": self.cfg.max_batch_size,
                "batches": self.batches, "items": self.items,
                "plans_computed": getattr(self.scorer, "plans_computed", 0), "auth": bool(self.tokens),
                "users": self.users is not None}

    @app.post("/score")
    async def score(self, item: ScoreItem, authorization: str | None = Header(None)) -> ScoreResult:
        result = (await self._score_many([item], self._tenant(authorization)))[0]
        if result.status == "engine_error":   # the model backend failed (not its output): a server error
            raise HTTPException(status_code=502, detail=f"the reward model's engine failed: {result.error}"[:500])
        return result

    @app.post("/score_batch")
    async def score_batch(self, batch: ScoreBatch, authorization: str | None = Header(None)) -> dict:
        return {"results": await self._score_many(batch.items, self._tenant(authorization))}

    @app.post("/get_reward")
    async def get_reward(self, body: OpenRLHFRequest, authorization: str | None = Header(None)) -> dict:
        tenant = self._tenant(authorization)
        try:
            items = body.items()
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        results = await self._score_many(items, tenant)
        failed = [i for i, r in enumerate(results) if r.score is None]
        if failed:   # a trainer cannot take a missing reward: say which and why
            first = results[failed[0]]
            raise HTTPException(status_code=502, detail=f"{len(failed)} of {len(results)} unscored (first: "
                                                        f"query[{failed[0]}]: {first.status}: {first.error})")
        rewards = [r.score for r in results]
        return {"rewards": rewards, "scores": rewards,
                "extra_logs": {"latency_ms": [r.latency_ms for r in results]}}

    async def _feedback(self, request: Request, authorization: str | None, model: type) -> list:
        tenant = self._tenant(authorization)
        users = self._store()
        try:
            body = read_json_body(await request.body(), model)
        except BodyError as exc:
            raise HTTPException(status_code=422, detail={"field": exc.field, "error": str(exc)}) from None
        items = body.items if isinstance(body, FeedbackBatch) else [body]
        if len(items) > self.cfg.max_pairs_per_request:
            raise HTTPException(status_code=413, detail=f"{len(items)} items; at most "
                                                        f"{self.cfg.max_pairs_per_request} per request")
        for i, item in enumerate(items):
            problem = users.check(item)
            if problem is not None:
                field = problem.split(":", 1)[0]
                raise HTTPException(status_code=422, detail={"field": field if model is FeedbackItem else
                                                             f"items.{i}.{field}", "error": problem})
        try:
            return await asyncio.to_thread(users.add_feedback, tenant, items)
        except IdempotencyConflict as exc:
            raise HTTPException(status_code=409, detail={"field": "idempotency_key", "error": str(exc)}) from None

    @app.post("/feedback", status_code=201)
    async def feedback(self, request: Request, authorization: str | None = Header(None)) -> JSONResponse:
        (receipt,) = await self._feedback(request, authorization, FeedbackItem)
        return JSONResponse(status_code=200 if receipt.duplicate else 201, content=vars(receipt))

    @app.post("/feedback_batch")
    async def feedback_batch(self, request: Request, authorization: str | None = Header(None)) -> dict:
        receipts = await self._feedback(request, authorization, FeedbackBatch)
        return {"receipts": [vars(r) for r in receipts]}

    @app.get("/users/{user_id}")
    async def get_user(self, user_id: str, authorization: str | None = Header(None)) -> dict:
        tenant = self._tenant(authorization)
        state = await asyncio.to_thread(self._store().store.get_user, tenant, user_id)
        if state is None:
            raise HTTPException(status_code=404, detail={"field": "user_id", "error": f"no user {user_id!r}"})
        return state.summary()

    @app.delete("/users/{user_id}")
    async def delete_user(self, user_id: str, authorization: str | None = Header(None)) -> dict:
        tenant = self._tenant(authorization)
        removed = await asyncio.to_thread(self._store().store.delete_user, tenant, user_id)
        if removed == 0:   # every stored user has at least one feedback row
            raise HTTPException(status_code=404, detail={"field": "user_id", "error": f"no user {user_id!r}"})
        return {"user_id": user_id, "deleted": True, "feedback_removed": removed}


def deploy(cfg: ServeConfig, *, blocking: bool = False,
           scorer_factory: Callable[[RewardConfig], Scorer] | None = None) -> str:
    """Start Serve's HTTP proxy on ``cfg.host:cfg.port`` and deploy the service (Ray must be initialized);
    returns the base URL. ``scorer_factory``: see :class:`RewardService`."""
    if cfg.users is not None:   # replicas run in other directories: a relative SQLite path is the driver's
        from pr_rlhf.serve.users import absolute_url

        cfg = cfg.model_copy(update={"users": cfg.users.model_copy(update={"url": absolute_url(cfg.users.url)})})
    serve.start(http_options={"host": cfg.host, "port": cfg.port, "request_timeout_s": cfg.request_timeout_s + 30})
    application = RewardService.options(
        num_replicas=cfg.replicas, max_ongoing_requests=cfg.max_ongoing_requests,
        ray_actor_options=replica_group(cfg).options(),
    ).bind(cfg.model_dump(), scorer_factory)
    serve.run(application, name=cfg.name, route_prefix=cfg.route_prefix, blocking=blocking)
    return f"http://{cfg.host}:{cfg.port}{cfg.route_prefix.rstrip('/')}"


def run_reward_service(cfg: ServeConfig, address: str | None = None, *, detach: bool = False,
                       on_ready: Callable[[str], None] = print, on_stop: Callable[[], None] = lambda: None) -> None:
    """`pr-rlhf serve-reward`: Ray joined at ``address`` (else a local Ray), the service deployed (``on_ready(url)``),
    then, unless ``detach`` (the service stays on the cluster until `serve shutdown`), served until Ctrl-C or
    SIGTERM (``on_stop()``, then Serve shut down)."""
    import signal

    from pr_rlhf.serve.starting import proxy_environment
    from workers.ray_utils import check_declared, init_ray

    # Serve's proxies answer 503 + Retry-After, not 404, on the service's routes until they exist
    init_ray(address, num_cpus=max(os.cpu_count() or 1, 2, math.ceil(cpus_needed([replica_group(cfg)]))),
             worker_env=proxy_environment(cfg.route_prefix))
    check_declared([replica_group(cfg)])
    if detach:
        on_ready(deploy(cfg))
        return
    # Ctrl-C and SIGTERM (`kill`, `docker stop`, `ray job stop`) stop it gracefully, whatever disposition it
    # inherited: a command started from a background job (`cmd &` in a script, CI) starts with SIGINT ignored,
    # and Python then leaves it ignored. Installed before the deployment: its routes answer before serve.run
    # returns, and a stop sent then must still shut Serve down
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        on_ready(deploy(cfg))
        while True:
            # short sleeps: the kernel may hand Ctrl-C to one of Ray's threads, and Python raises it in the main
            # thread only once that thread runs again (a long sleep would hold it for its whole length)
            time.sleep(0.5)
    except KeyboardInterrupt:
        on_stop()
    finally:
        serve.shutdown()
