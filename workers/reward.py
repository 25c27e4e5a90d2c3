"""Reward scoring on Ray: :class:`RewardWorker` actors, each hosting one scorer of :mod:`pr_rlhf.scorers`, and
:class:`RewardPool`, the plain-Python client the controller uses to score a batch of requests with them.

The pool's guarantees (:meth:`RewardPool.score`):

- results come back in request order, exactly one per request; request ids must be unique within a call;
- sticky routing: ``worker = sha256(user_id) mod N``, stable across calls, processes and restarts, so a user's
  requests meet the same engine (prefix cache) -- at the price of load skew when few users dominate;
- at most ``pool.max_inflight`` batches of at most ``pool.batch_size`` requests outstanding per worker;
- a worker that dies (``RayActorError``: killed, crashed, OOM) is replaced by a new actor from the same config,
  and exactly the requests that had no result yet are re-sent, each alone on its worker (one call in flight
  there), so one poisonous request cannot take others down with it again; a call that fails without killing the
  worker (the scorer raised) is re-sent the same way; a result that arrives for a request already answered is
  dropped and counted (``duplicates``);
- every request is sent at most ``pool.max_attempts`` times; one that still has no result then gets ``error`` set
  (``gave_up: ...``): nothing is dropped silently. Errors the scorer returns itself (a parse failure, an unknown
  user) are final results, not retried.

``RewardPool.stats``: requests, batches, retries (re-sends), restarts, failures (results with ``error``), error
kinds, duplicates (dropped), max_inflight (the most batches outstanding at one worker).

Limits: one ``score`` call at a time per pool (it is not thread-safe); a worker that hangs without dying stalls
``score`` -- engines bound their own calls (the openai engine has a deadline), local ones do not hang in practice.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pr_rlhf.actors import reward_pool_group
from pr_rlhf.configs.reward import RewardBase, RewardConfig, reward_config
from pr_rlhf.scorers import RewardRequest, Scorer, build_scorer


@dataclass
class RewardResult:
    request_id: str
    score: float | None
    error: str | None
    worker_id: str           # "reward-<index>.<incarnation>" that produced it (gave_up: the last one that failed)
    attempt: int             # 1 for the first send of the request


# ---------------------------------------------------------------------------------------------------------------
# Worker
# ---------------------------------------------------------------------------------------------------------------

class RewardWorker:
    """One scorer in one actor. ``score`` calls may arrive concurrently (the pool pipelines batches; the actor
    is threaded so that ``stats`` answers while it scores); the scorer itself runs one batch at a time.

    It counts scorer invocations per request id and per user, and the most ``score`` calls it held at once.
    """

    def __init__(self, cfg: RewardConfig | Mapping[str, Any], worker_id: str = "reward-0",
                 scorer_factory: Callable[[RewardConfig], Scorer] | None = None):
        self.cfg = cfg if isinstance(cfg, RewardBase) else reward_config(**cfg)
        self.worker_id = worker_id
        self.scorer = (scorer_factory or build_scorer)(self.cfg)
        self._score_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self.invocations: Counter[str] = Counter()
        self.users: Counter[str] = Counter()
        self.batches = 0
        self.active = 0
        self.peak_active = 0

    def ready(self) -> dict[str, Any]:
        from workers.ray_utils import current_node_id

        return {"worker_id": self.worker_id, "pid": os.getpid(), "node_id": current_node_id()}

    def score(self, requests: Sequence[RewardRequest], attempts: Sequence[int] | None = None) -> list[RewardResult]:
        attempts = list(attempts) if attempts is not None else [1] * len(requests)
        with self._stats_lock:
            self.active += 1
            self.peak_active = max(self.peak_active, self.active)
        try:
            with self._score_lock:
                with self._stats_lock:
                    self.batches += 1
                    self.invocations.update(r.request_id for r in requests)
                    self.users.update(r.user_id for r in requests)
                scores = self.scorer.score(list(requests))
        finally:
            with self._stats_lock:
                self.active -= 1
        if len(scores) != len(requests):
            raise RuntimeError(f"scorer returned {len(scores)} scores for {len(requests)} requests")
        return [RewardResult(r.request_id, None if s is None else float(s), e, self.worker_id, a)
                for r, (s, e), a in zip(requests, scores, attempts)]

    def close(self) -> None:
        close = getattr(self.scorer, "close", None)
        if close is not None:
            close()

    def stats(self) -> dict[str, Any]:
        with self._stats_lock:
            return {"worker_id": self.worker_id, "pid": os.getpid(), "batches": self.batches,
                    "invocations": dict(self.invocations), "users": dict(self.users),
                    "peak_active": self.peak_active}


# ---------------------------------------------------------------------------------------------------------------
# Pool
# ---------------------------------------------------------------------------------------------------------------

def sticky_index(user_id: str, n: int) -> int:
    """The worker a user's requests go to: stable across processes (unlike the salted built-in ``hash``)."""
    return int.from_bytes(hashlib.sha256(str(user_id).encode()).digest()[:8], "big") % n


@dataclass
class _Batch:
    worker: int
    incarnation: int
    indices: list[int]
    alone: bool = False  # a re-sent request, the only call in flight at its worker


class RewardPool:
    """Owns ``cfg.pool.workers`` :class:`RewardWorker` actors (Ray must be initialized); see the module docstring.

    ``num_workers`` overrides ``cfg.pool.workers``. ``scorer_factory`` replaces :func:`build_scorer` (tests, custom
    scorers); it is shipped to every worker, so it must pickle. ``actor_options`` are extra ``.options()`` for the
    actors (e.g. ``runtime_env``).
    """

    def __init__(self, cfg: RewardConfig, *, num_workers: int | None = None,
                 scorer_factory: Callable[[RewardConfig], Scorer] | None = None,
                 actor_options: Mapping[str, Any] | None = None):
        import ray

        if num_workers is not None:
            if num_workers < 1:
                raise ValueError(f"num_workers must be >= 1, got {num_workers}")
            cfg = cfg.model_copy(update={"pool": cfg.pool.model_copy(update={"workers": int(num_workers)})})
        self.cfg = cfg
        self._pool = cfg.pool
        self._factory = scorer_factory
        self._actor_cls = ray.remote(RewardWorker)
        self._options = dict(actor_options or {})
        self._incarnation = [0] * self._pool.workers
        self.workers: list[Any] = [None] * self._pool.workers
        self.stats: dict[str, Any] = {"requests": 0, "batches": 0, "retries": 0, "restarts": 0, "failures": 0,
                                      "error_kinds": {}, "duplicates": 0, "max_inflight": 0}
        for index in range(self._pool.workers):
            self._spawn(index)
        try:  # a config that cannot build its scorer fails here, once, not as endless restarts later
            ray.get([w.ready.remote() for w in self.workers])
        except Exception:
            self.close()
            raise

    # -- workers ---------------------------------------------------------------------------------------------
    def _spawn(self, index: int) -> None:
        self._incarnation[index] += 1
        worker_id = f"reward-{index}.{self._incarnation[index]}"
        options = {**reward_pool_group(self.cfg).options(),
                   "max_concurrency": self._pool.max_inflight + 2, "max_restarts": 0, "max_task_retries": 0,
                   **self._options}
        # The config travels as plain data: unpickling it needs no import in the worker.
        self.workers[index] = self._actor_cls.options(**options).remote(self.cfg.model_dump(), worker_id,
                                                                        self._factory)

    def _restart(self, index: int) -> None:
        import ray

        with contextlib.suppress(Exception):  # already gone
            ray.kill(self.workers[index], no_restart=True)
        self.stats["restarts"] += 1
        self._spawn(index)

    def worker_index(self, user_id: str) -> int:
        return sticky_index(user_id, len(self.workers))

    def worker_stats(self) -> list[dict[str, Any]]:
        """Each live worker's own counters (invocations per request id, users, batches, peak_active)."""
        import ray

        return ray.get([w.stats.remote() for w in self.workers])

    def close(self) -> None:
        import ray

        for worker in self.workers:
            if worker is not None:
                with contextlib.suppress(Exception):  # already gone
                    ray.kill(worker, no_restart=True)
        self.workers = [None] * len(self.workers)

    shutdown = close

    def __enter__(self) -> RewardPool:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- scoring ---------------------------------------------------------------------------------------------
    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        """One result per request, in order (see the module docstring for the guarantees)."""
        import ray
        from ray.exceptions import RayActorError

        requests = list(requests)
        position = {r.request_id: i for i, r in enumerate(requests)}
        if len(position) != len(requests):
            dupes = [rid for rid, c in Counter(r.request_id for r in requests).items() if c > 1]
            raise ValueError(f"request ids must be unique within a call; repeated: {dupes[:5]}")
        n_workers, pool = len(self.workers), self._pool
        results: list[RewardResult | None] = [None] * len(requests)
        attempts = [0] * len(requests)
        queues: list[deque[tuple[int, bool]]] = [deque() for _ in range(n_workers)]  # (index, send alone)
        exclusive = [False] * n_workers  # a re-sent request is in flight there, alone
        for i, req in enumerate(requests):
            queues[self.worker_index(req.user_id)].append((i, False))
        inflight: dict[Any, _Batch] = {}
        outstanding = [0] * n_workers
        self.stats["requests"] += len(requests)

        def finish(i: int, result: RewardResult) -> None:
            if results[i] is not None:
                self.stats["duplicates"] += 1
                return
            results[i] = result
            if result.error is not None:
                self.stats["failures"] += 1
                kind = result.error.split(":", 1)[0]
                self.stats["error_kinds"][kind] = self.stats["error_kinds"].get(kind, 0) + 1

        def take(w: int) -> tuple[list[int], bool]:
            queue = queues[w]
            while queue and results[queue[0][0]] is not None:
                queue.popleft()
            if not queue or exclusive[w]:
                return [], False
            if queue[0][1]:  # a re-sent request waits until its worker is idle, then goes alone
                if outstanding[w]:
                    return [], False
                exclusive[w] = True
                return [queue.popleft()[0]], True
            batch: list[int] = []
            while queue and len(batch) < pool.batch_size and not queue[0][1]:
                i, _ = queue.popleft()
                if results[i] is None:
                    batch.append(i)
            return batch, False

        def resend(batch: _Batch, reason: str) -> None:
            again = [i for i in batch.indices if results[i] is None]
            for i in again:
                if attempts[i] >= pool.max_attempts:
                    finish(i, RewardResult(requests[i].request_id, None,
                                           f"gave_up: {attempts[i]} attempts; last: {reason}",
                                           f"reward-{batch.worker}.{batch.incarnation}", attempts[i]))
            # Unanswered requests go first, each alone on its worker: one that kills its worker (or makes the
            # call fail) only costs itself from then on.
            queues[batch.worker].extendleft((i, True) for i in reversed(again) if results[i] is None)

        while True:
            for w in range(n_workers):
                while outstanding[w] < pool.max_inflight:
                    batch, alone = take(w)
                    if not batch:
                        break
                    for i in batch:
                        attempts[i] += 1
                        self.stats["retries"] += attempts[i] > 1
                    ref = self.workers[w].score.remote([requests[i] for i in batch], [attempts[i] for i in batch])
                    inflight[ref] = _Batch(w, self._incarnation[w], batch, alone)
                    outstanding[w] += 1
                    self.stats["batches"] += 1
                    self.stats["max_inflight"] = max(self.stats["max_inflight"], outstanding[w])
            if not inflight:
                break
            ready, _ = ray.wait(list(inflight), num_returns=1)
            for ref in ready:
                batch = inflight.pop(ref)
                outstanding[batch.worker] -= 1
                exclusive[batch.worker] = exclusive[batch.worker] and not batch.alone
                try:
                    out = ray.get(ref)
                except RayActorError as exc:  # the worker is gone: replace it once, re-send what it owed
                    if batch.incarnation == self._incarnation[batch.worker]:
                        self._restart(batch.worker)
                    resend(batch, f"worker died: {type(exc).__name__}")
                except Exception as exc:  # noqa: BLE001 -- the call failed (the scorer raised): re-send
                    resend(batch, f"call failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
                           if str(exc).strip() else f"call failed: {type(exc).__name__}")
                else:
                    for result in out:
                        i = position.get(result.request_id)
                        if i is None or i not in batch.indices:
                            self.stats["duplicates"] += 1  # not asked of this batch: never trusted
                            continue
                        finish(i, result)
                    for i in batch.indices:  # a worker that answered only part of a batch: re-send the rest
                        if results[i] is None:
                            resend(_Batch(batch.worker, batch.incarnation, [i]), "missing from the batch result")
        missing = [requests[i].request_id for i, r in enumerate(results) if r is None]
        if missing:  # cannot happen: every path above ends in a result or a re-send
            raise RuntimeError(f"reward pool lost requests {missing[:5]}")
        return results  # type: ignore[return-value]
