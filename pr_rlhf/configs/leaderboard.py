"""`pr-rlhf leaderboard`: the field's personalized reward models and this project's own on the same pairs.

Imports pydantic only. The driver is ``workers/leaderboard.py``, the table ``pr_rlhf/leaderboard``.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from pr_rlhf.configs.base import StrictModel
from pr_rlhf.configs.reward import EMBEDDING_KINDS, RewardPoolConfig
from pr_rlhf.configs.rm import RMTrainConfig
from pr_rlhf.configs.world import WorldConfig

REFERENCE_ROWS = ("oracle", "logistic_regression", "no_history")


class EmbeddingTrainConfig(StrictModel):
    """How every embedding method trains (pr_rlhf.embedrm.train.TrainSettings)."""

    steps: int = Field(1000, ge=1)
    batch_size: int = Field(64, ge=1, description="pairs per step (bt_embedding, pal, lore)")
    users_per_step: int = Field(16, ge=1, description="episodes per step (vpl, gpo)")
    lr: float = Field(3e-3, gt=0)
    user_lr: float = Field(3e-2, gt=0, description="pal, lore: the seen users' weights")
    weight_decay: float = Field(1e-4, ge=0)
    kl_weight: float = Field(0.01, ge=0, description="vpl: the KL term's final weight")
    max_context: int = Field(16, ge=1, description="vpl, gpo: the most pairs an episode's context holds")
    max_targets: int = Field(32, ge=1, description="vpl, gpo: the most target pairs an episode scores")


class FewShotConfig(StrictModel):
    """Cold-start users given k of their pairs: every embedding method's accuracy on their test pairs, per k."""

    ks: list[int] = Field(default_factory=lambda: [0, 1, 2, 4, 8], description="pairs given to each cold user")
    cold_start_history: int = Field(8, ge=1, description="train pairs each cold user has in the few-shot worlds "
                                                         "(the largest k needs at least that many)")
    service: list[str] = Field(default_factory=list, description="methods whose curve also runs through the reward "
                                                                 "service: the pairs sent as /feedback, the test "
                                                                 "pairs scored through /score")
    service_worlds: list[int] = Field(default_factory=list, description="the worlds of the service's curve")
    clients: int = Field(16, ge=1, description="concurrent clients of the service's curve")

    @model_validator(mode="after")
    def _ks_fit(self) -> FewShotConfig:
        if not self.ks or min(self.ks) < 0 or max(self.ks) > self.cold_start_history:
            raise ValueError(f"few_shot.ks {self.ks}: each between 0 and cold_start_history "
                             f"({self.cold_start_history})")
        return self


class ShardDatasetConfig(StrictModel):
    """Real pairs from a shard folder (`pr-rlhf data build`), beside the worlds."""

    shards: str = Field(..., description="the shard folder")
    history_pairs: int = Field(8, ge=0, description="each user's first history pairs an evaluated pair is given "
                                                    "(VPL and GPO read them; PAL and LoRe know a seen user)")
    cluster: Literal["user", "query"] = Field("user", description="the bootstrap's unit: the user, or the query "
                                                                   "(a set of a few users)")
    licence: str = Field("", description="the data's licence, written beside the results")


class ModelRow(StrictModel):
    """Another reward model scored on the same pairs (and on the few-shot sets, reading each cold user's k pairs as
    history)."""

    reward: dict[str, Any] = Field(..., description="its reward config (any kind: a judge, a scalar RM folder, a "
                                                    "persona); '{world}' in a string is the scored world's seed "
                                                    "(a model trained per world: runs/rm/w{world}/model)")
    label: str = Field("", description="its name in the tables and plots (default: the row's key)")
    worlds: list[int] | None = Field(None, description="the worlds it is scored on (None: every world); a model "
                                                       "trained on one world belongs to that world alone")
    datasets: bool = Field(False, description="also score it on the real pair sets")
    seen_history: int | None = Field(None, ge=0, description="the first history pairs a seen user's evaluated pair "
                                                             "gives it (None: all; a GenRM trained on 3-pair "
                                                             "histories reads 3)")
    users_per_group: int | None = Field(None, ge=1, description="score only the first N users (by id) of each "
                                        "group, seen and cold-start, every pair of theirs: a slow model on a sample "
                                        "of users (its row and its paired differences then cover their pairs; "
                                        "None: every user)")
    pairs_per_user: int | None = Field(None, ge=1, description="score only each user's first N pairs (in the "
                                       "set's order; after users_per_group): a slow model on a set of a few users "
                                       "with many pairs each (None: every pair)")
    few_shot: bool = Field(True, description="also score it on the few-shot sets (a row that reads no history is "
                                             "flat there by construction)")

    @model_validator(mode="after")
    def _per_world_models_stay_on_worlds(self) -> ModelRow:
        if self.datasets and "{world}" in repr(self.reward):
            raise ValueError("a reward naming '{world}' (a model per world) cannot be scored on the real pair sets "
                             "(datasets: true)")
        return self


class LeaderboardConfig(StrictModel):
    INHERITED: ClassVar[tuple[str, ...]] = ("seed", "out")

    seed: int = 0
    worlds: list[int] = Field(default_factory=lambda: [2, 3, 4, 5], description="the reported worlds' seeds")
    development_worlds: list[int] = Field(default_factory=lambda: [0], description="worlds the settings were "
                                                                                     "chosen on: reported apart")
    world: WorldConfig = Field(default_factory=WorldConfig, description="every world's settings; its seed is "
                                                                        "replaced by each world's")
    methods: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: {m: {} for m in EMBEDDING_KINDS},
        description="embedding methods to train and evaluate (kind -> its own settings, e.g. pal: {prototypes: "
                    "3, variant: points})")
    train: EmbeddingTrainConfig = Field(default_factory=EmbeddingTrainConfig)
    embedder: str = Field("minilm", description="the frozen text encoder of every embedding method")
    datasets: dict[str, ShardDatasetConfig] = Field(default_factory=dict, description="real pair sets evaluated "
                                                    "beside the worlds, each in a table of its own")
    models: dict[str, ModelRow] = Field(
        default_factory=dict, description="other reward models scored on the same pairs: name -> its reward config "
        "and where; each response scored apart (a GenRM comparing with a reference: both orders)")
    reuse: dict[str, str] = Field(
        default_factory=dict, description="arms whose per-pair outcomes are read, not recomputed: name -> "
        "'<file with {world}>:<arm>' of a WorldOutcomes file (e.g. P-GenRM's committed study: "
        "docs/results/pgenrm_worlds/w{world}/outcomes.json:curriculum); a world without the file has no such arm")
    references: list[str] = Field(default_factory=lambda: list(REFERENCE_ROWS),
                                  description="the world's reference predictors as rows (3 history pairs, and "
                                              "for seen users every train pair)")
    baseline: str = Field("bt_embedding", description="every method's paired difference is taken against it")
    against: str | None = Field(None, description="a second row every method is compared with (P-GenRM's)")
    few_shot: FewShotConfig | None = Field(None, description="the few-shot curve of cold-start users")
    bt_rm: RMTrainConfig | None = Field(
        None, description="fine-tuned Bradley-Terry RMs, trained per world and per real pair set on its training "
        "pairs by `pr-rlhf train-rm`'s trainer (its shards, out and world are the leaderboard's, per world or set), "
        "one row per input mode (bt_none, bt_history: what the leaderboard's pairs carry about a user); bt_history "
        "also on the few-shot sets")
    pool: RewardPoolConfig = Field(default_factory=RewardPoolConfig, description="the reward workers that score")
    n_bootstrap: int = Field(2000, ge=10)
    out: str = "runs/leaderboard"

    def bt_rows(self) -> list[str]:
        """The rows of the fine-tuned BT RMs, one per input mode."""
        return [f"bt_{mode}" for mode in self.bt_rm.input_modes] if self.bt_rm is not None else []

    @model_validator(mode="after")
    def _known_names(self) -> LeaderboardConfig:
        unknown = sorted(set(self.methods) - set(EMBEDDING_KINDS))
        if unknown:
            raise ValueError(f"methods: {unknown} are not embedding methods ({', '.join(EMBEDDING_KINDS)})")
        unknown = sorted(set(self.references) - set(REFERENCE_ROWS))
        if unknown:
            raise ValueError(f"references: {unknown}; known: {', '.join(REFERENCE_ROWS)}")
        for name, spec in self.reuse.items():
            if ":" not in spec or "{world}" not in spec.split(":", 1)[0]:
                raise ValueError(f"reuse.{name}: {spec!r} is not '<file with {{world}}>:<arm>'")
        from pr_rlhf.configs.reward import reward_config

        for name, row in self.models.items():
            try:
                reward_config(**row.reward)
            except ValueError as exc:
                raise ValueError(f"models.{name}.reward: {exc}") from None
        if self.bt_rm is not None and set(self.bt_rm.input_modes) - {"none", "history", "profile", "persona"}:
            raise ValueError(f"bt_rm.input_modes {self.bt_rm.input_modes}: the leaderboard's pairs carry the user's "
                             "history and retrieved posts, not plans (modes none, history, profile, persona)")
        clash = sorted(set(self.models) & (set(self.methods) | set(self.reuse) | set(self.bt_rows())))
        if clash:
            raise ValueError(f"models: {clash} name rows the methods, reuse or bt_rm already have")
        rows = {*self.methods, *self.reuse, *self.models, *self.bt_rows()}
        for field in ("baseline", "against"):
            value = getattr(self, field)
            if value is not None and value not in rows:
                raise ValueError(f"{field} {value!r} is neither a method nor a reused arm")
        if self.few_shot is not None:
            unknown = sorted(set(self.few_shot.service) - set(self.methods))
            if unknown:
                raise ValueError(f"few_shot.service: {unknown} are not among the methods")
            unknown = sorted(set(self.few_shot.service_worlds) - set(self.worlds) - set(self.development_worlds))
            if unknown:
                raise ValueError(f"few_shot.service_worlds: {unknown} are not among the worlds")
        if set(self.worlds) & set(self.development_worlds):
            raise ValueError("a development world cannot also be a reported world")
        return self
