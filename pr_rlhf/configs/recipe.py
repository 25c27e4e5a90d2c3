"""Typed recipe schema, YAML loading and dotted command-line overrides.

Imports pydantic and yaml only (never torch or Ray), so the CLI answers ``--help`` and rejects a bad recipe fast.
A recipe is YAML; any field can be overridden from the command line as ``a.b.c=value`` (the value is parsed as
YAML, so ``data.top_k=5`` is an int and ``world.rendering=varied`` a string). An override of an engine's
``backend`` or a scorer's ``kind`` that switches member keeps the fields the new member shares with the old one
(:func:`apply_override`).

The root declares ``seed`` and ``world`` once for the whole recipe: a section that leaves them unset inherits the
root's (:mod:`pr_rlhf.configs.inherit`).
"""
from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from pr_rlhf.configs.base import (
    ENGINE_MEMBERS,
    EngineConfig,
    GenerationConfig,
    ScalarRMConfig,
    StrictModel,
    UnionKey,
    engine_config,
    parser,
    tagged_union,
)
from pr_rlhf.configs.bon import BoNConfig
from pr_rlhf.configs.inherit import Declared, fill_children
from pr_rlhf.configs.leaderboard import LeaderboardConfig
from pr_rlhf.configs.pgenrm import PGENRM_MEMBERS, PGenRMConfig
from pr_rlhf.configs.reward import REWARD_MEMBERS, RewardConfig, reward_config
from pr_rlhf.configs.rl import RLConfig, RLSweepConfig
from pr_rlhf.configs.rm import RMTrainConfig
from pr_rlhf.configs.scaling import ScalingEvalConfig
from pr_rlhf.configs.serve import ServeConfig
from pr_rlhf.configs.world import WorldConfig

__all__ = ["DataConfig", "EngineConfig", "EvalConfig", "GenerationConfig", "Recipe", "RecipeError", "RewardConfig",
           "RLConfig", "ScalarRMConfig", "StrictModel", "TrackingConfig", "data_config", "engine_config", "load_recipe",
           "reward_config"]


class RetrievalConfig(StrictModel):
    embedder: str = Field("minilm", description="'minilm' (shipped all-MiniLM-L6-v2), 'bm25', or a local "
                                                "sentence-transformers / HF encoder directory")
    top_k: int = Field(10, ge=1, le=1000, description="profile items kept per query")
    batch_size: int = Field(64, ge=1)
    cache_dir: str | None = Field(None, description="persist embeddings here (keyed by content hash)")


class ShardsConfig(StrictModel):
    max_rows_per_shard: int = Field(20_000, ge=1)
    batch_rows: int = Field(1_000, ge=1)
    compression: Literal["zstd", "lz4"] = "zstd"


class DataBase(StrictModel):
    """What every source's ``pr-rlhf data build`` sets: where the shards go, how invalid records are handled, the
    profile retrieval and the shard sizes."""

    source: str
    out: str = "data/synthetic"
    skip_invalid: bool = Field(False, description="skip, count and report invalid records instead of stopping")
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    shards: ShardsConfig = Field(default_factory=ShardsConfig)


class SyntheticDataConfig(DataBase):
    """The synthetic world, generated from the recipe's ``world:`` (no input, no options)."""

    source: Literal["synthetic"] = "synthetic"


class RecordsBase(DataBase):
    """A source read from records (a local directory or an HF dataset)."""

    input: str | None = Field(None, description="local directory or HF dataset name")
    encoding_errors: Literal["strict", "replace"] = Field(
        "strict", description="bytes that are not UTF-8 text: 'strict' makes the record invalid (named by file, "
                              "record, field and byte offset); 'replace' reads them as U+FFFD and counts the records")
    subsets: list[str] | None = None


class PRBOptions(StrictModel):
    flip_seed: int = Field(0, description="seed of each pair's presentation order (a hash of its id)")


class PRBDataConfig(RecordsBase):
    """Personalized RewardBench (data_pipelines.prb)."""

    source: Literal["prb"] = "prb"
    options: PRBOptions = Field(default_factory=PRBOptions)


class LaMPQAOptions(StrictModel):
    splits: list[str] | None = Field(None, description="train / validation (or val) / test (None: all)")


class LaMPQADataConfig(RecordsBase):
    """LaMP-QA (data_pipelines.lamp_qa)."""

    source: Literal["lamp_qa"] = "lamp_qa"
    options: LaMPQAOptions = Field(default_factory=LaMPQAOptions)


class PersonalRewardBenchOptions(StrictModel):
    variant: str | None = Field(None, description="the variant (e.g. prism) when the folder / file / hub name does "
                                                  "not say it")
    survey: str | None = Field(None, description="PRISM's survey (user_id, self_description, system_string): the "
                                                 "users' stated preferences")
    choice_attributes: str | None = Field(None, description="PRISM's per-conversation attribute ratings")
    cold_start_max_train: int = Field(1, ge=0, description="users with at most this many train pairs are "
                                                           "cold-start")


class PersonalRewardBenchDataConfig(RecordsBase):
    """PersonalRewardBench: Chatbot Arena, PRISM (data_pipelines.personal_rewardbench)."""

    source: Literal["personal_rewardbench"] = "personal_rewardbench"
    options: PersonalRewardBenchOptions = Field(default_factory=PersonalRewardBenchOptions)


class DSPOptions(StrictModel):
    test_share: float = Field(0.4, ge=0, le=1, description="share of queries (all their pairs) in test")
    split_seed: int = 0


class DSPDataConfig(RecordsBase):
    """DSP, Domain-Specific Preference (data_pipelines.dsp)."""

    source: Literal["dsp"] = "dsp"
    options: DSPOptions = Field(default_factory=DSPOptions)


DATA_MEMBERS: dict[str, type[DataBase]] = {
    "synthetic": SyntheticDataConfig, "prb": PRBDataConfig, "lamp_qa": LaMPQADataConfig,
    "personal_rewardbench": PersonalRewardBenchDataConfig, "dsp": DSPDataConfig}
SourceName = Literal["synthetic", "prb", "lamp_qa", "personal_rewardbench", "dsp"]
DataConfig = tagged_union(DATA_MEMBERS, "source", "synthetic", "data")
data_config: Callable[..., DataBase] = parser(DataConfig)

# The union tags pydantic puts into an error's location (reward.genrm.judge): not part of the recipe's own path.
UNION_TAGS: frozenset[str] = (frozenset(ENGINE_MEMBERS) | frozenset(REWARD_MEMBERS) | frozenset(PGENRM_MEMBERS)
                              | frozenset(DATA_MEMBERS))


class EvalConfig(StrictModel):
    INHERITED: ClassVar[tuple[str, ...]] = ("shards", "out")
    shards: str = Field("runs/quickstart/data", description="shard directory built by `pr-rlhf data build`")
    split: str = Field("test", description="split of the evaluated pairs; several joined by '+' (val+test)")
    subsets: list[str] | None = None
    max_pairs: int | None = Field(None, ge=1, description="evaluate a seeded sample of at most this many pairs")
    modes: list[Literal["pointwise", "pairwise"]] = Field(default_factory=lambda: ["pointwise", "pairwise"])
    inputs: list[Literal["none", "profile", "plan", "history"]] = Field(
        default_factory=lambda: ["none", "profile", "plan"], description="what an RM sees about the user: nothing, "
        "the top-k posts, the planner's rubric, the user's first history_pairs train pairs")
    pointwise_model: Literal["scalar", "generative"] = Field("scalar", description="'scalar': sequence-"
        "classification RM; 'generative': the judge engine rates each answer 1-10")
    pairwise_format: Literal["judge", "sec", "sec_compact", "tagged", "json"] = Field(
        "judge", description="'judge': ends with 'Result: A|B'; 'sec': the P-GenRM evaluation chain; "
                             "'sec_compact': the same chain from the compact history-only prompt (the small "
                             "P-GenRM that `pr-rlhf pgenrm` trains); 'tagged': reasoning, then "
                             "<answer>[[A]]</answer> (RM-R1-style judges); 'json': a JSON verdict "
                             "{\"score\": \"Assistant A\"} (R3 / mR3-style judges)")
    users: Literal["all", "seen", "cold_start"] = Field(
        "all", description="evaluate the pairs of all users, of seen users only, or of cold-start users only "
                           "(the profiles table's cold_start flag)")
    history_pairs: int = Field(3, ge=0, description="history triples shown to history-based RMs")
    sec_use_stated_preferences: bool = Field(True, description="show stated preferences to the SEC judge "
                                                               "(P-GenRM's GRPO stage trains without them)")
    planner_max_aspects: int = Field(8, ge=1)
    top_k_profile: int = Field(10, ge=1)
    both_orders: bool = Field(False, description="judge each pair in both slot orders")
    n_bootstrap: int = Field(1000, ge=10)
    out: str = "runs/eval"
    judge: EngineConfig = Field(default_factory=engine_config)
    planner: EngineConfig | None = Field(None, description="defaults to the judge's engine")
    scalar_rm: ScalarRMConfig = Field(default_factory=ScalarRMConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    label: str = Field("base", description="the section's own models' name beside `models`")
    models: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="named models evaluated on the same pairs besides this section's own, "
        "each as the fields of this section it changes (e.g. {modes: [pointwise], inputs: [profile], scalar_rm: "
        "{model: PATH}}); the report compares each of their cells with this section's cell of the same "
        "(mode, inputs), paired over pairs")

    # what picks the evaluated pairs and where results go: a named model shares the section's
    SHARED_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"shards", "split", "subsets", "max_pairs", "users", "n_bootstrap", "out", "label", "models"})

    @model_validator(mode="after")
    def _models_are_valid_sections(self) -> EvalConfig:
        for name in self.models:
            self.model_config_for(name)
        return self

    def model_config_for(self, name: str) -> EvalConfig:
        """The section as named model ``name`` changes it (its run directory ``<out>/models/<name>``)."""
        changes = self.models[name]
        fixed = sorted(set(changes) & self.SHARED_FIELDS)
        if fixed:
            raise ValueError(f"models.{name}: {fixed} pick the evaluated pairs or the output; a named model "
                             "shares the section's")
        base = self.model_dump(exclude={"models", "label"})
        try:
            return EvalConfig.model_validate({**base, **changes, "out": str(Path(self.out) / "models" / name)})
        except ValidationError as exc:
            raise ValueError("; ".join(f"models.{name}.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                       for e in exc.errors())) from None


class TrackingConfig(StrictModel):
    mlflow_uri: str | None = Field(None, description="mlflow tracking URI; default: $MLFLOW_TRACKING_URI, else "
                                                     "sqlite:///<run dir>/mlflow.db (works offline)")
    experiment: str = "pr_rlhf"
    enabled: bool = True


class Recipe(StrictModel):
    """The root of every recipe file. ``seed`` is the seed of every section inside; ``world``, when set, the
    default world of every section and scorer inside (:mod:`pr_rlhf.configs.inherit`)."""

    name: str = "recipe"
    seed: int = Field(0, description="the seed of every section that has one (engines, scorers, learners, the "
                                     "prototype refinement) and sets none")
    data: DataConfig = Field(default_factory=data_config)
    shards: str | None = Field(None, description="when set, the shard folder of every section that reads shards "
                               "(eval, train.data, rm, pgenrm, scaling, bon) and names none; one that names another "
                               "is an error")
    out: str | None = Field(None, description="when set, the output folder of every section that writes one (eval, "
                            "train, rm, pgenrm, scaling, bon) and names none; one that names another is an error")
    world: WorldConfig = Field(default_factory=WorldConfig, description="the synthetic world of `pr-rlhf data "
                               "build`, and (when set) of every section and scorer that names none")
    eval: EvalConfig = Field(default_factory=EvalConfig)
    reward: RewardConfig = Field(default_factory=reward_config, description="the reward pool's scorer")
    train: RLConfig | None = Field(None, description="an RL run (GRPO / PPO): `pr-rlhf train`")
    rl_sweep: RLSweepConfig | None = Field(None, description="the train: run once per reward arm, compared "
                                                             "downstream: `pr-rlhf rl-sweep`")
    rm: RMTrainConfig | None = Field(None, description="Bradley-Terry reward models, one per input mode: "
                                                       "`pr-rlhf train-rm`")
    pgenrm: PGenRMConfig | None = Field(None, description="P-GenRM training stages: `pr-rlhf pgenrm`")
    scaling: ScalingEvalConfig | None = Field(None, description="test-time scaling grid: `pr-rlhf scaling`")
    bon: BoNConfig | None = Field(None, description="Best-of-N sweep: `pr-rlhf bon`")
    serve: ServeConfig | None = Field(None, description="the reward service: `pr-rlhf serve-reward`")
    leaderboard: LeaderboardConfig | None = Field(None, description="personalized reward models on the same "
                                                                    "pairs: `pr-rlhf leaderboard`")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @model_validator(mode="after")
    def _inherit_root_fields(self) -> Recipe:
        declared = {"seed": Declared(self.seed, "seed", strict=True)}   # its default 0 is every section's
        if "world" in self.model_fields_set:
            declared["world"] = Declared(self.world, "world", strict=False)   # a section may run its own
        for name in ("shards", "out"):   # one folder: a section that names another is a mistake
            if getattr(self, name) is not None:
                declared[name] = Declared(getattr(self, name), name, strict=True)
        fill_children(self, declared)
        return self


class RecipeError(ValueError):
    """A recipe that cannot be used; the message names the file and the field."""


M = TypeVar("M", bound=BaseModel)


def apply_override(tree: dict, dotted: str, model: type[BaseModel] = Recipe) -> None:
    """Set ``a.b.c=value`` inside a nested dict (creating levels as needed).

    An override of a tagged union's key (``serve.reward.kind=scalar``, ``train.rollout.backend=vllm``) that picks
    another member than the section holds (by its key, or the union's default) drops the section's fields that the
    old member has and the new one lacks (the old kind's ``judge``); the fields both have (``model``, ``dtype``)
    stay, and so do fields neither has, so that a typo still fails validation. ``model``: the schema of ``tree``."""
    if "=" not in dotted:
        raise RecipeError(f"override {dotted!r} is not of the form key.path=value")
    key, raw = dotted.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise RecipeError(f"override {dotted!r} has an empty key")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise RecipeError(f"override {dotted!r}: {part!r} is not a section")
        node = child
    value = yaml.safe_load(raw) if raw.strip() else ""
    union = _union_key(_schema_at(model, tree, parts[:-1]))
    if union is not None and union.key == parts[-1]:
        _switch_member(node, union, value)
    node[parts[-1]] = value


def _switch_member(section: dict, union: UnionKey, name: Any) -> None:
    """Drop from ``section`` the fields of its current member that member ``name`` lacks (nothing when ``name``
    is no member: validation names the valid ones)."""
    old, new = union.member(section), union.members.get(name) if isinstance(name, str) else None
    if new is None or new is old:
        return
    known = old.model_fields if old is not None else {f for m in union.members.values() for f in m.model_fields}
    for field in [f for f in section if f in known and f not in new.model_fields]:
        del section[field]


def _schema_at(annotation: Any, tree: Any, parts: list[str]) -> Any:
    """The type of the value at ``parts`` below a value of type ``annotation`` (``tree``: that value as the recipe
    has it so far, which picks the members of the tagged unions on the way); None where the schema says nothing
    (``Any``, lists, a union of several mappings)."""
    for part in parts:
        annotation = _mapping_type(annotation, tree)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(part)
            if field is None:
                return None
            annotation = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
        elif get_origin(annotation) in (dict, Mapping):
            annotation = get_args(annotation)[1]
        else:
            return None
        tree = tree.get(part) if isinstance(tree, dict) else None
    return annotation


def _mapping_type(annotation: Any, value: Any) -> Any:
    """What a mapping ``value`` (None: absent) validates as under ``annotation``: a model class, ``dict[...]``, or
    None."""
    if get_origin(annotation) is Annotated:
        union = _union_key(annotation)
        if union is not None:
            return union.member(value)
        return _mapping_type(get_args(annotation)[0], value)
    if get_origin(annotation) in (Union, types.UnionType):
        found = [t for t in (_mapping_type(a, value) for a in get_args(annotation)) if t is not None]
        return found[0] if len(found) == 1 else None
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return annotation if is_model or get_origin(annotation) in (dict, Mapping) else None


def _union_key(annotation: Any) -> UnionKey | None:
    """The :class:`UnionKey` of a tagged union ``annotation`` (or of the one tagged union in an optional one)."""
    if get_origin(annotation) is Annotated:
        return next((m for m in annotation.__metadata__ if isinstance(m, UnionKey)), None)
    if get_origin(annotation) in (Union, types.UnionType):
        keys = [k for k in map(_union_key, get_args(annotation)) if k is not None]
        return keys[0] if len(keys) == 1 else None
    return None


def recipe_path(loc: tuple[int | str, ...], tree: Any) -> str:
    """An error location as the recipe's own dotted path: the union tags pydantic inserts are left out (a part
    is a tag when it names a member and is no key of the recipe at that point: ``bon.reward_models.gold`` keeps
    the name, drops the tag)."""
    parts: list[str] = []
    node = tree
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif part in UNION_TAGS:
            continue
        else:
            node = None
        parts.append(str(part))
    return ".".join(parts) or "<root>"


def format_validation_error(exc: ValidationError, origin: str, tree: Any = None) -> str:
    lines = [f"{origin}: invalid recipe"]
    for err in exc.errors():
        lines.append(f"  field {recipe_path(err['loc'], tree)}: {err['msg']}")
    return "\n".join(lines)


def load_recipe(path: str | Path | None = None, overrides: list[str] | None = None, model: type[M] = Recipe) -> M:
    """Load a YAML recipe (or the defaults when ``path`` is None), apply overrides, validate."""
    tree: dict = {}
    origin = str(path) if path else "<defaults>"
    if path is not None:
        p = Path(path)
        try:
            loaded = yaml.safe_load(p.read_text())
        except FileNotFoundError:
            raise RecipeError(f"{p}: recipe file not found")
        except yaml.YAMLError as exc:
            raise RecipeError(f"{p}: not valid YAML: {exc}")
        if loaded is not None and not isinstance(loaded, dict):
            raise RecipeError(f"{p}: a recipe must be a mapping at the top level, got {type(loaded).__name__}")
        tree = loaded or {}
    for ov in overrides or []:
        apply_override(tree, ov, model)
    try:
        return model.model_validate(tree)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(exc, origin, tree)) from None


def dump_recipe(recipe: BaseModel) -> str:
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
