"""Typed configuration of an RL run (GRPO or PPO with personalized rewards), the ``train:`` section of a recipe.

Pydantic only (no torch, no Ray): ``pr-rlhf check`` validates a recipe before any worker starts.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from pr_rlhf.configs.base import EngineConfig, StrictModel, check_benchmark_accuracy, engine_config
from pr_rlhf.configs.learner import LearnerConfig, RolloutLayout
from pr_rlhf.configs.reward import RewardConfig
from pr_rlhf.configs.world import WorldConfig


class RLDataConfig(StrictModel):
    INHERITED: ClassVar[tuple[str, ...]] = ("world", "shards")

    shards: str = Field("runs/quickstart/data", description="shard directory (`pr-rlhf data build`)")
    train_split: str = Field("train", description="queries of seen users in this split are training prompts")
    heldout: Literal["cold_start", "test"] = Field(
        "cold_start", description="held-out prompts: queries of cold-start users (never trained on), or the "
                                  "test split when the shards have no cold-start users")
    heldout_prompts: int = Field(32, ge=1, description="held-out prompts scored at each evaluation")
    profile_top_k: int = Field(0, ge=0, description="retrieved profile posts shown in the policy prompt")
    world: WorldConfig | None = Field(
        None, description="a synthetic world to build the shards from when `shards` does not exist yet (`pr-rlhf "
                          "train` builds it; shards of another world there are an error); default: the recipe's "
                          "world when it sets one")
    plan: Literal["none", "rubrics"] = Field(
        "none", description="aspects shown in the policy prompt: none, or the shards' rubric of each query (the "
                            "synthetic world's gold rubric; PRB / LaMP-QA rubrics on real data)")
    plan_max_aspects: int | None = Field(
        None, ge=1, description="show only the first k aspects of each rubric (most important first), so that what "
                                "the policy is not told is left for the reward to teach; None: all")
    history_pairs: int = Field(
        0, ge=0, description="the user's first k train pairs sent with every reward request, for reward models "
                             "that read a history (the P-GenRM's evaluation chain); the policy never sees them")


class RLConfig(RolloutLayout):
    INHERITED: ClassVar[tuple[str, ...]] = ("out",)
    algorithm: Literal["grpo", "ppo"] = "grpo"
    advantage: str | None = Field(None, description="name in pr_rlhf.algos.ADVANTAGE_ESTIMATORS; default: "
                                                    "'grpo' for GRPO, 'gae' for PPO")
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1)
    steps: int = Field(20, ge=1)
    prompts_per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=1, description="samples per prompt (GRPO's group); PPO commonly uses 1")
    max_tokens: int = Field(32, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    warm_start_cache: str | None = Field(
        None, description="a folder for the learner's state right after the warm start, keyed by the run's "
                          "settings: a run with the same settings loads it instead of training the warm start "
                          "again (`pr-rlhf rl-sweep` sets <rl_sweep.out>/warm_start, so arms that differ only in "
                          "their reward share one)")
    reward_failures: Literal["raise", "neutral"] = Field(
        "raise", description="a sample the reward model could not score (e.g. a GenRM chain that does not parse): "
                             "'raise' stops the step with the error; 'neutral' gives it the mean reward of its "
                             "prompt's scored samples (advantage 0 under GRPO; counted as reward/failed)")
    warmup_sft_steps: int = Field(0, ge=0, description="supervised warm start before RL: steps of next-token "
                                                       "training on the shards' answers (chosen and rejected "
                                                       "alike, so the policy learns the answer space, not the "
                                                       "preferences); a random-init policy needs it")
    warmup_sft_target: Literal["answers", "rubric"] = Field(
        "answers", description="what the warm start imitates: 'answers', both answers of each training pair (the "
                               "answer space only); 'rubric' (compact synthetic world, data.plan='rubrics'), an "
                               "answer that does what each shown aspect asks and draws the other attributes at "
                               "random: instruction following, which a pretrained policy brings and a random-init "
                               "one lacks, without any preference label")
    warmup_sft_batch: int = Field(16, ge=1)
    warmup_sft_lr: float | None = Field(None, gt=0, description="learning rate of the warm start (default: the "
                                                                "learner's lr, which RL keeps)")
    eval_every: int = Field(5, ge=1)
    eval_samples: int = Field(4, ge=1, description="samples per held-out prompt at evaluation")
    checkpoint_every: int = Field(5, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    resume: bool = Field(True, description="continue from the newest complete checkpoint in out/checkpoints")
    out: str = "runs/rl"
    rollout: EngineConfig = Field(default_factory=engine_config)
    rollout_workers: int = Field(1, ge=1)
    rollout_num_cpus: float = Field(1.0, gt=0, description="Ray CPUs per rollout worker")
    rollout_num_gpus: float = Field(0.0, ge=0, description="Ray GPUs per rollout worker (1 for a vLLM on GPU)")
    rollout_resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources per "
                                                                                  "rollout worker, e.g. "
                                                                                  "{rollout_host: 1}")
    rollout_mode: Literal["sync", "one_step_off"] = Field(
        "sync", description="'sync': each step generates with the weights it updates (rollout, then update); "
                            "'one_step_off' (split layout): step t+1's samples are generated while the learner "
                            "trains on step t's, so they come from weights one update old; the loss corrects for it "
                            "with the engine's log-probs (decoupled PPO, truncated importance weights: "
                            "docs/guides/rl.md)")
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    data: RLDataConfig = Field(default_factory=RLDataConfig)
    downstream: RewardConfig | None = Field(
        None, description="a second scorer of the held-out evaluations only (e.g. the world's gold utility, "
                          "kind gold): runs trained with different rewards are compared on it, paired over the "
                          "same held-out prompts (`pr-rlhf report compare-rl`); its own reward pool")

    @model_validator(mode="after")
    def _consistent(self) -> RLConfig:
        if self.algorithm == "grpo" and self.group_size < 2:
            raise ValueError("GRPO needs group_size >= 2 (advantages are relative to the group)")
        if self.warmup_sft_target == "rubric" and self.data.plan != "rubrics":
            raise ValueError("warmup_sft_target='rubric' follows the rubric in the prompt: set data.plan='rubrics'")
        if self.rollout_mode == "one_step_off" and (self.temperature != 1.0 or self.top_p != 1.0):
            raise ValueError("rollout_mode one_step_off corrects with the engine's log-probs, which are the model's "
                             "raw distribution (temperature 1, no top-p): set train.temperature=1 and "
                             f"train.top_p=1 (they are {self.temperature} and {self.top_p})")
        self.check_layout(self.rollout_mode)
        if self.algorithm == "ppo" and not self.learner.critic.enabled:
            raise ValueError("PPO needs a critic: set train.learner.critic.enabled=true")
        return self

    @property
    def advantage_estimator(self) -> str:
        return self.advantage or ("grpo" if self.algorithm == "grpo" else "gae")


class RLSweepConfig(StrictModel):
    """The recipe's RL run (``train:``) once per reward arm (``pr-rlhf rl-sweep``): the same policy, prompts,
    steps and seed, only the reward differs; every arm's held-out answers scored by the same downstream judge
    (``train.downstream``), each arm compared with ``baseline`` paired over the held-out prompts, and the arms'
    benchmark accuracies ranked against their downstream values (benchmark validity under RL)."""

    INHERITED: ClassVar[tuple[str, ...]] = ("out",)

    arms: dict[str, RewardConfig] = Field(description="arm name -> the reward its run trains on")
    baseline: str = Field(description="the arm every other is compared with (e.g. the non-personalized reward)")
    benchmark_accuracy: dict[str, float | str] = Field(
        default_factory=dict, description="arm -> its reward's benchmark accuracy: a number in [0, 1] or "
                                          "'path/result.json:group' (e.g. a `pr-rlhf train-rm` evaluation); gold "
                                          "and world_estimate arms get theirs from the world when not given")
    benchmark_users: Literal["seen", "cold_start", "all"] = Field(
        "all", description="whose held-out pairs the world's judges' benchmark accuracy is computed on (match "
                           "the evaluation behind the given accuracies)")
    out: str = Field("runs/rl_sweep", description="one run folder per arm, and the sweep's report")

    @model_validator(mode="after")
    def _check(self) -> RLSweepConfig:
        if self.baseline not in self.arms:
            raise ValueError(f"baseline {self.baseline!r} is not an arm (arms: {sorted(self.arms)})")
        check_benchmark_accuracy(self.benchmark_accuracy, self.arms, "arms")
        return self
