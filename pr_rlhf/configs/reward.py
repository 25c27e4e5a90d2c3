"""Typed config of a reward scorer (what one reward worker hosts) and of the pool of workers that serves it.

Imports pydantic only (through :mod:`pr_rlhf.configs.recipe`): never torch or Ray. The scorers themselves live in
:mod:`pr_rlhf.scorers`, the Ray workers that host them in ``workers/reward.py``.

A scorer config is one member per kind, chosen by ``kind`` (absent: ``gold``), each holding only its own fields;
fields are typed :data:`RewardConfig` (the union) and code builds one with :func:`reward_config`.

- ``"gold"`` (:class:`GoldRewardConfig`): the synthetic world's exact downstream judge:
  ``World.gold_utility(response, user_id)`` of the world built from ``world`` (``normalize``: rescaled by the
  user's attainable range to [0, 1]).
- ``"world_estimate"`` (:class:`WorldEstimateRewardConfig`): a reward model of known benchmark accuracy on the
  synthetic world: the utility ``w_hat . x`` of the response with the user's weights as one of the world's
  reference predictors knows them (``estimator``: ``oracle`` posterior mean from ``history_pairs`` history pairs,
  ``logistic_regression``, ``no_history`` prior mean, ``true_weights``; see ``pr_rlhf.world.reference``). Its
  pairwise accuracy is the reference accuracy, so a set of them spans a range of benchmark accuracies at no model
  cost.
- ``"scalar"`` (:class:`ScalarRewardConfig`): a sequence-classification reward model
  (:class:`~pr_rlhf.reward.scalar.ScalarRM`) on (user block + question, response).
- ``"genrm"`` (:class:`GenRMRewardConfig`): a generative reward model on a local engine (``judge``).
  ``genrm_mode="sec_reference"``: the P-GenRM evaluation chain compares the response (slot response_1) with the
  request's reference answer (slot response_2) and the reward is the chain's final score of response_1 (1-10);
  ``"pointwise"``: the pointwise prompt rates the response alone, 1-10; ``"pairwise"``: the pairwise judge compares
  the response (slot A) with the reference (slot B), the reward its verdict (1 / 0), or with
  ``verdict_readout="probability"`` the judge's own probability of answering A. An optional planner turns the retrieved
  profile into rubric aspects first (``planner`` + ``input_mode="plan"``).
- ``"http"`` (:class:`HTTPRewardConfig`): the same generative scorer through an OpenAI-compatible server (its
  ``judge`` is an ``openai`` engine).
- ``"rubric"`` (:class:`RubricRewardConfig`): the downstream rubric judge on real data
  (``pr_rlhf.reward.rubric_judge``): ``judge`` grades the response 0/1/2 on each aspect of the query's rubric
  (``meta["rubric"]``; with ``meta["narrative"]``), all aspects in one call (``rubric_mode="all"``) or one call per
  aspect as LaMP-QA's evaluator (``"per_aspect"``); the reward is the mean grade / 2 in [0, 1]. Any engine backend
  (a local model, or an OpenAI-compatible server).
- ``"bt_embedding"``, ``"pal"``, ``"lore"``, ``"vpl"``, ``"gpo"`` (:class:`EmbeddingRewardConfig`): a reward model
  on frozen text embeddings trained by ``pr-rlhf leaderboard`` (:mod:`pr_rlhf.embedrm`): the global Bradley-Terry
  floor, PAL, LoRe, VPL, GPO. A request's user is the seen user the model learned, or is read from the request's
  history pairs (``meta["history"]``: PAL and LoRe fit the user's weights on them, VPL encodes them, GPO attends to
  them); with neither, the population's prior.
- ``"persona"`` (:class:`PersonaRewardConfig`): SynthesizeMe's persona, induced per user from the request's
  history pairs on any engine and read by a judge (or a scalar RM) as the user's stated preferences.

What a scorer builds is said by its config: :meth:`RewardBase.engines` lists the engines (an
:class:`EngineRef` each: the field, its config, the roles it plays), which the scorers build, the pre-flight check
(``pr_rlhf.resources``) checks against the worker's GPUs and `pr-rlhf plan` sizes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from pr_rlhf.configs.base import (
    EngineBase,
    EngineConfig,
    GenerationConfig,
    OpenAIEngineConfig,
    ScalarRMConfig,
    StrictModel,
    VLLMEngineConfig,
    engine_config,
    parser,
    tagged_union,
)
from pr_rlhf.configs.scaling import ScalingConfig
from pr_rlhf.configs.world import WorldConfig

RewardKind = Literal["gold", "world_estimate", "scalar", "genrm", "http", "rubric", "bt_embedding", "pal", "lore",
                     "vpl", "gpo", "persona"]
EMBEDDING_KINDS = ("bt_embedding", "pal", "lore", "vpl", "gpo")
WORLD_ESTIMATORS = ("oracle", "logistic_regression", "no_history", "true_weights")


@dataclass(frozen=True)
class EngineRef:
    """One engine a worker builds: the recipe field that configures it (relative to its section, e.g. ``judge``;
    :meth:`at` prefixes the section's path), its config (a generation engine or a scalar RM), and the roles it plays
    (a planner equal to the judge is the judge's engine, built once: roles ``("judge", "planner")``)."""

    field: str
    config: EngineBase | ScalarRMConfig
    roles: tuple[str, ...] = ()

    def at(self, where: str) -> EngineRef:
        """The same engine named by its full recipe path (``where`` + ``.`` + its field)."""
        return replace(self, field=f"{where}.{self.field}" if where else self.field)

    @property
    def gpus(self) -> int:
        """GPUs it spans where it runs on CUDA (0: on the CPU, or behind an OpenAI-compatible server): vLLM's
        tensor parallelism, else one."""
        cfg = self.config
        if isinstance(cfg, OpenAIEngineConfig) or not cfg.device.startswith("cuda"):
            return 0
        return cfg.tensor_parallel_size if isinstance(cfg, VLLMEngineConfig) else 1


def _with_planner(engines: list[EngineRef], planner: EngineConfig | None) -> list[EngineRef]:
    """``engines`` and the planner: its own engine, or (equal to one of them) a role of that engine."""
    if planner is None:
        return engines
    for i, ref in enumerate(engines):
        if ref.config == planner:
            engines[i] = replace(ref, roles=(*ref.roles, "planner"))
            return engines
    return [*engines, EngineRef("planner", planner, ("planner",))]


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


class RewardBase(StrictModel):
    """What every scorer has: its kind, the seed of its sampling, the pool of workers that hosts it."""

    INHERITED: ClassVar[tuple[str, ...]] = ("seed",)

    kind: str
    seed: int = 0
    pool: RewardPoolConfig = Field(default_factory=RewardPoolConfig)

    def engines(self) -> list[EngineRef]:
        """The engines a worker hosting this scorer builds, each once (none: the world's judges and the embedding
        models, which run on the CPU without one)."""
        return []

    def engine_for(self, role: str) -> EngineRef | None:
        """The engine that plays ``role`` ("judge", "planner", "scalar_rm"), or None."""
        return next((ref for ref in self.engines() if role in ref.roles), None)


class GoldRewardConfig(RewardBase):
    INHERITED: ClassVar[tuple[str, ...]] = ("seed", "world")

    kind: Literal["gold"] = "gold"
    world: WorldConfig = Field(default_factory=WorldConfig, description="the synthetic world to judge in")
    normalize: bool = Field(False, description="(u - min_u) / (max_u - min_u) over the user's attainable "
                                               "utilities, in [0, 1]")


class WorldEstimateRewardConfig(RewardBase):
    INHERITED: ClassVar[tuple[str, ...]] = ("seed", "world")

    kind: Literal["world_estimate"] = "world_estimate"
    world: WorldConfig = Field(default_factory=WorldConfig, description="the synthetic world to judge in")
    estimator: Literal["oracle", "logistic_regression", "no_history", "true_weights"] = Field(
        "oracle", description="which reference predictor's weights score the response")
    history_pairs: int = Field(3, ge=0, description="the user's history pairs it learns from")


class ModelRewardBase(RewardBase):
    """The model-based scorers (scalar, genrm, http): what they see about the user, and the optional planner."""

    generation: GenerationConfig = Field(default_factory=GenerationConfig, description="judge/planner sampling")
    input_mode: Literal["none", "profile", "plan", "history"] = Field(
        "none", description="'profile': the top-k retrieved posts; 'plan': the planner's aspects (needs planner); "
                            "'history': the user's first top-k history pairs (meta['history'])")
    top_k_profile: int = Field(10, ge=1)
    planner: EngineConfig | None = Field(None, description="planner engine (input_mode='plan'); an engine equal "
                                                           "to judge is shared")
    planner_max_aspects: int = Field(8, ge=1)

    @model_validator(mode="after")
    def _planner_matches_input_mode(self) -> ModelRewardBase:
        if self.input_mode == "plan" and self.planner is None:
            raise ValueError("input_mode 'plan' needs a planner engine (reward.planner)")
        if self.planner is not None and self.input_mode != "plan":
            raise ValueError("a planner is set but input_mode is not 'plan': its aspects would not be shown")
        return self


class ScalarRewardConfig(ModelRewardBase):
    kind: Literal["scalar"] = "scalar"
    scalar_rm: ScalarRMConfig = Field(default_factory=ScalarRMConfig)

    def engines(self) -> list[EngineRef]:
        return _with_planner([EngineRef("scalar_rm", self.scalar_rm, ("scalar_rm",))], self.planner)


class GenRMRewardConfig(ModelRewardBase):
    kind: Literal["genrm"] = "genrm"
    judge: EngineConfig = Field(default_factory=engine_config, description="the generative RM's engine")
    genrm_mode: Literal["sec_reference", "pointwise", "pairwise"] = Field(
        "sec_reference", description="'sec_reference': SEC of (response, meta['reference']), reward = final score "
                                     "of response_1; 'pointwise': the 1-10 pointwise rating; 'pairwise': the "
                                     "pairwise judge on (response in slot A, meta['reference'] in slot B)")
    verdict_readout: Literal["text", "probability"] = Field(
        "text", description="pairwise: the verdict the judge writes ('Result: A' -> 1, 'B' -> 0; unparsed: an "
                            "error), or its probability of 'Result: A' against 'Result: B' read at the start of its "
                            "answer (the judge writes nothing: a verdict for every pair, even from a model too small "
                            "to write one; needs an engine that scores continuations)")
    use_stated_preferences: bool = Field(True, description="show stated preferences to the SEC judge")
    scaling: ScalingConfig | None = Field(None, description="test-time scaling (sec_reference): m chains per "
                                                            "request averaged, n neighbours' histories fused "
                                                            "(needs scaling.prototypes.path and scaling_members)")
    scaling_members: str | None = Field(None, description="shards holding the prototype member users' histories")
    response_view: Literal["text", "world_compact"] = Field(
        "text", description="what the judge reads of a response: its text, or (a tiny GenRM trained on a "
                            "compact-rendered synthetic world) the world's compact rendering of the attributes "
                            "measured on it (``world``'s attributes), so free-text policy samples are in its "
                            "vocabulary")
    world: WorldConfig = Field(default_factory=WorldConfig, description="response_view 'world_compact': the world "
                                                                        "whose attributes are rendered")
    sec_format: Literal["sec", "sec_compact"] = Field("sec", description="sec_reference: the full P-GenRM prompt, "
                                                      "or the compact history-only one of a tiny GenRM")

    @property
    def compares_with_reference(self) -> bool:
        """The chain judges each response against a reference answer (meta['reference'])."""
        return self.genrm_mode in ("sec_reference", "pairwise")

    def engines(self) -> list[EngineRef]:
        return _with_planner([EngineRef("judge", self.judge, ("judge",))], self.planner)

    def inherited_fields(self) -> tuple[str, ...]:
        """The world only where the judge reads it (the compact view)."""
        return ("seed", "world") if self.response_view == "world_compact" else ("seed",)

    @model_validator(mode="after")
    def _scaling_needs(self) -> GenRMRewardConfig:
        if self.scaling is not None and self.scaling.enabled:
            if self.genrm_mode != "sec_reference":
                raise ValueError("scaling applies to the GenRM's evaluation chains: kind genrm/http with "
                                 "genrm_mode 'sec_reference'")
            if self.scaling.n > 0 and not (self.scaling.prototypes.path and self.scaling_members):
                raise ValueError("scaling.n > 0 needs scaling.prototypes.path (artifacts built by `pr-rlhf "
                                 "scaling`) and scaling_members (the shards of the member users)")
        if self.verdict_readout != "text" and self.genrm_mode != "pairwise":
            raise ValueError(f"verdict_readout {self.verdict_readout!r} reads the pairwise judge's verdict: set "
                             f"genrm_mode 'pairwise' (it is {self.genrm_mode!r})")
        return self


class HTTPRewardConfig(GenRMRewardConfig):
    """The GenRM scorer through an OpenAI-compatible server: no default judge, since it names a server."""

    kind: Literal["http"] = "http"  # type: ignore[assignment]
    judge: OpenAIEngineConfig = Field(..., description="the server of the generative RM")  # type: ignore[assignment]


class RubricRewardConfig(RewardBase):
    kind: Literal["rubric"] = "rubric"
    judge: EngineConfig = Field(default_factory=engine_config, description="the rubric judge's engine")
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description="judge sampling")
    rubric_mode: Literal["all", "per_aspect"] = Field("all", description="every aspect in one call, or one call "
                                                                        "per aspect (LaMP-QA's evaluator)")

    def engines(self) -> list[EngineRef]:
        return [EngineRef("judge", self.judge, ("judge",))]


class EmbeddingRewardConfig(RewardBase):
    """A trained embedding reward model (one kind per method; the method of the folder must match the kind)."""

    kind: str
    model: str = Field(..., description="the folder of the trained model (config.json + model.safetensors)")
    embedder: str = Field("minilm", description="the text encoder the model was trained on: 'minilm' or a local "
                                                "encoder folder (pr_rlhf.models.embedders)")
    history_pairs: int = Field(8, ge=0, description="the most history pairs of a request the user's state reads "
                                                    "(the most recent)")
    adapt_steps: int = Field(200, ge=1, description="pal / lore: optimizer steps fitting a new user's weights")


class BTEmbeddingRewardConfig(EmbeddingRewardConfig):
    kind: Literal["bt_embedding"] = "bt_embedding"


class PALRewardConfig(EmbeddingRewardConfig):
    kind: Literal["pal"] = "pal"


class LoReRewardConfig(EmbeddingRewardConfig):
    kind: Literal["lore"] = "lore"


class VPLRewardConfig(EmbeddingRewardConfig):
    kind: Literal["vpl"] = "vpl"


class GPORewardConfig(EmbeddingRewardConfig):
    kind: Literal["gpo"] = "gpo"


class PersonaRewardConfig(RewardBase):
    """A persona per user, induced from the request's history pairs as SynthesizeMe does
    (``pr_rlhf.reward.persona``), read as the user's stated preferences by the judge (its 1-10 rating, or the
    pairwise judge against the request's reference) or, with ``scalar_rm``, by a scalar RM's user block ("FT RM +
    persona")."""

    kind: Literal["persona"] = "persona"
    judge: EngineConfig = Field(default_factory=engine_config, description="writes the traces and the persona, and "
                                                                           "rates responses unless scalar_rm is set")
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description="the engine's sampling")
    candidates: int = Field(3, ge=1, description="personas drafted per user; the one predicting the user's held-out "
                                                 "choices best is kept")
    validation_pairs: int = Field(2, ge=1, description="the user's latest history pairs held out to pick the persona")
    history_pairs: int = Field(8, ge=2, description="the most history pairs of a request the persona is built from")
    personas: str | None = Field(None, description="a persona book (JSON, pr_rlhf.reward.persona.PersonaBook) read "
                                                   "before inducing: e.g. the personas a BT RM was trained with; "
                                                   "personas induced while scoring are not written back")
    scalar_rm: ScalarRMConfig | None = Field(None, description="read the persona with this scalar RM (in input mode "
                                                               "'persona', as `pr-rlhf train-rm` trains one) "
                                                               "instead of the judge")
    reader: Literal["pointwise", "pairwise"] = Field(
        "pointwise", description="how the judge reads the persona: its 1-10 rating of the response, or the pairwise "
                                 "judge on (response in slot A, meta['reference'] in slot B) as genrm_mode "
                                 "'pairwise' (SynthesizeMe's own reader)")
    verdict_readout: Literal["text", "probability"] = Field(
        "text", description="reader 'pairwise': the verdict the judge writes, or its probability of 'Result: A' "
                            "against 'Result: B' (as the genrm kind's verdict_readout)")

    @property
    def compares_with_reference(self) -> bool:
        """The pairwise reader judges each response against a reference answer (meta['reference']); a scalar RM
        reads only with the pointwise reader (the validator's rule)."""
        return self.reader == "pairwise"

    @model_validator(mode="after")
    def _reader_fits(self) -> PersonaRewardConfig:
        if self.verdict_readout != "text" and self.reader != "pairwise":
            raise ValueError(f"verdict_readout {self.verdict_readout!r} reads the pairwise judge's verdict: set "
                             f"reader 'pairwise' (it is {self.reader!r})")
        if self.scalar_rm is not None and self.reader != "pointwise":
            raise ValueError("scalar_rm reads the persona itself: leave reader at 'pointwise' (the judge's reader)")
        return self

    def engines(self) -> list[EngineRef]:
        """The judge always (it writes the traces and the persona), and the scalar RM that reads it when set."""
        judge = EngineRef("judge", self.judge, ("judge",))
        return [judge] if self.scalar_rm is None else [judge, EngineRef("scalar_rm", self.scalar_rm, ("scalar_rm",))]


REWARD_MEMBERS: dict[str, type[RewardBase]] = {
    "gold": GoldRewardConfig, "world_estimate": WorldEstimateRewardConfig, "scalar": ScalarRewardConfig,
    "genrm": GenRMRewardConfig, "http": HTTPRewardConfig, "rubric": RubricRewardConfig,
    "bt_embedding": BTEmbeddingRewardConfig, "pal": PALRewardConfig, "lore": LoReRewardConfig,
    "vpl": VPLRewardConfig, "gpo": GPORewardConfig, "persona": PersonaRewardConfig}
REWARD_KINDS: tuple[str, ...] = tuple(REWARD_MEMBERS)
RewardConfig = tagged_union(REWARD_MEMBERS, "kind", "gold", "reward")
reward_config: Callable[..., RewardBase] = parser(RewardConfig)
