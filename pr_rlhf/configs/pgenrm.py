"""Typed configuration of the P-GenRM training pipeline (the ``pgenrm:`` section of a recipe): PSI (SFT on oracle
chains) -> CRE (GRPO with process + outcome rewards) -> hard-negative curriculum (GRPO, outcome only, the share of
hard pairs rising), and the planner's SFT. Pydantic only: ``pr-rlhf check`` validates it without torch or Ray.
"""
from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from pr_rlhf.configs.base import EngineConfig, StrictModel, engine_config
from pr_rlhf.configs.learner import KLConfig, LearnerConfig
from pr_rlhf.configs.world import WorldConfig

Stage = Literal["base", "psi", "cre", "curriculum", "control", "cre_no_pr", "cre_no_or", "planner"]
# Each GenRM stage starts from the model the previous one wrote (base: the initial model, evaluated only). The
# control is the curriculum's compute-matched twin: the same further GRPO steps from CRE at the natural mix.
STAGE_PARENT: dict[str, str | None] = {"base": None, "psi": None, "cre": "psi", "curriculum": "cre",
                                       "control": "cre", "cre_no_pr": "psi", "cre_no_or": "psi", "planner": None}
GRPO_STAGES: tuple[str, ...] = ("cre", "curriculum", "control", "cre_no_pr", "cre_no_or")
MAIN_STAGES: tuple[str, ...] = ("base", "psi", "cre", "curriculum")


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


class PSIConfig(SFTStageConfig):
    """PSI: SFT on the oracle teacher's evaluation chains."""

    steps: int = Field(600, ge=0, description="SFT steps; 0: no training, the stage evaluates (and measures the "
                                              "headroom of) the model start_from.psi names, e.g. a shipped PSI "
                                              "checkpoint, so the RL stages start from it")

    source: Literal["world", "teacher"] = Field(
        "world", description="where the chains come from: 'world' (the synthetic world's oracle teacher, on the "
                             "world's shards) or 'teacher' (real data: a teacher engine writes chains for the train "
                             "pairs of `shards`, built by `pr-rlhf data build`; pgenrm.real_data)")
    history_variants: int = Field(4, ge=1, description="(history, pair) draws per train pair: more distinct "
                                                       "examples from the same users (psi_data.psi_examples)")
    teacher: Literal["votes", "recent_pair"] | EngineConfig = Field(
        "votes", description="source 'world': how the vote chain's teacher picks Type: 'votes' (most votes: the "
                             "best rule the student can read off its prompt) or 'recent_pair' (uniformly among the "
                             "types agreeing with the most recent history pair: a teacher the student's own context "
                             "can beat). Source 'teacher': the teacher engine (openai for a served strong model or "
                             "`vllm serve`, or a local vllm / hf model); its concurrency is the engine's")
    samples_per_pair: int = Field(4, ge=1, description="source 'teacher': chains asked per pair (one request with "
                                                       "n samples); the first that parses and prefers the labelled "
                                                       "answer is kept")
    teacher_temperature: float = Field(0.8, ge=0)
    teacher_max_tokens: int = Field(768, ge=16)
    cache: str | None = Field(None, description="source 'teacher': the chain cache (JSON lines keyed by teacher, "
                                                "prompt, sampling and seed; default <out>/cache/teacher.jsonl): a "
                                                "rerun or a resumed run never asks for a chain twice")
    label_filter: bool = Field(True, description="keep only chains that prefer the labelled answer (rejection "
                                                 "sampling). With a stochastic teacher this is itself a policy-"
                                                 "improvement step that can absorb RL's gain before RL starts")

    @model_validator(mode="after")
    def _check_teacher(self) -> PSIConfig:
        if self.source == "teacher" and isinstance(self.teacher, str):
            raise ValueError(f"psi.source 'teacher' needs psi.teacher to be an engine (e.g. {{backend: openai, "
                             f"base_url: ..., model: ...}}), not the world's rule {self.teacher!r}")
        if self.source == "world" and not isinstance(self.teacher, str):
            raise ValueError("psi.teacher is an engine but psi.source is 'world': set psi.source: teacher (real "
                             "data), or a world rule ('votes' | 'recent_pair')")
        if self.source == "teacher" and not self.label_filter:
            raise ValueError("psi.source 'teacher' keeps a chain only when it prefers the labelled answer "
                             "(rejection sampling): label_filter false is a world-teacher setting")
        return self


class GRPOStageConfig(StrictModel):
    """A GRPO stage on the GenRM: prompts are (history, pair) of seen users' train pairs, each sampled
    ``group_size`` times; the reward of a chain is alpha * PR + beta * OR (format errors: ``format_penalty``)."""

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
    hard_kind: Literal["one_attribute", "contested", "label_margin"] = Field(
        "one_attribute", description="which prompts are hard: the world's pairs that differ in one attribute, "
                                     "'contested' ones (the types consistent with the evidence disagree: a persona "
                                     "that fits the history prefers the rejected answer), or on real data "
                                     "'label_margin' (the smallest rating margins, else the most similar answers: "
                                     "pgenrm.real_data.hard_flags)")
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


class PGenRMConfig(StrictModel):
    INHERITED: ClassVar[tuple[str, ...]] = ("world", "shards", "out")

    world: WorldConfig = Field(default_factory=lambda: WorldConfig(rendering="compact"),
                               description="the synthetic world trained and evaluated on (default: the recipe's "
                                           "world when it sets one, else this compact one)")
    shards: str = Field("runs/pgenrm/data", description="the world's shards (built when absent)")
    out: str = "runs/pgenrm"
    model: str = Field("tiny-genrm", description="initial GenRM: a tiny spec (from scratch), 'smollm2', a path")
    stages: list[Stage] = Field(default_factory=lambda: list(MAIN_STAGES),
                                description="stages to run, in order; a finished stage is not run again")
    start_from: dict[Stage, str] = Field(
        default_factory=dict, description="the model a stage starts from instead of its parent stage's output "
                                          "(a model spec or path), e.g. {cre: models/pgenrm_tiny}: the RL stages "
                                          "from an already trained GenRM, without running PSI")
    history_size: int = Field(3, ge=1, description="history pairs in every prompt (training and evaluation)")
    chain_style: Literal["compact", "trace", "vote"] = Field(
        "trace", description="the oracle chains: 'vote' (the trace chain whose persona votes for the user's type: "
                             "per history line the types it agrees with, the votes, the type, whose weights make "
                             "the rubric), 'trace' (history lines and responses transliterated in catalog order, the "
                             "posterior's direction, a Fit line, the rubric over every attribute) or 'compact' "
                             "(evidence lines naming the attributes that differ, a rubric over those)")
    learner: LearnerConfig = Field(default_factory=lambda: LearnerConfig(
        model="tiny-genrm", lr=2e-4, micro_batch_size=16, weight_decay=0.0, betas=(0.9, 0.95),
        num_cpus_per_worker=1.0))
    rollout: EngineConfig = Field(default_factory=lambda: engine_config(backend="hf", model="tiny-genrm"))
    rollout_workers: int = Field(1, ge=1)
    rollout_num_cpus: float = Field(1.0, gt=0)
    rollout_num_gpus: float = Field(0.0, ge=0, description="Ray GPUs per rollout worker (a vLLM rollout on GPU)")
    torch_threads: int = Field(2, ge=1, description="CPU threads of each learner rank, rollout worker and "
                                                    "evaluation (Ray would give a 1-CPU actor one thread)")
    psi: PSIConfig = Field(default_factory=PSIConfig)
    cre: GRPOStageConfig = Field(default_factory=GRPOStageConfig)
    curriculum: GRPOStageConfig = Field(default_factory=lambda: GRPOStageConfig(
        alpha=0.0, hard_share_start=0.33, hard_share_end=0.8))
    control: GRPOStageConfig | None = Field(
        None, description="the compute-matched control of the curriculum (default: the curriculum's settings at "
                          "the natural mix)")
    planner: PlannerStageConfig = Field(default_factory=PlannerStageConfig)
    process_reward: Literal["exact", "judge"] = Field(
        "exact", description="PR of the GRPO stages: 'exact' (the synthetic world's true weights) or 'judge' (an "
                             "LLM judge grades how well the chain's criteria cover the user's gold / stated "
                             "criteria: prompts/pr_judge.txt; real data needs it)")
    pr_judge: EngineConfig | None = Field(None, description="the PR judge engine (process_reward 'judge'); its "
                                                            "grades are cached beside the teacher's chains")
    pr_judge_max_tokens: int = Field(32, ge=4)
    hard_quantile: float = Field(1 / 3, gt=0, lt=1, description="real data: the share of training pairs with the "
                                                                "smallest label margin that are hard negatives")
    headroom: HeadroomConfig = Field(default_factory=HeadroomConfig)
    eval: PGenRMEvalConfig = Field(default_factory=PGenRMEvalConfig)

    @model_validator(mode="after")
    def _check(self) -> PGenRMConfig:
        if self.world.rendering != "compact" and self.model.startswith("tiny"):
            raise ValueError("a tiny GenRM from scratch needs the compact world rendering (world.rendering)")
        if len(set(self.stages)) != len(self.stages):
            raise ValueError(f"stages {self.stages} name a stage twice")
        if "base" in self.start_from:
            raise ValueError("start_from.base: the base stage evaluates `model`; set `model` instead")
        if self.process_reward == "judge" and self.pr_judge is None:
            raise ValueError("process_reward 'judge' needs pr_judge (an engine)")
        real = self.psi.source == "teacher"
        if self.process_reward == "judge" and not real:
            raise ValueError("process_reward 'judge' is real data's PR (psi.source teacher); the synthetic world's "
                             "PR is exact")
        if real and self.process_reward == "exact" and any(
                self.stage_config(s).alpha > 0 for s in self.stages if s in GRPO_STAGES):
            raise ValueError("real data (psi.source teacher) has no exact PR: set process_reward: judge and "
                             "pr_judge, or alpha 0 in every GRPO stage")
        for stage in (s for s in self.stages if s in GRPO_STAGES):
            kind = self.stage_config(stage).hard_kind
            if real and kind != "label_margin" and self.stage_config(stage).hard_share_start is not None:
                raise ValueError(f"{stage}.hard_kind {kind!r} is a synthetic-world kind: real data's curriculum "
                                 f"uses 'label_margin'")
            if not real and kind == "label_margin":
                raise ValueError(f"{stage}.hard_kind 'label_margin' is for real data (psi.source teacher)")
        if self.eval.engine == "rollout" and self.rollout.backend == "openai":
            raise ValueError("eval.engine 'rollout' evaluates each stage's model with the rollout engine's settings: "
                             "the rollout backend must be a local one (hf or vllm), not openai")
        if self.psi.steps == 0 and "psi" in self.stages and "psi" not in self.start_from:
            raise ValueError("psi.steps 0 evaluates a given model: set start_from.psi to it (e.g. a shipped PSI "
                             "checkpoint)")
        return self

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
