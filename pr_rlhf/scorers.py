"""The reward scorers: what one reward worker (``workers/reward.py``) or one replica of the reward service
(``workers/reward_service.py``) hosts. Ray-free; chosen by :data:`~pr_rlhf.configs.reward.RewardConfig` (see
:func:`build_scorer`).

Every scorer is a :class:`Scorer`: its own :meth:`~Scorer.evaluate` (one :class:`Evaluation` per request) and the
``(score, error)`` pairs a reward worker returns, derived from it once in :meth:`Scorer.score`.

- ``gold``: ``World.gold_utility(response, user_id)``; an unknown user is an ``unknown_user`` error.
- ``world_estimate``: ``w_hat . x`` with a reference predictor's estimate of the user's weights (BoN validity sets).
- ``rubric``: the rubric judge (0/1/2 per aspect of ``meta["rubric"]``, mean / 2); a request without a rubric is an
  error (``no_aspects``).
- ``scalar``: :class:`~pr_rlhf.reward.scalar.ScalarRM` on (user block + question, response).
- ``bt_embedding`` / ``pal`` / ``lore`` / ``vpl`` / ``gpo``: a reward model on frozen text embeddings
  (:mod:`pr_rlhf.embedrm`), the user from the learned seen users or the request's history pairs.
- ``genrm`` / ``http``: a generative RM on an engine (local, or OpenAI-compatible HTTP for ``http``).
  ``sec_reference`` (default): a request carries a reference answer (``meta["reference"]``, e.g. the SFT policy's
  or the dataset's answer); the P-GenRM SEC prompt shows the response as response_1 and the reference as
  response_2, and the reward is the chain's final score of response_1 (1-10). The slots are fixed: a position
  bias shifts every reward of the run by the same amount, which group-normalized advantages (GRPO, RLOO) cancel,
  whereas a random slot would add noise. ``pointwise``: the pointwise prompt rates the response alone (1-10),
  no reference needed. ``pairwise``: the pairwise judge compares the response (slot A) with the reference (slot
  B): its written verdict (1 / 0), or its probability of answering A (``verdict_readout="probability"``). A parse
  failure is a result with ``error`` set to the parser's error kind (never a made-up score). With a planner
  (``input_mode="plan"``) the retrieved profile is turned into aspects first; with a scaling config the reward is
  fused over chains and neighbours (:mod:`pr_rlhf.scaling`).

What a request may carry in ``meta`` for the model-based scorers: ``reference`` (sec_reference), ``retrieved``
(top-k profile items ``[{id, text, ...}]``), ``history`` (``[{question, chosen, rejected}]``),
``stated_preferences``, ``context`` (earlier turns ``[{role, content}]``), ``subset``.

This module sits one layer above :mod:`pr_rlhf.scaling` (the GenRM scorer's test-time scaling), not inside
:mod:`pr_rlhf.reward`, which scaling itself builds on.
"""
from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pr_rlhf.configs.reward import EMBEDDING_KINDS, RewardConfig
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
class Evaluation:
    """A scorer's full answer for one request: the scores (the response's first; a GenRM in ``sec_reference`` mode
    adds the reference's), or the failure's kind; the chain's persona and weighted rubric, and the planner's
    aspects, when there are any."""

    scores: tuple[float, ...] | None
    error: str | None = None
    persona: str | None = None
    rubric: list[dict] | None = None
    plan: list[str] | None = None


class Scorer(abc.ABC):
    """The one interface of every scorer: :meth:`evaluate` is each scorer's own, :meth:`score` derives from it."""

    @property
    def compares_with_reference(self) -> bool:
        """True when an evaluation judges the response against the request's reference (``meta['reference']``): the
        reward service then judges each response of a pair against the other."""
        return False

    @property
    def scores_reference_too(self) -> bool:
        """True when one evaluation against the reference also scores the reference (a chain scoring both slots):
        the reward service then sends a pair as one request, not two."""
        return False

    @abc.abstractmethod
    def evaluate(self, requests: Sequence[RewardRequest]) -> list[Evaluation]:
        """One evaluation per request, in order. Raise only for failures of the whole call."""

    def score(self, requests: Sequence[RewardRequest]) -> list[Score]:
        """One (the response's score, None) or (None, the failure) per request, in order: what a worker returns."""
        return [(e.scores[0], None) if e.scores is not None else (None, e.error) for e in self.evaluate(requests)]

    def close(self) -> None:
        """Release the engines the scorer built itself (none by default)."""


def _with_reference(inputs: Sequence[RMInput], mode: str) -> tuple[list[Evaluation | None], list[int]]:
    """(the evaluations so far: a request without a reference failed, the indices of those with one)."""
    out: list[Evaluation | None] = [None] * len(inputs)
    todo = []
    for i, inp in enumerate(inputs):
        if inp.rejected.strip():
            todo.append(i)
        else:
            out[i] = Evaluation(None, f"missing_reference: {mode} needs meta['reference']", plan=inp.plan)
    return out, todo


def judged_against_reference(engine: Any, params: Any, inputs: list[RMInput], readout: str, *, mode: str = "none",
                             top_k: int = 10, blocks: Sequence[str] | None = None) -> list[Evaluation]:
    """The pairwise judge on (response in slot A, reference in slot B): 1 / 0 from the verdict it writes, or its
    probability of answering A (``readout="probability"``). Slot A is fixed, as in ``sec_reference``: a pair scored
    in both orders compares each response's own slot-A score, so the position bias cancels. The judge sees the
    input ``mode``'s user block, or ``blocks[i]`` (a persona) when given."""
    from pr_rlhf.reward.judge import judge_prompt, parse_verdict, slot_a_probabilities

    out, todo = _with_reference(inputs, "pairwise")
    prompts = [judge_prompt(inputs[i], inputs[i].chosen, inputs[i].rejected, mode, top_k,  # type: ignore[arg-type]
                            block=None if blocks is None else blocks[i]) for i in todo]
    if readout == "probability":
        for i, (p, e) in zip(todo, slot_a_probabilities(engine, prompts)):
            out[i] = Evaluation((p,) if e is None else None, e, plan=inputs[i].plan)
        return out  # type: ignore[return-value]
    for i, text in _generated_texts(engine, params, prompts, todo, inputs, out):
        parsed = parse_verdict(text)
        out[i] = Evaluation((1.0 if parsed.value == "A" else 0.0,) if parsed.ok else None, parsed.error,
                            plan=inputs[i].plan)
    return out  # type: ignore[return-value]


def _generated_texts(engine: Any, params: Any, prompts: list, todo: list[int], inputs: Sequence[RMInput],
                     out: list[Evaluation | None]) -> list[tuple[int, str]]:
    """(index, text) of each prompt the engine answered; a failed or empty generation is written into ``out``."""
    generations = engine.generate(prompts, params) if prompts else []
    if len(generations) != len(todo):
        raise RuntimeError(f"engine returned {len(generations)} generations for {len(todo)} prompts")
    texts = []
    for i, gen in zip(todo, generations):
        if gen.error is not None:
            out[i] = Evaluation(None, f"engine_error: {gen.error}", plan=inputs[i].plan)
        elif not gen.samples:
            out[i] = Evaluation(None, "empty", plan=inputs[i].plan)
        else:
            texts.append((i, gen.samples[0].text))
    return texts


def request_input(req: RewardRequest) -> RMInput:
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


class GoldScorer(Scorer):
    """The synthetic world's exact judge: the noise-free utility of the text for the user."""

    def __init__(self, cfg: RewardConfig):
        from pr_rlhf.world import build_world

        self.world = build_world(cfg.world)
        self.normalize = cfg.normalize

    def evaluate(self, requests: Sequence[RewardRequest]) -> list[Evaluation]:
        out: list[Evaluation] = []
        for req in requests:
            try:
                weights = self.world.user_weights(req.user_id)
            except KeyError:
                out.append(Evaluation(None, f"unknown_user: {req.user_id!r} is not a user of the world"))
                continue
            utility = self.world.gold_utility(req.response, req.user_id)
            if self.normalize:
                low = sum(min(w, 0.0) for w in weights.values())
                high = sum(max(w, 0.0) for w in weights.values())
                utility = (utility - low) / (high - low) if high > low else 0.0
            out.append(Evaluation((utility,)))
        return out


class WorldEstimateScorer(Scorer):
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

    def evaluate(self, requests: Sequence[RewardRequest]) -> list[Evaluation]:
        from pr_rlhf.world.attributes import detect_vector

        out: list[Evaluation] = []
        for req in requests:
            try:
                w = self.weights(req.user_id)
            except KeyError:
                out.append(Evaluation(None, f"unknown_user: {req.user_id!r} is not a user of the world"))
                continue
            out.append(Evaluation((float(w @ detect_vector(req.response, self.world.attribute_names)),)))
        return out


class _ModelScorer(Scorer):
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
        planner = cfg.engine_for("planner")
        if planner is not None:
            from pr_rlhf.models import make_engine
            from pr_rlhf.reward.planner import Planner

            # a planner equal to the judge is the judge's engine (the config says so: its roles), built once
            engine = judge_engine if "judge" in planner.roles and judge_engine is not None else None
            if engine is None:
                engine = make_engine(planner.config)
                self._own_engines.append(engine)
            self.planner = Planner(engine, params=self.params, max_aspects=cfg.planner_max_aspects)

    def inputs(self, requests: Sequence[RewardRequest]) -> list[RMInput]:
        """RM inputs; with a planner, ONE plan per distinct (user, question, profile) in the batch (a group of
        responses to one prompt shares its rubric), and a plan given with the request (``meta["plan"]``) is
        used as is."""
        inputs = [request_input(r) for r in requests]
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

    def evaluate(self, requests: Sequence[RewardRequest]) -> list[Evaluation]:
        inputs = self.inputs(requests)
        ids = [self.rm.encode_input(inp, req.response, self.cfg.input_mode, self.cfg.top_k_profile)
               for inp, req in zip(inputs, requests)]
        return [Evaluation((s,)) for s in self.rm.score_ids(ids)]


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

    @property
    def compares_with_reference(self) -> bool:
        return self.cfg.compares_with_reference

    @property
    def scores_reference_too(self) -> bool:
        return self.cfg.genrm_mode == "sec_reference"

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
        if self.cfg.genrm_mode == "pairwise":
            return self._pairwise(inputs)
        return self._sec_reference(inputs)

    def _pairwise(self, inputs: list[RMInput]) -> list[Evaluation]:
        return judged_against_reference(self.engine, self.params, inputs, self.cfg.verdict_readout,
                                        mode=self.cfg.input_mode, top_k=self.cfg.top_k_profile)

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

        out, todo = _with_reference(inputs, "sec_reference")
        if self.cfg.scaling is not None and self.cfg.scaling.enabled:
            for i, evaluation in zip(todo, self._scaled([inputs[i] for i in todo])):
                out[i] = evaluation
            return out  # type: ignore[return-value]
        prompts = [sec_compact_prompt(inputs[i], inputs[i].chosen, inputs[i].rejected)
                   if self.cfg.sec_format == "sec_compact" else
                   sec_prompt(inputs[i], inputs[i].chosen, inputs[i].rejected, mode=self.cfg.input_mode,
                              top_k=self.cfg.top_k_profile, use_stated=self.cfg.use_stated_preferences)
                   for i in todo]
        for i, text in _generated_texts(self.engine, self.params, prompts, todo, inputs, out):
            parsed = parse_sec(text)
            if parsed.ok:
                sec = parsed.value
                out[i] = Evaluation((sec.final["response_1"], sec.final["response_2"]), None, sec.persona,
                                    [{"name": c.name, "weight": c.weight} for c in sec.criteria], inputs[i].plan)
            else:
                out[i] = Evaluation(None, parsed.error, plan=inputs[i].plan)
        return out  # type: ignore[return-value]

    def _scaled(self, inputs: list[RMInput]) -> list[Evaluation]:
        """The response's (slot response_1) fused score over m chains and n neighbours (scaling.scorer)."""
        from pr_rlhf.scaling.scorer import decide

        if self._scaler is None:
            self._scaler = build_scaled_judge(self.cfg, self.engine)
        evidence = self._scaler.evidence(inputs, slots=["A"] * len(inputs))
        scaling = self.cfg.scaling
        out: list[Evaluation] = []
        for ev in evidence:
            d = decide(ev, scaling.m, scaling.n, scaling.self_weight, scaling.neighbour_weight,
                       scaling.certainty_weighting)
            out.append(Evaluation(tuple(d.scores), None) if d.scores is not None else
                       Evaluation(None, "no_valid_chain: " + ", ".join(
                           f"{k} x{v}" for k, v in (ev.greedy.failures + ev.samples.failures).items())))
        return out


class RubricScorer(Scorer):
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

    def evaluate(self, requests: Sequence[RewardRequest]) -> list[Evaluation]:
        from pr_rlhf.reward.rubric_judge import RubricAspectInput

        rubrics = [[RubricAspectInput(str(a.get("aspect", "")), str(a.get("reason", "") or ""),
                                      str(a.get("evidence", "") or "")) for a in (r.meta or {}).get("rubric") or []]
                   for r in requests]
        verdicts = self.judge.judge([r.question for r in requests], [r.response for r in requests], rubrics,
                                    [str((r.meta or {}).get("narrative", "") or "") for r in requests])
        return [Evaluation((v.score,)) if v.ok else
                Evaluation(None, f"{v.error}: {v.message}" if v.message else v.error) for v in verdicts]

    def close(self) -> None:
        if self._own:
            self.engine.close()


class EmbeddingScorer(Scorer):
    """A trained embedding reward model (``bt_embedding``, ``pal``, ``lore``, ``vpl``, ``gpo``;
    :mod:`pr_rlhf.embedrm`): the request's user is the seen user the model learned, or is read from the request's
    history pairs (``meta["history"]``), else the population's prior."""

    def __init__(self, cfg: RewardConfig, embedder: Any = None):
        from pr_rlhf.embedrm.scoring import EmbeddingRewarder

        self.rewarder = EmbeddingRewarder(cfg.model, embedder=embedder or cfg.embedder, kind=cfg.kind,
                                          history_pairs=cfg.history_pairs, adapt_steps=cfg.adapt_steps)

    def evaluate(self, requests: Sequence[RewardRequest]) -> list[Evaluation]:
        from pr_rlhf.embedrm.scoring import ScoreItem
        from pr_rlhf.embedrm.train import EmbeddingDataError

        out: list[Evaluation | None] = [None] * len(requests)
        items, rows = [], []
        for i, r in enumerate(requests):
            history = (r.meta or {}).get("history") or []
            try:
                self.rewarder.read_history(history)   # a malformed history is this request's error, not the batch's
            except EmbeddingDataError as exc:
                out[i] = Evaluation(None, f"bad_history: {exc}")
                continue
            items.append(ScoreItem(r.user_id, r.question, r.response, [dict(h) for h in history]))
            rows.append(i)
        for i, value in zip(rows, self.rewarder.rewards(items)):
            out[i] = Evaluation((value,))
        return [e for e in out if e is not None]


class PersonaScorer(Scorer):
    """A SynthesizeMe persona per user (built once per set of history pairs, every user a batch lacks at once; read
    from ``cfg.personas`` first) read as the user's stated preferences by the judge (its 1-10 rating, or the
    pairwise judge against the reference), or by a scalar RM's user block (input mode 'persona')."""

    def __init__(self, cfg: RewardConfig, engine: Any = None):
        self.cfg = cfg
        self._own = engine is None
        self._engine = engine
        self.book = persona_book(cfg)
        self.params = self.book.params   # the judge reads with the sampling it induces with
        self.rm = None
        if cfg.scalar_rm is not None:
            from pr_rlhf.reward.scalar import ScalarRM

            self.rm = ScalarRM(cfg.scalar_rm, device=cfg.scalar_rm.device, dtype=cfg.scalar_rm.dtype)
        else:
            self.engine   # the judge reads every request: started now, not on the first one

    @property
    def engine(self) -> Any:
        """The judge's engine, started when first needed: a scalar RM reading a persona book needs none unless a
        user is missing from the book."""
        if self._engine is None:
            from pr_rlhf.models import make_engine

            self._engine = make_engine(self.cfg.judge)
        return self._engine

    @property
    def compares_with_reference(self) -> bool:
        return self.cfg.compares_with_reference

    def evaluate(self, requests: Sequence[RewardRequest]) -> list[Evaluation]:
        from dataclasses import replace

        from pr_rlhf.reward.inputs import stated_block

        inputs = [request_input(r) for r in requests]
        asked = [(inp.user_id, inp.history) for inp in inputs]
        if self.book.lacks(asked):
            self.book.fill(self.engine, asked)   # every missing user: one batch
        inputs = [replace(inp, stated_preferences=self.book.persona(inp.user_id, inp.history).text) for inp in inputs]
        if self.cfg.compares_with_reference:
            return judged_against_reference(self.engine, self.params, inputs, self.cfg.verdict_readout,
                                            blocks=[stated_block(inp) for inp in inputs])
        if self.rm is not None:   # the persona in the user block, as a BT RM trained in input mode 'persona' reads it
            ids = [self.rm.encode_input(inp, inp.chosen, "persona", 1) for inp in inputs]
            return [Evaluation((s,)) for s in self.rm.score_ids(ids)]
        from pr_rlhf.prompts import chat
        from pr_rlhf.reward.inputs import conversation_block
        from pr_rlhf.reward.pointwise import parse_score

        prompts = [chat("pointwise", user_block=stated_block(inp), conversation_block=conversation_block(inp),
                        question=inp.question, answer=inp.chosen) for inp in inputs]
        out = []
        for gen in self.engine.generate(prompts, self.params):
            if not gen.ok or not gen.samples:
                out.append(Evaluation(None, f"engine_error: {gen.error}" if gen.error else "empty"))
                continue
            parsed = parse_score(gen.samples[0].text)
            out.append(Evaluation((parsed.value,)) if parsed.ok else Evaluation(None, parsed.error))
        return out

    def close(self) -> None:
        if self._own and self._engine is not None:
            self._engine.close()


def persona_book(cfg: RewardConfig) -> Any:
    """The persona kind's :class:`~pr_rlhf.reward.persona.PersonaBook` (its file: ``cfg.personas``): the one
    place the induction's settings are read, for the scorer and for a BT RM trained on personas alike."""
    from pr_rlhf.models.base import SamplingParams
    from pr_rlhf.reward.persona import PersonaBook

    gen = cfg.generation
    params = SamplingParams(temperature=gen.temperature, top_p=gen.top_p, max_tokens=gen.max_tokens,
                            seed=cfg.seed if gen.temperature > 0 else None)
    return PersonaBook(params, history_pairs=cfg.history_pairs, candidates=cfg.candidates,
                       validation=cfg.validation_pairs, seed=cfg.seed, path=cfg.personas)


def build_scaled_judge(cfg: RewardConfig, engine: Any) -> Any:
    """A ScaledJudge for a reward worker: prototypes loaded from their artifacts (for the configured embedder),
    the member users' histories from ``scaling_members``."""
    from pr_rlhf.scaling.scorer import ScaledJudge

    scaling = cfg.scaling
    index = embedder = None
    histories: dict = {}
    profiles: dict = {}
    if scaling.n > 0:
        from pr_rlhf.models.embedders import make_embedder
        from pr_rlhf.scaling.embedding import embedder_name
        from pr_rlhf.scaling.grid import member_histories
        from pr_rlhf.scaling.index import PrototypeIndex

        embedder = make_embedder(scaling.prototypes.embedder, cache=False)
        index = PrototypeIndex.load(scaling.prototypes.path, expected_embedder=embedder_name(embedder))
        histories, _ = member_histories(cfg.scaling_members, scaling.neighbour_history_pairs)
        if scaling.prototypes.placement == "profile":   # requests are placed by their user's posts in the shards
            from pr_rlhf.scaling.embedding import profile_vectors
            from pr_rlhf.scaling.grid import profile_posts

            profiles = profile_vectors(profile_posts(cfg.scaling_members), embedder)
    return ScaledJudge(engine, scaling, seed=cfg.seed, fmt=cfg.sec_format, index=index, embedder=embedder,
                       histories=histories, mode=cfg.input_mode, top_k=cfg.top_k_profile,
                       use_stated=cfg.use_stated_preferences, profiles=profiles)


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
    if cfg.kind in EMBEDDING_KINDS:
        return EmbeddingScorer(cfg)
    if cfg.kind == "persona":
        return PersonaScorer(cfg)
    raise ValueError(f"unknown reward kind {cfg.kind!r}")
