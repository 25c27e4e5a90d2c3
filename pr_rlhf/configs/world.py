"""Configuration of the synthetic persona world (pydantic only: imports without numpy or torch).

The default world's measured reference accuracies: docs/measurements.md.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Mirrors the catalog in attributes.py (kept here as names so that the config imports without numpy).
CATALOG_ORDER: tuple[str, ...] = (
    "structure", "examples", "enthusiasm", "second_person", "hedging", "detail",
    "summary", "casual", "question", "length",
)
# Attributes a single compact token cannot realize (a word-count threshold needs many words).
NOT_COMPACT: frozenset[str] = frozenset({"length"})


class WorldConfig(BaseModel):
    """Every knob of the synthetic persona world. Same config (and seed) -> identical world.

    Defaults: 6 attributes, 6 archetypes, 200 seen users (8 history + 2 val + 4 test pairs each), 40 cold-start
    users (1 history + 4 test pairs each), 3,000 pairs in all.
    Its measured reference accuracies: docs/measurements.md.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, ge=0, description="Seed of every random draw in the world (numpy Generator streams).")
    attributes: tuple[str, ...] | None = Field(
        None, description="Attribute names from the catalog, in this order; None takes the first "
                          "`n_attributes` of the catalog order.")
    n_attributes: int = Field(6, ge=1, le=len(CATALOG_ORDER),
                              description="How many catalog attributes to use when `attributes` is None.")
    n_archetypes: int = Field(6, ge=1, description="Number of user archetypes (the prototypes users are drawn from).")
    archetype_scale: float = Field(
        1.0, gt=0, description="Std of archetype weight entries. Archetypes are N(0, scale^2) draws, centred "
                               "across archetypes (so the population has no consensus: the no-history "
                               "reference stays near chance) and rescaled back to this std.")
    shared_preference: float = Field(
        0.0, ge=0, description="Std of one population-wide weight vector added to every archetype after centring: "
                               "what most users agree on (0 = no consensus). RL worlds set it so that a policy "
                               "can also improve for users it knows nothing about.")
    users: int = Field(200, ge=1, description="Number of seen users (history + val + test pairs).")
    cold_start_users: int = Field(40, ge=0, description="Number of cold-start users (`cold_start_history` history "
                                                        "pairs + test pairs).")
    history_size: int = Field(
        8, ge=1, description="Train (history) pairs per seen user. 8 lets later code subsample histories of "
                             "1..8; the reference accuracies use the first `h` (default 3).")
    val_pairs_per_user: int = Field(2, ge=0, description="Val pairs per seen user.")
    test_pairs_per_user: int = Field(4, ge=0, description="Test pairs per seen user.")
    cold_start_test_pairs: int = Field(4, ge=1, description="Test pairs per cold-start user.")
    cold_start_history: int = Field(1, ge=1, description="Train (history) pairs per cold-start user: 1 in every "
                                                         "world so far; more for a few-shot curve (seen users' "
                                                         "pairs do not change with it).")
    user_noise: float = Field(0.2, ge=0, description="Std of a user's weights around their archetype's.")
    utility_noise: float = Field(0.15, ge=0, description="Std of the per-response noise in utility = w.x + noise.")
    min_differing_attributes: int = Field(
        2, ge=1, description="Standard pairs differ in min..max attributes (uniform). Hard pairs differ in "
                             "exactly one; with the default hard share 1/3 the pairs differ in 1, 2 or 3 "
                             "attributes equally often. Set 1 to let standard pairs differ in one, too.")
    max_differing_attributes: int = Field(3, ge=1, description="See `min_differing_attributes`.")
    hard_negative_share: float = Field(
        1 / 3, ge=0, le=1, description="Probability that a pair is a hard negative (differs in exactly one "
                                       "attribute; `hardness='hard'`).")
    rendering: Literal["compact", "varied"] = Field(
        "varied", description="'compact': one cue token per attribute value (fast CPU learning by tiny "
                              "models); 'varied': natural sentences about the query topic with variation.")
    profile_posts_min: int = Field(10, ge=1, description="Fewest profile posts per user.")
    profile_posts_max: int = Field(30, ge=1, description="Most profile posts per user.")
    reveal_share: float = Field(
        0.35, ge=0, le=1, description="Share of profile posts that reveal a preference; which attribute a "
                                      "revealing post is about is drawn proportionally to |weight|.")
    rubric_aspects: int = Field(3, ge=1, description="Gold rubric aspects per query: the user's strongest "
                                                     "attributes (by |weight|) with their direction.")
    reference_samples: int = Field(6000, ge=10, description="Monte Carlo prior samples S for the oracle.")

    @model_validator(mode="after")
    def _check(self) -> WorldConfig:
        names = self.attribute_names
        unknown = [n for n in names if n not in CATALOG_ORDER]
        if unknown:
            raise ValueError(f"unknown attributes {unknown}; the catalog has {list(CATALOG_ORDER)}")
        if len(set(names)) != len(names):
            raise ValueError(f"attributes repeat a name: {list(names)}")
        if self.rendering == "compact":
            bad = [n for n in names if n in NOT_COMPACT]
            if bad:
                raise ValueError(f"rendering='compact' cannot realize {bad} (needs rendering='varied')")
            if "structure" in names and len(names) < 2:
                raise ValueError("rendering='compact' lays structure out as one line per attribute token, "
                                 "so it needs at least 2 attributes")
        if self.min_differing_attributes > self.max_differing_attributes:
            raise ValueError("min_differing_attributes > max_differing_attributes")
        if self.max_differing_attributes > len(names):
            raise ValueError(f"max_differing_attributes={self.max_differing_attributes} exceeds the "
                             f"{len(names)} attributes")
        if self.profile_posts_min > self.profile_posts_max:
            raise ValueError("profile_posts_min > profile_posts_max")
        return self

    @property
    def attribute_names(self) -> tuple[str, ...]:
        return tuple(self.attributes) if self.attributes is not None else CATALOG_ORDER[: self.n_attributes]
