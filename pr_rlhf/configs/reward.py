"""Typed config of a reward scorer (what one reward worker hosts) and of the pool of workers that serves it.

Imports pydantic only (through :mod:`pr_rlhf.configs.recipe`): never torch or Ray. The scorers themselves live in
``workers/reward.py``.

Kinds (``RewardConfig.kind``):

- ``"gold"``: the synthetic world's exact downstream judge: ``World.gold_utility(response, user_id)`` of the world
  built from ``world`` (``normalize``: rescaled by the user's attainable range to [0, 1]).
- ``"world_estimate"``: a reward model of known benchmark accuracy on the synthetic world: the utility
  ``w_hat . x`` of the response with the user's weights as one of the world's reference predictors knows them
  (``estimator``: ``oracle`` posterior mean from ``history_pairs`` history pairs, ``logistic_regression``,
  ``no_history`` prior mean, ``true_weights``; see ``pr_rlhf.world.reference``). Its pairwise accuracy is the
  reference accuracy, so a set of them spans a range of benchmark accuracies at no model cost.
- ``"scalar"``: a sequence-classification reward model (:class:`~pr_rlhf.reward.scalar.ScalarRM`) on
  (user block + question, response).
- ``"genrm"``: a generative reward model on a local engine (``judge``). ``genrm_mode="sec_reference"``: the
  P-GenRM evaluation chain compares the response (slot response_1) with the request's reference answer (slot
  response_2) and the reward is the chain's final score of response_1 (1-10); ``"pointwise"``: the pointwise
  prompt rates the response alone, 1-10. An optional planner turns the retrieved profile into rubric aspects
  first (``planner`` + ``input_mode="plan"``).
- ``"rubric"``: the downstream rubric judge on real data (``pr_rlhf.reward.rubric_judge``): ``judge`` grades the
  response 0/1/2 on each aspect of the query's rubric (``meta["rubric"]``; with ``meta["narrative"]``), all aspects
  in one call (``rubric_mode="all"``) or one call per aspect as LaMP-QA's evaluator (``"per_aspect"``); the reward
  is the mean grade / 2 in [0, 1]. Any engine backend (a local model, or an OpenAI-compatible server).
- ``"http"``: the same generative scorer through an OpenAI-compatible server (``judge.backend`` must be
  ``"openai"``).
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pr_rlhf.configs.base import (
    EngineConfig,
    GenerationConfig,
    ScalarRMConfig,
    StrictModel,
)
from pr_rlhf.configs.scaling import ScalingConfig
from pr_rlhf.configs.world import WorldConfig

RewardKind = Literal["gold", "world_estimate", "scalar", "genrm", "http", "rubric"]
REWARD_KINDS: tuple[str, ...] = ("gold", "world_estimate", "scalar", "genrm", "http", "rubric")
WORLD_ESTIMATORS = ("oracle", "logistic_regression", "no_history", "true_weights")


class RewardPoolConfig(StrictModel):
    """How many reward workers, what each holds, and how the pool talks to them."""

    workers: int = Field(1, ge=1, description="reward worker actors; requests are routed by user (sticky)")
    num_cpus: float = Field(1.0, ge=0, description="Ray CPUs per worker (logical; fractions allowed)")
    num_gpus: float = Field(0.0, ge=0, description="Ray GPUs per worker")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources per worker "
                                                                         "(pins workers to the nodes offering them)")
    batch_size: int = Field(8, ge=1, description="requests per call to a worker")
    max_inflight: int = Field(2, ge=1, description="batches outstanding per worker at any time")
    max_attempts: int = Field(3, ge=1, description="sends per request (worker deaths, failed calls) before the "
                                                   "request is given up with an error")


class RewardConfig(StrictModel):
    kind: RewardKind = "gold"
    seed: int = 0
    # gold
    world: WorldConfig = Field(default_factory=WorldConfig, description="gold: the synthetic world to judge in")
    normalize: bool = Field(False, description="gold: (u - min_u) / (max_u - min_u) over the user's attainable "
                                               "utilities, in [0, 1]")
    # world_estimate
    estimator: Literal["oracle", "logistic_regression", "no_history", "true_weights"] = Field(
        "oracle", description="world_estimate: which reference predictor's weights score the response")
    history_pairs: int = Field(3, ge=0, description="world_estimate: the user's history pairs it learns from")
    # scalar
    scalar_rm: ScalarRMConfig = Field(default_factory=ScalarRMConfig)
    # genrm / http
    judge: EngineConfig = Field(default_factory=EngineConfig, description="genrm/http: the generative RM's engine")
    genrm_mode: Literal["sec_reference", "pointwise"] = Field(
        "sec_reference", description="'sec_reference': SEC of (response, meta['reference']), reward = final score "
                                     "of response_1; 'pointwise': the 1-10 pointwise rating")
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description="judge/planner sampling")
    rubric_mode: Literal["all", "per_aspect"] = Field("all", description="rubric: every aspect in one call, or one "
                                                                        "call per aspect (LaMP-QA's evaluator)")
    use_stated_preferences: bool = Field(True, description="genrm: show stated preferences to the SEC judge")
    # what the model-based scorers see about the user
    input_mode: Literal["none", "profile", "plan"] = Field(
        "none", description="'profile': the top-k retrieved posts; 'plan': the planner's aspects (needs planner)")
    top_k_profile: int = Field(10, ge=1)
    planner: EngineConfig | None = Field(None, description="planner engine (input_mode='plan'); an engine equal "
                                                           "to judge is shared")
    planner_max_aspects: int = Field(8, ge=1)
    # test-time scaling of the GenRM (genrm / http, sec_reference)
    scaling: ScalingConfig | None = Field(None, description="genrm: m chains per request averaged, n neighbours' "
                                                            "histories fused (needs scaling.prototypes.path and "
                                                            "scaling_members)")
    scaling_members: str | None = Field(None, description="shards holding the prototype member users' histories")
    response_view: Literal["text", "world_compact"] = Field(
        "text", description="genrm/http: what the judge reads of a response: its text, or (a tiny GenRM trained on "
                            "a compact-rendered synthetic world) the world's compact rendering of the attributes "
                            "measured on it (reward.world's attributes), so free-text policy samples are in its "
                            "vocabulary")
    sec_format: Literal["sec", "sec_compact"] = Field("sec", description="genrm sec_reference: the full P-GenRM "
                                                      "prompt, or the compact history-only one of a tiny GenRM")
    pool: RewardPoolConfig = Field(default_factory=RewardPoolConfig)

    @model_validator(mode="after")
    def _check(self) -> RewardConfig:
        if self.kind == "http" and self.judge.backend != "openai":
            raise ValueError("kind 'http' needs judge.backend='openai' (an OpenAI-compatible server)")
        if self.kind not in ("gold", "world_estimate", "rubric"):
            if self.input_mode == "plan" and self.planner is None:
                raise ValueError("input_mode 'plan' needs a planner engine (reward.planner)")
            if self.planner is not None and self.input_mode != "plan":
                raise ValueError("a planner is set but input_mode is not 'plan': its aspects would not be shown")
        if self.scaling is not None and self.scaling.enabled:
            if self.kind not in ("genrm", "http") or self.genrm_mode != "sec_reference":
                raise ValueError("scaling applies to the GenRM's evaluation chains: kind genrm/http with "
                                 "genrm_mode 'sec_reference'")
            if self.scaling.n > 0 and not (self.scaling.prototypes.path and self.scaling_members):
                raise ValueError("scaling.n > 0 needs scaling.prototypes.path (artifacts built by `pr-rlhf "
                                 "scaling`) and scaling_members (the shards of the member users)")
        return self
