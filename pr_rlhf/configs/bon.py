"""Typed configuration of a Best-of-N sweep (the ``bon:`` section of a recipe). Pydantic only."""
from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from pr_rlhf.configs.base import EngineConfig, StrictModel, check_benchmark_accuracy, engine_config
from pr_rlhf.configs.inherit import Declared, fill_children
from pr_rlhf.configs.reward import RewardConfig, reward_config
from pr_rlhf.configs.world import WorldConfig


class BoNConfig(StrictModel):
    """N samples per prompt generated once by the policy on rollout workers, every sample scored once by each
    reward model and by the downstream judge; best-of-k for every k from that one pool.

    The reward models and the downstream judge that read the synthetic world (gold, world_estimate, a GenRM's
    world_compact view) inherit the sweep's ``world`` (:mod:`pr_rlhf.configs.inherit`)."""

    INHERITED: ClassVar[tuple[str, ...]] = ("world", "shards", "out")
    DECLARES: ClassVar[Mapping[str, bool]] = {"world": True}

    policy: EngineConfig = Field(default_factory=lambda: engine_config(backend="hf", model="smollm2"))
    shards: str = Field("runs/bon/data", description="shards of the prompts (built from ``world`` when absent)")
    world: WorldConfig | None = Field(None, description="a synthetic world to build the shards from (default: the "
                                                        "recipe's world when it sets one)")
    prompts_from: Literal["cold_start", "test"] = Field("cold_start", description="held-out queries: those of "
                                                                                  "cold-start users, or the test split")
    prompts: int = Field(16, ge=1, description="prompts in the sweep (a seeded sample)")
    profile_top_k: int = Field(10, ge=0, description="retrieved profile posts in the policy prompt")
    history_pairs: int = Field(3, ge=0, description="the user's first train pairs shown to reward models that "
                                                    "read a history (the P-GenRM's evidence)")
    n: int = Field(32, ge=1, description="samples per prompt (the pool); k runs over 1, 2, 4, ... up to n")
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(0.9, gt=0, le=1)
    max_tokens: int = Field(100, ge=1)
    prompts_per_call: int = Field(4, ge=1, description="prompts per rollout call (each with n samples); a finished "
                                                       "call is written to the pool before the next starts")
    rollout_workers: int = Field(1, ge=1)
    rollout_num_cpus: float = Field(1.0, gt=0)
    rollout_num_gpus: float = Field(0.0, ge=0)
    reward_models: dict[str, RewardConfig] = Field(
        default_factory=lambda: {"gold": reward_config(kind="gold")},
        description="name -> reward model whose argmax picks the best of k")
    benchmark_accuracy: dict[str, float | str] = Field(
        default_factory=dict, description="name -> the RM's benchmark accuracy for the validity report: a number "
                                          "in [0, 1], or 'path/result.json:group' (a `pr-rlhf eval` / P-GenRM stage "
                                          "result and its group, e.g. seen); world_estimate and gold RMs get theirs "
                                          "from the world when not given")
    downstream: RewardConfig = Field(default_factory=lambda: reward_config(kind="gold", normalize=True),
                                     description="the downstream judge: the synthetic world's gold utility, or a "
                                                 "rubric judge through any engine")
    ks: list[int] | None = Field(None, description="default: 1, 2, 4, ... up to n")
    n_bootstrap: int = Field(1000, ge=10)
    out: str = "runs/bon"

    @model_validator(mode="after")
    def _inherit_world(self) -> BoNConfig:
        if self.world is not None:
            fill_children(self, {"world": Declared(self.world, "world", strict=self.DECLARES["world"])})
        return self

    @model_validator(mode="after")
    def _check(self) -> BoNConfig:
        if not self.reward_models:
            raise ValueError("reward_models is empty: name at least one reward model")
        if self.ks is not None and (min(self.ks) < 1 or max(self.ks) > self.n):
            raise ValueError(f"ks {self.ks} must lie in 1..n={self.n}")
        check_benchmark_accuracy(self.benchmark_accuracy, self.reward_models, "reward_models")
        return self
