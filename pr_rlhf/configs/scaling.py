"""Typed configuration of test-time user-based scaling (docs/protocols.md section 4): m individual chains per input,
n neighbours found through user prototypes, and their fusion. Pydantic only (``pr-rlhf check`` needs no torch)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from pr_rlhf.configs.base import StrictModel
from pr_rlhf.configs.world import WorldConfig


class RefineConfig(StrictModel):
    """How the prototypes are refined on the member users' histories (:func:`pr_rlhf.scaling.refine.refine`)."""

    INHERITED: ClassVar[tuple[str, ...]] = ("seed",)

    steps: int = Field(200, ge=0, description="optimizer steps (0: the K-means centroids as they are)")
    lr: float = Field(1e-2, gt=0)
    batch_size: int = Field(32, ge=1, description="(user, current item) examples per step")
    centroid_coef: float = Field(1.0, ge=0, description="weight of mean_p ||a_p - c_p||^2: keeps a refined "
                                                        "prototype near its K-means centroid")
    smooth_coef: float = Field(0.1, ge=0, description="weight of mean_t ||s_t - s_{t-1}||^2: temporal smoothness "
                                                      "of a user's summary over its history")
    seed: int = 0
    max_history: int = Field(32, ge=1, description="most recent history items attended to: the prefix summaries "
                                                   "cost O(T^2 D) per example, so long histories are capped")


class PrototypeConfig(StrictModel):
    """How the user prototypes are built: persona texts embedded, K-means, then refined on the users' histories."""

    # the refinement's flat keys next to ``k`` (its spelling before it had a section of its own, which recipes and
    # command lines keep using): key -> field of ``refine``
    FLAT_REFINE_KEYS: ClassVar[Mapping[str, str]] = {"refine_steps": "steps", "refine_lr": "lr",
                                                     "centroid_coef": "centroid_coef", "smooth_coef": "smooth_coef"}

    path: str | None = Field(None, description="prototype artifacts (prototypes.safetensors + .json): loaded when "
                                               "present, built and saved there when absent")
    k: int = Field(8, ge=1, description="prototypes (K-means clusters); `pr-rlhf scaling` reports the explained "
                                        "variance of candidate_ks to choose it")
    candidate_ks: list[int] = Field(default_factory=lambda: [2, 4, 8, 16, 32])
    placement: Literal["persona", "conclusion", "profile"] = Field(
        "persona", description="what places a user among the prototypes: 'persona' (the chain's whole persona "
                               "text), 'conclusion' (only what it concludes: its Type / Prefers lines, not the "
                               "transliterated evidence), 'profile' (the mean embedding of the user's profile "
                               "posts: informative where the history is one pair; `pr-rlhf scaling` only)")
    embedder: str = Field("minilm", description="'minilm' (shipped) or a local encoder folder (e.g. a saved "
                                                "Qwen3-Embedding)")
    refine: RefineConfig = Field(default_factory=RefineConfig, description="refinement (steps 0: the K-means "
                                                                           "centroids as they are)")

    @model_validator(mode="before")
    @classmethod
    def _flat_refine_keys(cls, data: Any) -> Any:
        """``refine_steps`` etc. next to ``k`` are the fields of ``refine``: move them there."""
        if not isinstance(data, Mapping) or not any(key in data for key in cls.FLAT_REFINE_KEYS):
            return data
        data = dict(data)
        refine = data.get("refine")
        refine = dict(refine) if isinstance(refine, Mapping) else {} if refine is None else refine
        if not isinstance(refine, dict):
            raise ValueError("give the refinement either as refine: {...} or as the older flat keys, not both")
        for key, field in cls.FLAT_REFINE_KEYS.items():
            if key in data:
                if field in refine:
                    raise ValueError(f"{key} and refine.{field} are one field, set twice: keep one")
                refine[field] = data.pop(key)
        data["refine"] = refine
        return data


class ScalingConfig(StrictModel):
    """m chains sampled for the input (their per-response scores averaged over valid parses) and the same pair
    scored once with each of n neighbours' histories, fused ``self_weight`` / ``neighbour_weight``.
    (m, n) = (0, 0) is the plain single greedy chain; m = 0 with n > 0 uses the neighbours alone."""

    m: int = Field(0, ge=0, description="individual chains per input (one engine request with n=m)")
    n: int = Field(0, ge=0, description="neighbour users whose histories score the pair (0: no prototypes)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the m chains")
    self_weight: float = Field(0.5, ge=0)
    neighbour_weight: float = Field(0.5, ge=0)
    neighbour_history_pairs: int = Field(3, ge=1, description="history pairs of each neighbour in its prompt")
    certainty_weighting: bool = Field(False, description="scale the neighbours' weight by 1 - c, c in [0, 1] how "
                                                         "much the user's own m chains agree (|2 share - 1|): "
                                                         "neighbours speak where the user's own chains disagree")
    max_tokens: int = Field(320, ge=16)
    prototypes: PrototypeConfig = Field(default_factory=PrototypeConfig)

    @model_validator(mode="after")
    def _check(self) -> ScalingConfig:
        if self.m > 0 and self.n > 0 and self.self_weight + self.neighbour_weight <= 0:
            raise ValueError("self_weight + neighbour_weight must be > 0 to fuse the two means")
        return self

    @property
    def enabled(self) -> bool:
        return self.m > 0 or self.n > 0


DEFAULT_GRID: tuple[tuple[int, int], ...] = ((0, 0), (8, 0), (16, 0), (8, 4), (16, 8), (0, 8), (16, 16))


class ScalingEvalConfig(StrictModel):
    """The ``scaling:`` section of a recipe: `pr-rlhf scaling` evaluates a trained GenRM at every (m, n) of
    ``points`` on held-out pairs of seen users and of cold-start users, from one pass of evidence per pair."""

    INHERITED: ClassVar[tuple[str, ...]] = ("world", "shards", "out")

    model: str = Field("runs/pgenrm/curriculum/model", description="the GenRM (a local model directory)")
    shards: str = Field("runs/pgenrm/data", description="the world's shards (built from ``world`` when absent)")
    world: WorldConfig = Field(default_factory=lambda: WorldConfig(rendering="compact"),
                               description="the synthetic world of the shards (its oracle is the reference); "
                                           "default: the recipe's world when it sets one, else this compact one")
    points: list[tuple[int, int]] = Field(default_factory=lambda: list(DEFAULT_GRID))
    seen_pairs: int | None = Field(300, ge=1, description="seeded sample of the seen users' val + test pairs")
    cold_pairs: int | None = Field(None, ge=1, description="seeded sample of the cold-start users' test pairs")
    seen_history_pairs: int = Field(3, ge=0)
    cold_history_pairs: int = Field(1, ge=0, description="a cold-start user's history in the prompt")
    scaling: ScalingConfig = Field(default_factory=ScalingConfig, description="temperature, fusion weights, "
                                   "prototypes (its m and n are ignored here: the grid sets them)")
    n_bootstrap: int = Field(1000, ge=10)
    torch_threads: int = Field(2, ge=1)
    out: str = "runs/scaling"

    @model_validator(mode="after")
    def _check(self) -> ScalingEvalConfig:
        if not self.points:
            raise ValueError("points is empty: name at least one (m, n)")
        if any(m < 0 or n < 0 for m, n in self.points):
            raise ValueError(f"points {self.points}: m and n must be >= 0")
        return self

    @property
    def largest(self) -> tuple[int, int]:
        return max(m for m, _ in self.points), max(n for _, n in self.points)
