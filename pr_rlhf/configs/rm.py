"""Typed configuration of Bradley-Terry reward-model training (``pr-rlhf train-rm``), the ``rm:`` section of a
recipe.

Pydantic only (no torch, no Ray). One scalar RM is trained per input mode (what it sees about the user: nothing,
the top-k profile posts, the planner's rubric, the user's preference history, or a SynthesizeMe persona induced
from that history) on the seen users' training pairs, on the learner ranks, then evaluated by ``pr-rlhf eval``'s
pointwise cell on held-out pairs (mode 'persona': by the leaderboard, through the ``persona`` reward kind).
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from pr_rlhf.configs.base import EngineConfig, GenerationConfig, StrictModel
from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.configs.pgenrm import SFTStageConfig
from pr_rlhf.configs.reward import PersonaRewardConfig
from pr_rlhf.configs.world import WorldConfig


def _rm_learner() -> LearnerConfig:
    return LearnerConfig(trains="reward_model", weight_decay=0.0, micro_batch_size=8, num_cpus_per_worker=1.0)


class RMEvalConfig(StrictModel):
    split: str = Field("val+test", description="held-out split(s) of the evaluated pairs, joined by '+'")
    users: Literal["all", "seen", "cold_start"] = Field("all", description="whose pairs are evaluated")
    max_pairs: int | None = Field(None, ge=1, description="a seeded sample of at most this many pairs")
    n_bootstrap: int = Field(1000, ge=10)
    batch_size: int = Field(32, ge=1, description="sequences per scoring batch")
    device: Literal["cpu", "cuda"] = Field("cpu", description="where the evaluation scores (a Ray task with one "
                                                              "GPU on 'cuda')")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class RMTrainConfig(SFTStageConfig):
    """Steps, batch size (pairs per step: the global mini-batch), the learning-rate schedule and checkpoints are
    the supervised stage's (the learner's own lr is not used)."""

    INHERITED: ClassVar[tuple[str, ...]] = ("seed", "shards", "out", "world")

    shards: str = Field("runs/rm_bt/data", description="shard directory (`pr-rlhf data build`); built from "
                                                       "`world` when absent")
    out: str = Field("runs/rm_bt", description="one folder per input mode: checkpoints/, model/ (the exported "
                                               "HF folder), eval/")
    world: WorldConfig | None = Field(None, description="the synthetic world to build `shards` from when absent")
    seed: int = 0
    model: str = Field("tiny", description="backbone: 'tiny' (built from a config), 'smollm2', or any local HF "
                                           "decoder directory; a fresh scalar head is put on it")
    input_modes: list[Literal["none", "profile", "plan", "history", "persona"]] = Field(
        default_factory=lambda: ["none", "profile"], description="one RM per mode: w/o profile, w/ the top-k "
                                                                 "retrieved posts, w/ the planner's rubric, w/ the "
                                                                 "user's first top-k other history pairs, w/ the "
                                                                 "user's SynthesizeMe persona")
    top_k_profile: int = Field(10, ge=1, description="posts shown in mode 'profile', history pairs in 'history'")
    max_length: int = Field(1024, ge=16, description="tokens per (user block + question, answer); the user "
                                                     "block is cut first (pr_rlhf.reward.scalar)")
    train_split: str = Field("train", description="pairs of seen users in this split are trained on; cold-start "
                                                  "users never are")
    steps: int = Field(200, ge=1, description="optimizer steps per input mode")
    batch_size: int = Field(32, ge=1, description="pairs per step")
    lr: float = Field(1e-4, gt=0, description="peak learning rate (linear warm-up, then cosine decay)")
    warmup_steps: int = Field(10, ge=0)
    checkpoint_every: int = Field(50, ge=1)
    margin: float = Field(0.0, ge=0, description="m in -log sigmoid(r_chosen - r_rejected - m)")
    keep_checkpoints: int = Field(2, ge=1)
    resume: bool = Field(True, description="continue each mode from its newest complete checkpoint")
    planner: EngineConfig | None = Field(None, description="the planner engine of mode 'plan' (its rubrics are "
                                                           "made once per query and cached in the run folder)")
    planner_max_aspects: int = Field(8, ge=1)
    planner_generation: GenerationConfig = Field(default_factory=GenerationConfig, description="the planner's "
                                                 "sampling, for the training rubrics and the evaluation's alike")
    persona: PersonaRewardConfig | None = Field(
        None, description="mode 'persona': how each seen user's persona is induced from their history pairs (the "
                          "persona reward kind's judge, generation, candidates, validation_pairs, history_pairs; "
                          "the personas are kept in <out>/persona/personas.json and the RM is scored by this kind "
                          "reading them)")
    learner: LearnerConfig = Field(default_factory=_rm_learner)
    eval: RMEvalConfig = Field(default_factory=RMEvalConfig)

    @field_validator("learner", mode="before")
    @classmethod
    def _learner_trains_a_reward_model(cls, v: object) -> object:
        if isinstance(v, dict):   # a recipe's partial learner: it trains the reward model unless it says otherwise
            return {"trains": "reward_model", "weight_decay": 0.0, **v}
        return v

    def history_pairs(self, mode: str) -> int:
        """History pairs an RM in input ``mode`` reads (training and evaluation alike): top_k_profile in mode
        'history', none otherwise."""
        return self.top_k_profile if mode == "history" else 0

    @model_validator(mode="after")
    def _consistent(self) -> RMTrainConfig:
        if self.learner.trains != "reward_model":
            raise ValueError("rm.learner.trains must be 'reward_model' (or left unset)")
        if "plan" in self.input_modes and self.planner is None:
            raise ValueError("input mode 'plan' needs a planner engine (rm.planner)")
        if "persona" in self.input_modes and (self.persona is None or self.persona.scalar_rm is not None):
            raise ValueError("input mode 'persona' needs the persona's induction (rm.persona: a persona reward "
                             "config without scalar_rm: the trained RM becomes its reader)")
        if len(set(self.input_modes)) != len(self.input_modes):
            raise ValueError(f"rm.input_modes lists a mode twice: {self.input_modes}")
        return self
