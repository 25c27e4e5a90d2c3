"""Typed configuration of the P-GenRM training pipeline (the ``pgenrm:`` section of a recipe): PSI (SFT on teacher
chains) -> CRE (GRPO with process + outcome rewards) -> hard-negative curriculum (GRPO, outcome only, the share of
hard pairs rising), and the planner's SFT. Pydantic only: ``pr-rlhf check`` validates it without torch or Ray.

The section is one of two members, chosen by ``psi.source`` (absent: ``world``): :class:`WorldPGenRMConfig` (the
synthetic world: its oracle teacher, the exact PR, the headroom check) and :class:`RealPGenRMConfig` (shards of
real data: a teacher engine, an LLM-judged PR, label-margin hard negatives). Each holds only its data's fields, so
a world field in a real-data recipe (or the reverse) is an unknown field. Fields are typed :data:`PGenRMConfig`
(the union); code builds one with :func:`pgenrm_config`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, Discriminator, Field, Tag, model_validator

from pr_rlhf.configs.base import EngineConfig, StrictModel, UnionKey, engine_config, parser
from pr_rlhf.configs.learner import KLConfig, LearnerConfig, RolloutLayout
from pr_rlhf.configs.world import WorldConfig

# How the vote chain's teacher picks ``Type`` (docs/protocols.md section 4): "votes" the type with most votes (the
# best rule a student can read off its own prompt), "recent_pair" uniformly among the types that agree with the most
# recent history pair (a teacher that uses less than the student sees: the student's context holds a better rule)
TeacherRule = Literal["votes", "recent_pair"]
Stage = Literal["base", "psi", "cre", "curriculum", "control", "cre_no_pr", "cre_no_or", "planner"]
# Each GenRM stage starts from the model the previous one wrote (base: the initial model, evaluated only). The
# control is the curriculum's compute-matched twin: the same further GRPO steps from CRE at the natural mix.
STAGE_PARENT: dict[str, str | None] = {"base": None, "psi": None, "cre": "psi", "curriculum": "cre",
                                       "control": "cre", "cre_no_pr": "psi", "cre_no_or": "psi", "planner": None}
GRPO_STAGES: tuple[str, ...] = ("cre", "curriculum", "control", "cre_no_pr", "cre_no_or")
MAIN_STAGES: tuple[str, ...] = ("base", "psi", "cre", "curriculum")
CONTROL = "the compute-matched control of the curriculum (default: the curriculum's settings at the natural mix)"


class SFTStageConfig(StrictModel):
    """A supervised stage on the learner group (loss on the target tokens only)."""

    steps: int = Field(600, ge=1)
    batch_size: int = Field(16, ge=1)
    lr: float = Field(1e-3, gt=0, description="peak learning rate (linear warm-up, then cosine decay)")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="the cosine decays to lr * this")
    warmup_steps: int = Field(20, ge=0)
    checkpoint_every: int = Field(100, ge=1)

    def lr_at(self, step: int) -> float:
        """Linear warm-up to ``lr`` over ``warmup_steps``, then cosine decay to ``lr * min_lr_ratio``."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(self.steps - self.warmup_steps - 1, 1)
        floor = self.lr * self.min_lr_ratio
        return floor + (self.lr - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


class PSIBase(SFTStageConfig):
    """PSI: SFT on a teacher's evaluation chains (where the chains come from is the member's: ``source``)."""

    steps: int = Field(600, ge=0, description="SFT steps; 0: no training, the stage evaluates (and measures the "
                                              "headroom of) the model start_from.psi names, e.g. a shipped PSI "
                                              "checkpoint, so the RL stages start from it")


class WorldPSIConfig(PSIBase):
    """PSI on the synthetic world: the world's oracle teacher writes the chains (pgenrm.psi_data)."""

    source: Literal["world"] = Field("world", description="'world': the synthetic world's oracle teacher, on the "
                                                          "world's shards; 'teacher': real data (a teacher engine)")
    history_variants: int = Field(4, ge=1, description="(history, pair) draws per train pair: more distinct "
                                                       "examples from the same users (psi_data.psi_examples)")
    teacher: TeacherRule = Field(
        "votes", description="how the vote chain's teacher picks Type: 'votes' (most votes: the best rule the "
                             "student can read off its prompt) or 'recent_pair' (uniformly among the types agreeing "
                             "with the most recent history pair: a teacher the student's own context can beat)")
    label_filter: bool = Field(True, description="keep only chains that prefer the labelled answer (rejection "
                                                 "sampling). With a stochastic teacher this is itself a policy-"
                                                 "improvement step that can absorb RL's gain before RL starts")


class TeacherPSIConfig(PSIBase):
    """PSI on real data: a teacher engine writes chains for the train pairs of ``shards`` (built by ``pr-rlhf data
    build``), rejection-sampled: a chain is kept only when it prefers the labelled answer (pgenrm.real_data,
    pgenrm.teacher)."""

    source: Literal["teacher"] = "teacher"
    teacher: EngineConfig = Field(description="the teacher engine (openai for a served strong model or `vllm "
                                              "serve`, or a local vllm / hf model); its concurrency is the engine's")
    samples_per_pair: int = Field(4, ge=1, description="chains asked per pair (one request with n samples); the "
                                                       "first that parses and prefers the labelled answer is kept")
    teacher_temperature: float = Field(0.8, ge=0)
    teacher_max_tokens: int = Field(768, ge=16)
    cache: str | None = Field(None, description="the teacher's chain cache and the PR judge's grades (JSON lines "
                                                "keyed by engine, prompt, sampling and seed; default <out>/cache/): "
                                                "a rerun or a resumed run never asks for a chain twice")


class GRPOStageConfig(StrictModel):
    """A GRPO stage on the GenRM: prompts are (history, pair) of seen users' train pairs, each sampled
    ``group_size`` times; the reward of a chain is alpha * PR + beta * OR (format errors: ``format_penalty``).
    Which prompts are hard (``hard_kind``) is the data's: see the two members below."""

    steps: int = Field(60, ge=1)
    prompts_per_step: int = Field(16, ge=1)
    group_size: int = Field(4, ge=2)
    temperature: float = Field(1.0, gt=0)
    max_tokens: int = Field(448, ge=16)
    lr: float = Field(2e-4, gt=0)
    advantage: Literal["grpo", "grpo_no_std", "rloo"] = Field(
        "grpo", description="group advantage: 'grpo' divides by the group's std, which blows a small PR "
                            "difference between chains up to a full-size advantage; 'grpo_no_std' (Dr. GRPO) keeps "
                            "advantages in reward units")
    alpha: float = Field(0.5, ge=0, description="weight of the process reward PR (criteria coverage)")
    beta: float = Field(1.0, ge=0, description="weight of the outcome reward OR (prefers the chosen answer)")
    format_penalty: float = Field(-0.1, description="reward of a chain that does not parse")
    kl: KLConfig = Field(default_factory=lambda: KLConfig(coef=0.02, kind="k3", where="loss"),
                         description="KL to the stage's starting model (the SFT model for CRE)")
    hard_share_start: float | None = Field(None, ge=0, le=1, description="curriculum: share of hard-negative "
                                           "prompts at the first step (None: the data's natural mix)")
    hard_share_end: float | None = Field(None, ge=0, le=1, description="curriculum: share at the last step")
    both_orders: bool = Field(False, description="half of each group's chains see the pair in order (A, B), half "
                                                 "in (B, A); one group, one advantage baseline (against slot drift)")
    min_history: int = Field(0, ge=0, description="draw prompts only from examples with at least this many history "
                             "pairs (the pipeline's history_size: prompts shaped like the evaluation's, so what RL "
                             "learns from the pool, e.g. how ties between candidate types break, is what the "
                             "evaluation rewards; psi_data.grpo_pool)")
    refill_rounds: int = Field(0, ge=0, description="dynamic sampling: rounds of fresh prompts drawn to replace "
                                                    "groups whose rewards are all equal (no gradient)")
    stop_kl: float | None = Field(None, gt=0, description="stop the stage when the KL to the starting model per "
                                                          "token exceeds this for `stop_patience` steps")
    stop_parse_rate: float | None = Field(None, ge=0, le=1, description="stop when the parse rate falls below "
                                                                        "this for `stop_patience` steps")
    stop_patience: int = Field(2, ge=1)
    on_stop: Literal["keep_last", "rollback"] = Field(
        "keep_last", description="what a stage stopped by `stop_kl` / `stop_parse_rate` exports: its last weights, "
                                 "or 'rollback': the newest checkpoint whose weights passed both limits on the step "
                                 "after it (the starting model if none did); keeps the checkpoints that span the "
                                 "stop window")
    checkpoint_every: int = Field(20, ge=1)

    @property
    def checkpoints_kept(self) -> int:
        """Checkpoints a stage keeps: the newest (to resume), and with ``rollback`` enough to reach back past the
        ``stop_patience`` steps that tripped a limit and the step that measured the weights before them."""
        if self.on_stop == "keep_last":
            return 1
        return -(-(self.stop_patience + 1) // self.checkpoint_every) + 1

    @model_validator(mode="after")
    def _check(self) -> GRPOStageConfig:
        if (self.hard_share_start is None) != (self.hard_share_end is None):
            raise ValueError("set both hard_share_start and hard_share_end (a curriculum), or neither")
        if self.alpha == 0 and self.beta == 0:
            raise ValueError("alpha and beta are both 0: every chain would get the same reward")
        if self.on_stop == "rollback" and self.stop_kl is None and self.stop_parse_rate is None:
            raise ValueError("on_stop: rollback without stop_kl or stop_parse_rate: nothing would stop the stage")
        if self.both_orders and self.group_size % 2:
            raise ValueError(f"both_orders splits each group in two halves: group_size {self.group_size} is odd")
        return self


class WorldGRPOStageConfig(GRPOStageConfig):
    hard_kind: Literal["one_attribute", "contested"] = Field(
        "one_attribute", description="which prompts are hard: the world's pairs that differ in one attribute, or "
                                     "'contested' ones (the types consistent with the evidence disagree: a persona "
                                     "that fits the history prefers the rejected answer)")


class RealGRPOStageConfig(GRPOStageConfig):
    hard_kind: Literal["label_margin"] = Field(
        "label_margin", description="real data's hard prompts: the smallest rating margins, else the most similar "
                                    "answers (pgenrm.real_data.hard_flags)")


class PlannerStageConfig(SFTStageConfig):
    """SFT of the planner: (query, top-k profile) -> the gold rubric's aspects; aspect precision/recall on held-out
    (val + test) queries, before and after."""

    steps: int = Field(300, ge=1)
    model: str = Field("tiny-genrm", description="the planner's initial model (trained from scratch when tiny)")
    top_k: int = Field(10, ge=1, description="profile posts in the planner's prompt")
    max_tokens: int = Field(96, ge=8)
    eval_queries: int = Field(200, ge=1, description="held-out (val + test) queries scored (seeded sample)")


class PGenRMEvalConfig(StrictModel):
    """Stage evaluations: `pr-rlhf eval` (pairwise, compact SEC prompt, greedy) on held-out pairs of seen users
    (val + test) and of cold-start users (test)."""

    seen_pairs: int | None = Field(None, ge=1, description="seeded sample of the seen users' held-out pairs "
                                                         "(None: all)")
    cold_pairs: int | None = Field(None, ge=1)
    max_tokens: int = Field(448, ge=16)
    n_bootstrap: int = Field(1000, ge=10)
    history_pairs: int = Field(3, ge=1)
    engine: Literal["hf", "rollout"] = Field(
        "hf", description="'hf': transformers on one CPU (cheapest for tiny models: no engine start-up); "
                          "'rollout': the rollout engine's settings (e.g. vLLM with its dtype, device and tensor "
                          "parallelism) with the stage's model, in a Ray task holding rollout_num_gpus GPUs")


class HeadroomConfig(StrictModel):
    """The headroom check before RL (pgenrm.headroom): the offline gate, and on the PSI model greedy / maj@k /
    pass@k, mixed decisions and decision-token entropy."""

    gate: Literal["enforce", "warn", "off"] = Field(
        "warn", description="'enforce': a GRPO stage is refused while the offline gate says no go; 'warn': it "
                            "runs and the report says so")
    prompts: int = Field(200, ge=1, description="held-out seen-user prompts the PSI model is sampled on")
    k: int = Field(8, ge=2, description="samples per prompt (maj@k, pass@k)")
    temperature: float = Field(1.0, gt=0, description="the rollout temperature")
    after_psi: bool = Field(True, description="measure the PSI model as part of the PSI stage")


class PGenRMBase(RolloutLayout):
    """What every P-GenRM run sets, whichever data it trains on (the members below add their data's settings)."""

    INHERITED: ClassVar[tuple[str, ...]] = ("shards", "out")

    shards: str = Field("runs/pgenrm/data", description="the shards trained and evaluated on (the synthetic "
                                                        "world's: built when absent)")
    out: str = "runs/pgenrm"
    model: str = Field("tiny-genrm", description="initial GenRM: a tiny spec (from scratch), 'smollm2', a path")
    stages: list[Stage] = Field(default_factory=lambda: list(MAIN_STAGES),
                                description="stages to run, in order; a finished stage is not run again")
    start_from: dict[Stage, str] = Field(
        default_factory=dict, description="the model a stage starts from instead of its parent stage's output "
                                          "(a model spec or path), e.g. {cre: models/pgenrm_tiny}: the RL stages "
                                          "from an already trained GenRM, without running PSI")
    history_size: int = Field(3, ge=1, description="history pairs in every prompt (training and evaluation)")
    learner: LearnerConfig = Field(default_factory=lambda: LearnerConfig(
        model="tiny-genrm", lr=2e-4, micro_batch_size=16, weight_decay=0.0, betas=(0.9, 0.95),
        num_cpus_per_worker=1.0))
    rollout: EngineConfig = Field(default_factory=lambda: engine_config(backend="hf", model="tiny-genrm"))
    rollout_workers: int = Field(1, ge=1)
    rollout_num_cpus: float = Field(1.0, gt=0)
    rollout_num_gpus: float = Field(0.0, ge=0, description="Ray GPUs per rollout worker (a vLLM rollout on GPU)")
    torch_threads: int = Field(2, ge=1, description="CPU threads of each learner rank, rollout worker and "
                                                    "evaluation (Ray would give a 1-CPU actor one thread)")
    psi: PSIBase
    cre: GRPOStageConfig
    curriculum: GRPOStageConfig
    control: GRPOStageConfig | None = Field(None, description=CONTROL)
    planner: PlannerStageConfig = Field(default_factory=PlannerStageConfig)
    eval: PGenRMEvalConfig = Field(default_factory=PGenRMEvalConfig)

    @model_validator(mode="after")
    def _check(self) -> PGenRMBase:
        if len(set(self.stages)) != len(self.stages):
            raise ValueError(f"stages {self.stages} name a stage twice")
        if "base" in self.start_from:
            raise ValueError("start_from.base: the base stage evaluates `model`; set `model` instead")
        if self.eval.engine == "rollout" and self.rollout.backend == "openai":
            raise ValueError("eval.engine 'rollout' evaluates each stage's model with the rollout engine's settings: "
                             "the rollout backend must be a local one (hf or vllm), not openai")
        self.check_layout()
        if self.psi.steps == 0 and "psi" in self.stages and "psi" not in self.start_from:
            raise ValueError("psi.steps 0 evaluates a given model: set start_from.psi to it (e.g. a shipped PSI "
                             "checkpoint)")
        return self

    def shards_world(self) -> WorldConfig | None:
        """The synthetic world whose shards the run builds when absent (None: the shards are given)."""
        return None

    def eval_engine(self, model_dir: str) -> EngineConfig:
        """The engine that evaluates a stage's model ``model_dir`` (eval.engine)."""
        if self.eval.engine == "rollout":
            return self.rollout.model_copy(update={"model": model_dir})
        return engine_config(backend="hf", model=model_dir, max_model_len=self.rollout.max_model_len)

    def eval_resources(self) -> dict[str, float]:
        """The Ray resources an evaluation task holds: those of a rollout worker when it runs the rollout engine."""
        if self.eval.engine == "rollout":
            return {"num_cpus": self.rollout_num_cpus, "num_gpus": self.rollout_num_gpus}
        return {"num_cpus": 1}

    def stage_config(self, stage: str) -> GRPOStageConfig:
        """The GRPO settings of a GRPO stage (the ablations are CRE without PR or without OR)."""
        if stage == "curriculum":
            return self.curriculum
        if stage == "control":
            return self.control or self.curriculum.model_copy(update={"hard_share_start": None,
                                                                      "hard_share_end": None})
        if stage == "cre_no_pr":
            return self.cre.model_copy(update={"alpha": 0.0})
        if stage == "cre_no_or":
            return self.cre.model_copy(update={"beta": 0.0})
        return self.cre


class WorldPGenRMConfig(PGenRMBase):
    """P-GenRM on the synthetic world (``psi.source: world``, the default): the world's oracle teacher writes PSI's
    chains, the PR is exact (the user's true weights), and the headroom check runs before RL."""

    INHERITED: ClassVar[tuple[str, ...]] = ("world", "shards", "out")

    world: WorldConfig = Field(default_factory=lambda: WorldConfig(rendering="compact"),
                               description="the synthetic world trained and evaluated on (default: the recipe's "
                                           "world when it sets one, else this compact one)")
    chain_style: Literal["compact", "trace", "vote"] = Field(
        "trace", description="the oracle chains: 'vote' (the trace chain whose persona votes for the user's type: "
                             "per history line the types it agrees with, the votes, the type, whose weights make "
                             "the rubric), 'trace' (history lines and responses transliterated in catalog order, the "
                             "posterior's direction, a Fit line, the rubric over every attribute) or 'compact' "
                             "(evidence lines naming the attributes that differ, a rubric over those)")
    psi: WorldPSIConfig = Field(default_factory=WorldPSIConfig)
    cre: WorldGRPOStageConfig = Field(default_factory=WorldGRPOStageConfig)
    curriculum: WorldGRPOStageConfig = Field(default_factory=lambda: WorldGRPOStageConfig(
        alpha=0.0, hard_share_start=0.33, hard_share_end=0.8))
    control: WorldGRPOStageConfig | None = Field(None, description=CONTROL)
    process_reward: Literal["exact"] = Field("exact", description="PR of the GRPO stages: the synthetic world's "
                                                                  "true weights (cre_reward.process_reward)")
    headroom: HeadroomConfig = Field(default_factory=HeadroomConfig)

    @model_validator(mode="after")
    def _check_world(self) -> WorldPGenRMConfig:
        if self.world.rendering != "compact" and self.model.startswith("tiny"):
            raise ValueError("a tiny GenRM from scratch needs the compact world rendering (world.rendering)")
        return self

    @property
    def pr_judge(self) -> None:
        """No PR judge engine: the world's PR is exact (resource planning asks every P-GenRM config for its
        judge)."""
        return None

    def shards_world(self) -> WorldConfig:
        return self.world


class RealPGenRMConfig(PGenRMBase):
    """P-GenRM on real data (``psi.source: teacher``): shards built by ``pr-rlhf data build`` from a real source, a
    teacher engine's chains for PSI, an LLM-judged PR; no world, so no offline headroom check."""

    psi: TeacherPSIConfig
    cre: RealGRPOStageConfig = Field(default_factory=RealGRPOStageConfig)
    curriculum: RealGRPOStageConfig = Field(default_factory=lambda: RealGRPOStageConfig(
        alpha=0.0, hard_share_start=0.33, hard_share_end=0.8))
    control: RealGRPOStageConfig | None = Field(None, description=CONTROL)
    process_reward: Literal["exact", "judge"] = Field(
        "exact", description="PR of the GRPO stages: 'judge' (an LLM judge grades how well the chain's criteria "
                             "cover the user's gold / stated criteria: prompts/pr_judge.txt). Real data has no "
                             "exact PR: with 'exact' every GRPO stage must run with alpha 0")
    pr_judge: EngineConfig | None = Field(None, description="the PR judge engine (process_reward 'judge'); its "
                                                            "grades are cached beside the teacher's chains")
    pr_judge_max_tokens: int = Field(32, ge=4)
    hard_quantile: float = Field(1 / 3, gt=0, lt=1, description="the share of training pairs with the smallest "
                                                                "label margin that are hard negatives")

    @model_validator(mode="after")
    def _check_process_reward(self) -> RealPGenRMConfig:
        if self.process_reward == "judge" and self.pr_judge is None:
            raise ValueError("process_reward 'judge' needs pr_judge (an engine)")
        if self.process_reward == "exact" and any(
                self.stage_config(s).alpha > 0 for s in self.stages if s in GRPO_STAGES):
            raise ValueError("real data (psi.source teacher) has no exact PR: set process_reward: judge and "
                             "pr_judge, or alpha 0 in every GRPO stage")
        return self


# The member is chosen by the section's psi.source (absent: the synthetic world), the tag recipes have always
# carried; the union's tags (which pydantic puts into error locations) are other names than any field's.
PSI_SOURCES: dict[str, str] = {"world": "world_data", "teacher": "real_data"}   # psi.source -> member tag
PGENRM_MEMBERS: dict[str, type[PGenRMBase]] = {"world_data": WorldPGenRMConfig, "real_data": RealPGenRMConfig}


def _member_tag(value: Any) -> str | None:
    psi = value.get("psi") if isinstance(value, Mapping) else getattr(value, "psi", None)
    if psi is None:
        source: Any = "world"
    else:
        source = psi.get("source", "world") if isinstance(psi, Mapping) else getattr(psi, "source", None)
    return PSI_SOURCES.get(source) if isinstance(source, str) else None


@dataclass(frozen=True, eq=False)
class PSISourceKey(UnionKey):
    """The union's key for code that walks the schema: the member a mapping's ``psi.source`` selects."""

    def member(self, value: Any) -> type[BaseModel] | None:
        tag = _member_tag(value if value is not None else {})
        return self.members.get(tag) if tag else None


PGenRMConfig = Annotated[
    Union[tuple(Annotated[cls, Tag(tag)] for tag, cls in PGENRM_MEMBERS.items())],   # type: ignore[misc]
    Discriminator(_member_tag, custom_error_type="invalid_psi_source",
                  custom_error_message="unknown P-GenRM data source psi.source: expected 'world' (the synthetic "
                                       "world) or 'teacher' (real data)"),
    PSISourceKey("psi.source", "world_data", dict(PGENRM_MEMBERS))]
pgenrm_config: Callable[..., WorldPGenRMConfig | RealPGenRMConfig] = parser(PGenRMConfig)
