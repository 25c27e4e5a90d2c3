"""Configs as discriminated unions with fields declared once: every shipped recipe resolves to the effective
settings it had before (tests/data/recipe_effective_configs.json, written by tools/dump_recipes.py before the
restructure), the union members hold only their own fields, and the root's seed and world reach the sections."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from pr_rlhf.configs.base import EngineConfig, HFEngineConfig, OpenAIEngineConfig, VLLMEngineConfig, engine_config
from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.configs.pgenrm import PGenRMConfig, TeacherPSIConfig, WorldPSIConfig
from pr_rlhf.configs.recipe import DataConfig, Recipe, RecipeError, dump_recipe, load_recipe
from pr_rlhf.configs.reward import (
    GenRMRewardConfig,
    GoldRewardConfig,
    HTTPRewardConfig,
    RewardConfig,
    reward_config,
)
from pr_rlhf.configs.scaling import PrototypeConfig, RefineConfig

ROOT = Path(__file__).resolve().parents[2]
# recipes/gpu/ppo_personalized.yaml and pgenrm_pipeline.yaml were re-dumped into it when they became colocated (issue
# 52: one engine per learner rank, its share of the rank's GPU and vLLM's memory; a deliberate change of settings)
BASELINE: dict[str, dict] = json.loads((ROOT / "tests" / "data" / "recipe_effective_configs.json").read_text())
RECIPES = {name: (None if name == "<defaults>" else ROOT / name) for name in BASELINE}
# Fields the restructure added, with the value the code used before: the prototype refinement's batch and history
# cap (the refinement's defaults) and its seed (workers passed the recipe's seed).
ADDED_REFINE_FIELDS = {"batch_size": lambda before: 32, "max_history": lambda before: 32,
                       "seed": lambda before: before["seed"]}
# Root fields the restructure added (declared once, inherited by the sections that name none).
ROOT_FOLDERS = {("shards",), ("out",)}
# Fields removed on purpose, each of which no recipe's run read: ZeRO's stage went with the deepspeed strategy.
REMOVED_FIELDS = {(LearnerConfig, "zero_stage")}
# P-GenRM and scaling fields added after the baseline, with the value that keeps a recipe's run as it was (the
# headroom section only reports, and its default gate only warns). The two recipes rebuilt around the beatable teacher
# (pgenrm_pipeline.yaml, pgenrm_from_shipped.yaml) and the scaling grid's new placement (scaling_grid.yaml) and the
# quickstart's brief PSI on a small world (quickstart.yaml) and the GPU P-GenRM recipes' evaluations on the
# rollout engine (gpu/pgenrm_pipeline.yaml, gpu/pgenrm_real.yaml) were
# re-dumped into the baseline when they changed.
ADDED_PGENRM_FIELDS = {"teacher": "votes", "label_filter": True, "hard_kind": "one_attribute", "both_orders": False,
                       "refill_rounds": 0, "min_history": 0, "stop_kl": None, "stop_parse_rate": None,
                       "stop_patience": 2, "on_stop": "keep_last", "control": None, "placement": "persona",
                       "certainty_weighting": False, "layout": "split", "sleep_level": 1,
                       # real data (psi.source teacher): unused by the world's pipeline
                       "source": "world", "samples_per_pair": 4, "teacher_temperature": 0.8,
                       "teacher_max_tokens": 768, "cache": None, "process_reward": "exact", "pr_judge": None,
                       "pr_judge_max_tokens": 32, "hard_quantile": 1 / 3,
                       # the stage evaluations' engine: transformers, as before
                       "engine": "hf"}

# Added after the baseline: the root's Bradley-Terry section (no baseline recipe has one), an RL run's downstream
# scorer (none: the held-out evaluations are scored by the reward alone, as before) and what a learner trains (the
# policy, as every learner did before).
ADDED_ROOT_SECTIONS = {("rm",), ("train", "downstream"), ("rl_sweep",), ("leaderboard",)}
ADDED_TRAIN_FIELDS = {"warmup_sft_target": "answers", "reward_failures": "raise", "warm_start_cache": None,
                      # the sequential step in the split layout, as every run before (issue 52)
                      "rollout_mode": "sync", "layout": "split", "sleep_level": 1}
# Added after the baseline: strict text decoding (issue 40: undecodable bytes make a record invalid, which no
# shipped data holds) and the reward service's user store (off unless a recipe sets it)
ADDED_SECTION_FIELDS = {("data", "encoding_errors"): "strict", ("serve", "users"): None,
                        ("serve", "tenant_tokens_env"): {}}
# what the policy is shown of a rubric and what the reward requests carry: as before (all aspects, no history)
ADDED_TRAIN_DATA_FIELDS = {"plan_max_aspects": None, "history_pairs": 0}
# trains: as before. The weight sync's bucket size and its per-step timeout (issues 38 and 49: the weights an engine
# ends up with are the same, tests/integration/test_weight_sync.py)
ADDED_LEARNER_FIELDS = {"trains": "policy", "weight_sync_bucket_mb": 256,
                        "load_weights_on": "rank0", "weight_sync_timeout_s": 120.0, "is_weight_cap": 2.0}
# The evaluation's named models (none: only the section's own, as before) and the section's name beside them; the
# quickstart recipes, which use them, were re-dumped into the baseline.
ADDED_EVAL_FIELDS = {"models": {}, "label": "base"}
# World fields added after the baseline, with the value every world had before
ADDED_WORLD_FIELDS = {"cold_start_history": 1}
# Scalar RM fields added after the baseline (issue 50), with what the RM did before: one-output heads, no code of
# the checkpoint's own
ADDED_SCALAR_RM_FIELDS = {"label": None, "trust_remote_code": False}
# vLLM engine fields added after the baseline (issue 38). enforce_eager None: eager on CPU, as every engine was
# built before; CUDA graphs on GPU (issue 49, on purpose). weight_transfer auto: gloo on CPU, nccl on GPU, the
# backends the weight sync used before.
# The GenRM's verdict readout, added with the pairwise mode (issue 50): the text it writes, as every GenRM read before
ADDED_GENRM_FIELDS = {"verdict_readout": "text"}
ADDED_VLLM_FIELDS = {"enforce_eager": None, "distributed_executor_backend": None, "weight_transfer": "auto",
                     "enable_sleep_mode": False}


def union_members(union: Any) -> set[type[BaseModel]]:
    """The member classes of an annotated discriminated union (Annotated[Union[Annotated[cls, Tag], ...], ...])."""
    inner = get_args(union)[0]
    return {get_args(member)[0] for member in get_args(inner)}


# Each family: classes of which a section is one, so that a field of another is no field of the selected one (a
# P-GenRM section's psi is its member's: the world's teacher rule or real data's teacher engine)
UNIONS = [union_members(EngineConfig), union_members(RewardConfig), union_members(DataConfig),
          union_members(PGenRMConfig), {WorldPSIConfig, TeacherPSIConfig}]


def leaves(tree: Any, path: tuple = ()) -> dict[tuple, Any]:
    if isinstance(tree, dict) and tree:
        out: dict[tuple, Any] = {}
        for key, value in tree.items():
            out.update(leaves(value, (*path, key)))
        return out
    return {path: tree}


def today_path(recipe: BaseModel, path: tuple) -> tuple | str:
    """Where a baseline leaf lives today: the same path (the refinement's older flat keys moved into
    ``prototypes.refine``), or the reason it is gone: 'other member' when its first missing part is a field of
    a union member other than the selected one (and not of the selected one), 'removed' for REMOVED_FIELDS,
    else 'missing'."""
    node: Any = recipe
    out: list = []
    for i, part in enumerate(path):
        if isinstance(node, PrototypeConfig) and part in PrototypeConfig.FLAT_REFINE_KEYS:
            return (*out, "refine", PrototypeConfig.FLAT_REFINE_KEYS[part], *path[i + 1:])
        if isinstance(node, BaseModel):
            if part in type(node).model_fields:
                node = getattr(node, part)
                out.append(part)
                continue
            if (type(node), part) in REMOVED_FIELDS:
                return "removed"
            family = next((members for members in UNIONS if type(node) in members), set())
            others = {cls for cls in family if cls is not type(node) and part in cls.model_fields}
            return "other member" if others else "missing"
        if isinstance(node, dict) and part in node:
            node = node[part]
            out.append(part)
            continue
        return "missing"
    return tuple(out)


def get(tree: Any, path: tuple) -> Any:
    for part in path:
        tree = tree[part]
    return tree


@pytest.mark.parametrize("name", sorted(BASELINE), ids=lambda n: Path(n).name)
def test_every_recipe_resolves_to_its_effective_settings_before(name):
    recipe = load_recipe(RECIPES[name])
    now = json.loads(json.dumps(recipe.model_dump(mode="json")))
    before = BASELINE[name]
    now_leaves = leaves(now)
    matched: set[tuple] = set()
    for path, value in leaves(before).items():
        where = today_path(recipe, path)
        assert where != "missing", f"{name}: {'.'.join(map(str, path))} is gone (not a field of another member)"
        if where in ("other member", "removed"):
            continue
        assert where in now_leaves, f"{name}: {'.'.join(map(str, path))} -> {'.'.join(map(str, where))} missing"
        assert now_leaves[where] == value, f"{name}: {'.'.join(map(str, where))}: {now_leaves[where]!r} != {value!r}"
        matched.add(where)
    for path in set(now_leaves) - matched:
        if path in ROOT_FOLDERS | ADDED_ROOT_SECTIONS:   # unset in every baseline recipe
            assert now_leaves[path] is None, path
            continue
        if path[-2:] in ADDED_SECTION_FIELDS:
            assert now_leaves[path] == ADDED_SECTION_FIELDS[path[-2:]], f"{name}: {'.'.join(map(str, path))}"
            continue
        if path[:1] == ("train",) and len(path) == 2 and path[-1] in ADDED_TRAIN_FIELDS:
            assert now_leaves[path] == ADDED_TRAIN_FIELDS[path[-1]], f"{name}: {'.'.join(map(str, path))}"
            continue
        if path[:2] == ("train", "data") and len(path) == 3 and path[-1] in ADDED_TRAIN_DATA_FIELDS:
            assert now_leaves[path] == ADDED_TRAIN_DATA_FIELDS[path[-1]], f"{name}: {'.'.join(map(str, path))}"
            continue
        if path[:1] == ("eval",) and len(path) == 2 and path[-1] in ADDED_EVAL_FIELDS:
            assert now_leaves[path] == ADDED_EVAL_FIELDS[path[-1]], f"{name}: {'.'.join(map(str, path))}"
            continue
        if path[-2:-1] == ("learner",) and path[-1] in ADDED_LEARNER_FIELDS:
            assert now_leaves[path] == ADDED_LEARNER_FIELDS[path[-1]], f"{name}: {'.'.join(map(str, path))}"
            continue
        if path[0] in ("pgenrm", "scaling", "reward") and path[-1] in ADDED_PGENRM_FIELDS:
            assert now_leaves[path] == ADDED_PGENRM_FIELDS[path[-1]], f"{name}: {'.'.join(map(str, path))}"
            continue
        if path[-2:-1] == ("scalar_rm",) and path[-1] in ADDED_SCALAR_RM_FIELDS:
            assert now_leaves[path] == ADDED_SCALAR_RM_FIELDS[path[-1]], f"{name}: {'.'.join(map(str, path))}"
            continue
        if path[-1] in ADDED_WORLD_FIELDS:
            assert now_leaves[path] == ADDED_WORLD_FIELDS[path[-1]], f"{name}: {'.'.join(map(str, path))}"
            continue
        if path[-1] in ADDED_GENRM_FIELDS:
            assert now_leaves[path] == ADDED_GENRM_FIELDS[path[-1]], f"{name}: {'.'.join(map(str, path))}"
            continue
        if path[-1] in ADDED_VLLM_FIELDS:
            assert now_leaves[path] == ADDED_VLLM_FIELDS[path[-1]], f"{name}: {'.'.join(map(str, path))}"
            continue
        if path[:2] == ("pgenrm", "headroom"):
            assert path[-1] != "gate" or now_leaves[path] == "warn", f"{name}: the gate would refuse stages"
            continue
        assert len(path) >= 2 and path[-2] == "refine" and path[-1] in ADDED_REFINE_FIELDS, \
            f"{name}: {'.'.join(map(str, path))} is new"
        assert now_leaves[path] == ADDED_REFINE_FIELDS[path[-1]](before), path


def test_members_hold_only_their_own_fields():
    assert set(HFEngineConfig.model_fields) == {"backend", "model", "dtype", "max_model_len", "seed", "device"}
    assert {"gpu_memory_utilization", "tensor_parallel_size", "enable_prefix_caching"} <= set(
        VLLMEngineConfig.model_fields)
    assert not {"device", "gpu_memory_utilization"} & set(OpenAIEngineConfig.model_fields)
    assert set(GoldRewardConfig.model_fields) == {"kind", "seed", "pool", "world", "normalize"}
    assert "judge" not in GoldRewardConfig.model_fields and "scalar_rm" not in GenRMRewardConfig.model_fields


def test_a_missing_key_selects_the_default_member():
    assert isinstance(engine_config(), HFEngineConfig) and isinstance(engine_config(model="x"), HFEngineConfig)
    assert isinstance(engine_config(backend="vllm"), VLLMEngineConfig)
    assert isinstance(reward_config(), GoldRewardConfig)
    recipe = Recipe.model_validate({"reward": {"normalize": True}, "eval": {"judge": {"model": "smollm2"}}})
    assert isinstance(recipe.reward, GoldRewardConfig) and recipe.reward.normalize
    assert isinstance(recipe.eval.judge, HFEngineConfig) and recipe.eval.judge.model == "smollm2"
    # an http judge is an openai engine: its backend may be left out
    http = reward_config(kind="http", judge={"model": "served"})
    assert isinstance(http, HTTPRewardConfig) and isinstance(http.judge, OpenAIEngineConfig)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


def error(path: Path, *overrides: str) -> str:
    with pytest.raises(RecipeError) as err:
        load_recipe(path, list(overrides))
    return str(err.value)


def test_errors_name_the_recipes_own_path_without_union_tags(tmp_path):
    path = write(tmp_path, "bon:\n  reward_models:\n    gold: {kind: gold, normalise: true}\n"
                           "reward: {kind: genrm, judge: {backend: vllm, concurrency: 3}}\n")
    message = error(path)
    assert message.startswith(f"{path}: invalid recipe")
    assert "field bon.reward_models.gold.normalise:" in message
    assert "field reward.judge.concurrency:" in message, message
    assert ".genrm." not in message and ".vllm." not in message
    message = error(write(tmp_path, "reward: {kind: golden}\n"))
    assert "field reward: unknown reward kind" in message and "'world_estimate'" in message
    assert "field reward.judge:" in error(write(tmp_path, "reward: {kind: http}\n"))   # an http judge is required
    assert "field reward.judge.backend:" in error(write(tmp_path, "reward: {kind: http, judge: {backend: hf}}\n"))
    # a field of another member is an unknown field of the selected one
    assert "field reward.judge:" in error(write(tmp_path, "reward: {kind: gold, judge: {model: x}}\n"))


def test_root_seed_and_world_reach_the_sections_that_leave_them_unset(tmp_path):
    world = {"users": 12, "cold_start_users": 4, "rendering": "compact"}
    recipe = Recipe.model_validate({"seed": 5, "world": world, "train": {"learner": {"model": "tiny"}},
                                    "bon": {"reward_models": {"a": {"kind": "world_estimate"},
                                                              "b": {"kind": "genrm", "response_view": "text"}}},
                                    "pgenrm": {}})
    expected = Recipe.model_validate({"world": world}).world
    assert recipe.reward.seed == recipe.eval.judge.seed == recipe.train.learner.seed == 5
    assert recipe.train.rollout.seed == recipe.bon.policy.seed == recipe.pgenrm.learner.seed == 5
    assert recipe.reward.world == recipe.train.data.world == recipe.pgenrm.world == recipe.bon.world == expected
    assert recipe.bon.reward_models["a"].world == recipe.bon.downstream.world == expected
    assert recipe.bon.reward_models["a"].seed == 5
    assert recipe.bon.reward_models["b"].world != expected            # a text-view GenRM reads no world
    assert recipe.pgenrm.learner.model == "tiny-genrm"                 # the section's own defaults stay
    # the root unset: the sections keep their defaults
    plain = Recipe.model_validate({"pgenrm": {}, "train": {}})
    assert plain.pgenrm.world.rendering == "compact" and plain.train.data.world is None


def test_root_shards_and_out_reach_every_section_and_a_different_one_is_an_error(tmp_path):
    recipe = Recipe.model_validate({"shards": "runs/x/data", "out": "runs/x", "train": {}, "pgenrm": {},
                                    "scaling": {"model": "m"}, "bon": {}})
    assert recipe.eval.shards == recipe.train.data.shards == recipe.pgenrm.shards == "runs/x/data"
    assert recipe.scaling.shards == recipe.bon.shards == "runs/x/data"
    assert recipe.eval.out == recipe.train.out == recipe.pgenrm.out == recipe.scaling.out == recipe.bon.out == "runs/x"
    assert recipe.data.out == "data/synthetic"          # the data build's own output is not a run folder
    same = Recipe.model_validate({"shards": "s", "pgenrm": {"shards": "s"}})
    assert same.pgenrm.shards == "s"
    message = error(write(tmp_path, "out: runs/x\npgenrm:\n  out: runs/y\n"))
    assert "field pgenrm.out" in message or "pgenrm.out" in message
    assert "disagrees with out" in message


def test_a_section_world_is_its_own_and_a_sweeps_scorers_must_agree_with_it(tmp_path):
    """The root's world is a default (a recipe may run several worlds); a sweep's world is strict for its RMs."""
    own = {"rendering": "compact", "users": 20}
    recipe = Recipe.model_validate({"world": {"users": 12}, "bon": {"world": own}, "pgenrm": {"world": own},
                                    "serve": {"reward": {"kind": "gold", "world": {"users": 30}}}})
    assert recipe.bon.world.users == recipe.pgenrm.world.users == recipe.bon.reward_models["gold"].world.users == 20
    assert recipe.reward.world.users == 12 and recipe.serve.reward.world.users == 30
    message = error(write(tmp_path, "bon:\n  world: {users: 20}\n  reward_models:\n"
                                    "    g: {kind: gold, world: {users: 30}}\n"))
    assert "reward_models.g.world" in message and "disagrees with world" in message
    # a sweep without a world (its shards exist already) leaves its scorers' worlds alone, the root's included
    recipe = Recipe.model_validate({"world": {"users": 12}, "bon": {"world": None, "reward_models": {
        "g": {"kind": "gold", "world": {"users": 30}}}}})
    assert recipe.bon.world is None and recipe.bon.reward_models["g"].world.users == 30


def test_an_explicit_section_seed_must_agree_with_the_root(tmp_path):
    assert load_recipe(write(tmp_path, "seed: 3\nreward: {seed: 3}\n")).reward.seed == 3
    message = error(write(tmp_path, "seed: 3\ntrain:\n  rollout: {seed: 4}\n"))
    assert "train.rollout.seed (4) disagrees with seed (3)" in message
    # the root's default is a declaration too: a dumped recipe (every field set) must load as it was
    assert "reward.seed (3) disagrees with seed (0)" in error(write(tmp_path, "reward: {seed: 3}\n"))


@pytest.mark.parametrize("name", sorted(BASELINE), ids=lambda n: Path(n).name)
def test_a_dumped_recipe_loads_to_the_same_recipe(name, tmp_path):
    recipe = load_recipe(RECIPES[name])
    again = load_recipe(write(tmp_path, dump_recipe(recipe)))
    assert again.model_dump(mode="json") == recipe.model_dump(mode="json")


def test_a_dump_without_root_world_loads_as_it_was(tmp_path):
    """Unset root world: the sections' own worlds (and a sweep without one) stay as they are after a dump."""
    recipe = Recipe.model_validate({"reward": {"kind": "gold", "world": {"users": 30}},
                                    "bon": {"reward_models": {"g": {"kind": "gold", "world": {"users": 20}}}},
                                    "train": {}})
    again = load_recipe(write(tmp_path, dump_recipe(recipe)))
    assert again.model_dump() == recipe.model_dump() and again.bon.world is None and again.train.data.world is None


def test_one_refinement_config_and_the_older_flat_keys():
    flat = PrototypeConfig(refine_steps=50, centroid_coef=0.5, smooth_coef=0.2, refine_lr=0.1)
    assert flat.refine == RefineConfig(steps=50, centroid_coef=0.5, smooth_coef=0.2, lr=0.1)
    assert PrototypeConfig().refine == RefineConfig() and RefineConfig().centroid_coef == 1.0
    with pytest.raises(ValueError, match="refine_steps and refine.steps are one field"):
        PrototypeConfig(refine_steps=5, refine={"steps": 6})
    recipe = Recipe.model_validate({"seed": 2, "scaling": {"scaling": {"prototypes": {"refine_steps": 3}}}})
    assert recipe.scaling.scaling.prototypes.refine.steps == 3 and recipe.scaling.scaling.prototypes.refine.seed == 2


def test_configs_import_neither_torch_nor_ray_nor_numpy():
    code = ("import sys, pr_rlhf.configs.recipe as r; r.load_recipe(None); "
            "r.engine_config(backend='openai'); r.reward_config(kind='genrm'); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'numpy'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_the_quickstart_full_tour_is_the_main_job_plus_scaling_and_best_of_n():
    main = load_recipe(ROOT / "recipes" / "quickstart.yaml").model_dump(mode="json")
    full = load_recipe(ROOT / "recipes" / "quickstart_full.yaml").model_dump(mode="json")
    assert main["scaling"] is None and main["bon"] is None
    assert full["scaling"] is not None and full["bon"] is not None
    # everything else is the same job, so the two recipes cannot drift apart
    strip = lambda d: {k: v for k, v in d.items() if k not in ("name", "scaling", "bon")}   # noqa: E731
    assert strip(main) == strip(full)
