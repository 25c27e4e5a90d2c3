"""Reward scoring on Ray: :class:`RewardWorker` actors, each hosting one scorer, and :class:`RewardPool`, the
plain-Python client the controller uses to score a batch of requests with them.

Scorers (chosen by :class:`~pr_rlhf.configs.reward.RewardConfig`; see :func:`build_scorer`):

- ``gold``: ``World.gold_utility(response, user_id)``; an unknown user is an ``unknown_user`` error.
- ``world_estimate``: ``w_hat . x`` with a reference predictor's estimate of the user's weights (BoN validity sets).
- ``rubric``: the rubric judge (0/1/2 per aspect of ``meta["rubric"]``, mean / 2); a request without a rubric is an
  error (``no_aspects``).
- ``scalar``: :class:`~pr_rlhf.reward.scalar.ScalarRM` on (user block + question, response).
- ``genrm`` / ``http``: a generative RM on an engine (local, or OpenAI-compatible HTTP for ``http``).
  ``sec_reference`` (default): a request carries a reference answer (``meta["reference"]``, e.g. the SFT policy's
  or the dataset's answer); the P-GenRM SEC prompt shows the response as response_1 and the reference as
  response_2, and the reward is the chain's final score of response_1 (1-10). The slots are fixed: a position
  bias shifts every reward of the run by the same amount, which group-normalized advantages (GRPO, RLOO) cancel,
  whereas a random slot would add noise. ``pointwise``: the pointwise prompt rates the response alone (1-10),
  no reference needed. A parse failure is a result with ``error`` set to the parser's error kind (never a made-up
  score). With a planner (``input_mode="plan"``) the retrieved profile is turned into aspects first.

What a request may carry in ``meta`` for the model-based scorers: ``reference`` (sec_reference), ``retrieved``
(top-k profile items ``[{id, text, ...}]``), ``history`` (``[{question, chosen, rejected}]``),
``stated_preferences``, ``context`` (earlier turns ``[{role, content}]``), ``subset``.

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
from dataclasses import dataclass, field
from typing import Any, Protocol

from pr_rlhf.configs.reward import RewardConfig
from pr_rlhf.reward.inputs import RMInput

Score = tuple[float | None, str | None]  # (reward, error kind/message): exactly one of them is None


@dataclass
class RewardRequest:
    request_id: str
    user_id: str
    question: str            # the user's query (the policy prompt's last user turn)
    response: str            # the text to score
    meta: dict = field(default_factory=dict)  # reference, retrieved, history, stated_preferences, context, subset


@dataclass
class RewardResult:
    request_id: str
    score: float | None
    error: str | None
    worker_id: str           # "reward-<index>.<incarnation>" that produced it (gave_up: the last one that failed)
    attempt: int             # 1 for the first send of the request


@dataclass
class Evaluation:
    """A scorer's full answer for one request (``GenRMScorer.evaluate``): the scores (the response's first; in
    ``sec_reference`` mode the reference's second), or the failure's kind; the chain's persona and weighted
    rubric, and the planner's aspects, when there are any."""

    scores: tuple[float, ...] | None
    error: str | None = None
    persona: str | None = None
    rubric: list[dict] | None = None
    plan: list[str] | None = None


class Scorer(Protocol):
    def score(self, requests: Sequence[RewardRequest]) -> list[Score]:
        """One (score, error) per request, in order. Raise only for failures of the whole call."""


# ---------------------------------------------------------------------------------------------------------------
# Scorers
# ---------------------------------------------------------------------------------------------------------------

def rm_input(req: RewardRequest) -> RMInput:
    """What a reward model may see for one request (the response goes in ``chosen``, the reference in
    ``rejected``; neither is shown by the user blocks)."""
    meta = req.meta or {}
    return RMInput(pair_id=req.request_id, user_id=req.user_id, subset=str(meta.get("subset", "") or ""),
                   question=req.question, chosen=req.response, rejected=str(meta.get("reference", "") or ""),
                   context=[dict(t) for t in meta.get("context") or []],
                   retrieved=[dict(t) for t in meta.get("retrieved") or []],
                   history=[dict(t) for t in meta.get("history") or []],
                   stated_preferences=str(meta.get("stated_preferences", "") or ""),
                   plan=[str(a) for a in meta["plan"]] if meta.get("plan") is not None else None)


class GoldScorer:
    """The synthetic world's exact judge: the noise-free utility of the text for the user."""

    def __init__(self, cfg: RewardConfig):
        from pr_rlhf.world import build_world

        self.world = build_world(cfg.world)
        self.normalize = cfg.normalize

    def score(self, requests: Sequence[RewardRequest]) -> list[Score]:
        out: list[Score] = []
        for req in requests:
            try:
                weights = self.world.user_weights(req.user_id)
            except KeyError:
                out.append((None, f"unknown_user: {req.user_id!r} is not a user of the world"))
                continue
            utility = self.world.gold_utility(req.response, req.user_id)
            if self.normalize:
                low = sum(min(w, 0.0) for w in weights.values())
                high = sum(max(w, 0.0) for w in weights.values())
                utility = (utility - low) / (high - low) if high > low else 0.0
            out.append((utility, None))
        return out


class WorldEstimateScorer:
    """A reference predictor of the synthetic world as a reward model: w_hat . x, the user's weights as the
    predictor estimates them (once per user) times the attributes measured on the response."""

    def __init__(self, cfg: RewardConfig):
        from pr_rlhf.world import build_world
        from pr_rlhf.world.reference import WorldPrior

        self.world = build_world(cfg.world)
        self.cfg = cfg
        self.prior = WorldPrior.of(self.world)
        self._weights: dict[str, Any] = {}   # user id -> weight vector

    def weights(self, user_id: str) -> Any:
        from pr_rlhf.world.reference import estimated_weights

        if user_id not in self._weights:
            self._weights[user_id] = estimated_weights(self.world, user_id, self.cfg.estimator,
                                                       self.cfg.history_pairs, prior=self.prior)
        return self._weights[user_id]

    def score(self, requests: Sequence[RewardRequest]) -> list[Score]:
        from pr_rlhf.world.attributes import detect_vector

        out: list[Score] = []
        for req in requests:
            try:
                w = self.weights(req.user_id)
            except KeyError:
                out.append((None, f"unknown_user: {req.user_id!r} is not a user of the world"))
                continue
            out.append((float(w @ detect_vector(req.response, self.world.attribute_names)), None))
        return out


class _ModelScorer:
    """Shared by the model-based scorers: request -> RMInput, and the optional planner."""

    def __init__(self, cfg: RewardConfig, judge_engine: Any = None):
        from pr_rlhf.models.base import SamplingParams

        self.cfg = cfg
        gen = cfg.generation
        self.params = SamplingParams(temperature=gen.temperature, top_p=gen.top_p, max_tokens=gen.max_tokens,
                                     seed=cfg.seed if gen.temperature > 0 else None)
        self.planner = None
        self.plans_computed = 0     # planner calls made (one per distinct user/question/profile in a batch)
        self._own_engines: list[Any] = []
        if cfg.planner is not None:
            from pr_rlhf.models import make_engine
            from pr_rlhf.reward.planner import Planner

            engine = judge_engine if (judge_engine is not None and cfg.planner == cfg.judge) else None
            if engine is None:
                engine = make_engine(cfg.planner)
                self._own_engines.append(engine)
            self.planner = Planner(engine, params=self.params, max_aspects=cfg.planner_max_aspects)

    def inputs(self, requests: Sequence[RewardRequest]) -> list[RMInput]:
        """RM inputs; with a planner, ONE plan per distinct (user, question, profile) in the batch (a group of
        responses to one prompt shares its rubric), and a plan given with the request (``meta["plan"]``) is
        used as is."""
        inputs = [rm_input(r) for r in requests]
        if self.planner is None:
            return inputs
        import dataclasses
        import json

        def key(inp: RMInput) -> str:
            return json.dumps([inp.user_id, inp.question, inp.retrieved[:self.cfg.top_k_profile]], sort_keys=True,
                              default=str)

        todo: dict[str, RMInput] = {}
        for inp in inputs:
            if inp.plan is None:
                todo.setdefault(key(inp), inp)
        planned = self.planner.plan(list(todo.values()), self.cfg.top_k_profile) if todo else []
        plans = {k: list(getattr(p, "aspects", p) or []) for k, p in zip(todo, planned)}   # failed plan: []
        self.plans_computed += len(plans)
        return [inp if inp.plan is not None else dataclasses.replace(inp, plan=plans[key(inp)]) for inp in inputs]

    def close(self) -> None:
        for engine in self._own_engines:
            engine.close()


class ScalarScorer(_ModelScorer):
    def __init__(self, cfg: RewardConfig):
        from pr_rlhf.reward.scalar import ScalarRM

        super().__init__(cfg)
        self.rm = ScalarRM(cfg.scalar_rm, device=cfg.scalar_rm.device, dtype=cfg.scalar_rm.dtype)

    def score(self, requests: Sequence[RewardRequest]) -> list[Score]:
        inputs = self.inputs(requests)
        ids = [self.rm.encode_input(inp, req.response, self.cfg.input_mode, self.cfg.top_k_profile)
               for inp, req in zip(inputs, requests)]
        return [(s, None) for s in self.rm.score_ids(ids)]


class GenRMScorer(_ModelScorer):
    """SEC against a reference (``sec_reference``) or the pointwise 1-10 rating (``pointwise``)."""

    def __init__(self, cfg: RewardConfig, engine: Any = None):
        """``engine``: use this engine (not closed here) instead of building ``cfg.judge``."""
        if engine is None:
            from pr_rlhf.models import make_engine

            engine = make_engine(cfg.judge)
            super().__init__(cfg, judge_engine=engine)
            self._own_engines.append(engine)
        else:
            super().__init__(cfg, judge_engine=engine)
        self.engine = engine
        self._scaler: Any = None   # built on first use (loads prototypes and an embedder when n > 0)

    def score(self, requests: Sequence[RewardRequest]) -> list[Score]:
        return [(e.scores[0], None) if e.scores is not None else (None, e.error) for e in self.evaluate(requests)]

    def evaluate(self, requests: Sequence[RewardRequest]) -> list[Evaluation]:
        """What the GenRM concluded per request: the response's score (and, in ``sec_reference`` mode, the
        reference's: slot response_2), the chain's persona and weighted rubric, or the failure's kind."""
        if self.cfg.response_view == "world_compact":
            requests = [self._compact_view(r) for r in requests]
        inputs = self.inputs(requests)
        if self.cfg.genrm_mode == "pointwise":
            from pr_rlhf.reward.pointwise import PointwiseJudge

            judge = PointwiseJudge(self.engine, params=self.params)
            rated = judge.rate(inputs, [r.response for r in requests], self.cfg.input_mode, self.cfg.top_k_profile)
            return [Evaluation((s,), None, plan=inp.plan) if e is None else Evaluation(None, e, plan=inp.plan)
                    for (s, e), inp in zip(rated, inputs)]
        return self._sec_reference(inputs)

    def _compact_view(self, req: RewardRequest) -> RewardRequest:
        """The request with its response and reference replaced by the compact rendering of the world attributes
        measured on them (``response_view='world_compact'``)."""
        import dataclasses

        from pr_rlhf.world.attributes import detect, render_compact

        names = self.cfg.world.attribute_names

        def view(text: str) -> str:
            return render_compact(detect(text, names)) if text.strip() else text

        meta = dict(req.meta or {})
        if "reference" in meta:
            meta["reference"] = view(str(meta["reference"] or ""))
        return dataclasses.replace(req, response=view(req.response), meta=meta)

    def _sec_reference(self, inputs: list[RMInput]) -> list[Evaluation]:
        from pr_rlhf.reward.sec import parse_sec, sec_compact_prompt, sec_prompt

        out: list[Evaluation | None] = [None] * len(inputs)
        todo = []
        for i, inp in enumerate(inputs):
            if inp.rejected.strip():
                todo.append(i)
            else:
                out[i] = Evaluation(None, "missing_reference: sec_reference needs meta['reference']")
        if self.cfg.scaling is not None and self.cfg.scaling.enabled:
            for i, evaluation in zip(todo, self._scaled([inputs[i] for i in todo])):
                out[i] = evaluation
            return out  # type: ignore[return-value]
        prompts = [sec_compact_prompt(inputs[i], inputs[i].chosen, inputs[i].rejected)
                   if self.cfg.sec_format == "sec_compact" else
                   sec_prompt(inputs[i], inputs[i].chosen, inputs[i].rejected, mode=self.cfg.input_mode,
                              top_k=self.cfg.top_k_profile, use_stated=self.cfg.use_stated_preferences)
                   for i in todo]
        generations = self.engine.generate(prompts, self.params) if prompts else []
        if len(generations) != len(todo):
            raise RuntimeError(f"engine returned {len(generations)} generations for {len(todo)} prompts")
        for i, gen in zip(todo, generations):
            plan = inputs[i].plan
            if gen.error is not None:
                out[i] = Evaluation(None, f"engine_error: {gen.error}", plan=plan)
            elif not gen.samples:
                out[i] = Evaluation(None, "empty", plan=plan)
            else:
                parsed = parse_sec(gen.samples[0].text)
                if parsed.ok:
                    sec = parsed.value
                    out[i] = Evaluation((sec.final["response_1"], sec.final["response_2"]), None, sec.persona,
                                        [{"name": c.name, "weight": c.weight} for c in sec.criteria], plan)
                else:
                    out[i] = Evaluation(None, parsed.error, plan=plan)
        return out  # type: ignore[return-value]

    def _scaled(self, inputs: list[RMInput]) -> list[Evaluation]:
        """The response's (slot response_1) fused score over m chains and n neighbours (scaling.scorer)."""
        from pr_rlhf.scaling.scorer import decide

        if self._scaler is None:
            self._scaler = build_scaled_judge(self.cfg, self.engine)
        evidence = self._scaler.evidence(inputs, slots=["A"] * len(inputs))
        scaling = self.cfg.scaling
        out: list[Score] = []
        for ev in evidence:
            d = decide(ev, scaling.m, scaling.n, scaling.self_weight, scaling.neighbour_weight)
            out.append(Evaluation(tuple(d.scores), None) if d.scores is not None else
                       Evaluation(None, "no_valid_chain: " + ", ".join(
                           f"{k} x{v}" for k, v in (ev.greedy.failures + ev.samples.failures).items())))
        return out


class RubricScorer:
    """The downstream rubric judge on an engine: requests carry the query's rubric aspects (``meta["rubric"]``:
    dicts with aspect, reason, evidence) and its narrative (``meta["narrative"]``)."""

    def __init__(self, cfg: RewardConfig, engine: Any = None):
        from pr_rlhf.models import make_engine
        from pr_rlhf.models.base import SamplingParams
        from pr_rlhf.reward.rubric_judge import RubricJudge

        self._own = engine is None
        self.engine = make_engine(cfg.judge) if engine is None else engine
        gen = cfg.generation
        params = SamplingParams(temperature=gen.temperature, top_p=gen.top_p, max_tokens=gen.max_tokens,
                                seed=cfg.seed if gen.temperature > 0 else None)
        self.judge = RubricJudge(self.engine, params=params, mode=cfg.rubric_mode)

    def score(self, requests: Sequence[RewardRequest]) -> list[Score]:
        from pr_rlhf.reward.rubric_judge import RubricAspectInput

        rubrics = [[RubricAspectInput(str(a.get("aspect", "")), str(a.get("reason", "") or ""),
                                      str(a.get("evidence", "") or "")) for a in (r.meta or {}).get("rubric") or []]
                   for r in requests]
        verdicts = self.judge.judge([r.question for r in requests], [r.response for r in requests], rubrics,
                                    [str((r.meta or {}).get("narrative", "") or "") for r in requests])
        return [(v.score, None) if v.ok else (None, f"{v.error}: {v.message}" if v.message else v.error)
                for v in verdicts]

    def close(self) -> None:
        if self._own:
            self.engine.close()


def build_scaled_judge(cfg: RewardConfig, engine: Any) -> Any:
    """A ScaledJudge for a reward worker: prototypes loaded from their artifacts (for the configured embedder),
    the member users' histories from ``scaling_members``."""
    from pr_rlhf.scaling.scorer import ScaledJudge

    scaling = cfg.scaling
    index = embedder = None
    histories: dict = {}
    if scaling.n > 0:
        from pr_rlhf.models.embedders import make_embedder
        from pr_rlhf.scaling.grid import member_histories
        from pr_rlhf.scaling.prototypes import PrototypeIndex, embedder_name

        embedder = make_embedder(scaling.prototypes.embedder, cache=False)
        index = PrototypeIndex.load(scaling.prototypes.path, expected_embedder=embedder_name(embedder))
        histories, _ = member_histories(cfg.scaling_members, scaling.neighbour_history_pairs)
    return ScaledJudge(engine, scaling, seed=cfg.seed, fmt=cfg.sec_format, index=index, embedder=embedder,
                       histories=histories, mode=cfg.input_mode, top_k=cfg.top_k_profile,
                       use_stated=cfg.use_stated_preferences)


def build_scorer(cfg: RewardConfig) -> Scorer:
    if cfg.kind == "gold":
        return GoldScorer(cfg)
    if cfg.kind == "world_estimate":
        return WorldEstimateScorer(cfg)
    if cfg.kind == "scalar":
        return ScalarScorer(cfg)
    if cfg.kind in ("genrm", "http"):
        return GenRMScorer(cfg)
    if cfg.kind == "rubric":
        return RubricScorer(cfg)
    raise ValueError(f"unknown reward kind {cfg.kind!r}")


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
        self.cfg = cfg if isinstance(cfg, RewardConfig) else RewardConfig.model_validate(dict(cfg))
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
        options = {"num_cpus": self._pool.num_cpus, "num_gpus": self._pool.num_gpus,
                   **({"resources": dict(self._pool.resources)} if self._pool.resources else {}),
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
