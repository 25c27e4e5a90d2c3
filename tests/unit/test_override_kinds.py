"""An override that switches a tagged union's member (``serve.reward.kind=scalar``, ``train.rollout.backend=vllm``)
starts the new member from the fields it shares with the old one: the old kind's own fields are dropped, the shared
ones (``model``, ``dtype``) and any given for the new kind, before or after the switch, stay."""
from pathlib import Path

import pytest

from pr_rlhf.configs.base import HFEngineConfig, OpenAIEngineConfig, VLLMEngineConfig
from pr_rlhf.configs.recipe import RecipeError, apply_override, load_recipe
from pr_rlhf.configs.reward import (
    GenRMRewardConfig,
    RubricRewardConfig,
    ScalarRewardConfig,
    WorldEstimateRewardConfig,
)

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_readme_serve_command_switches_the_scorer_to_scalar():
    # README: pr-rlhf serve-reward recipes/serve_reward.yaml --set serve.reward.kind=scalar
    reward = load_recipe(RECIPES / "serve_reward.yaml", ["serve.reward.kind=scalar"]).serve.reward
    assert isinstance(reward, ScalarRewardConfig)
    assert reward.generation.max_tokens == 320          # a field both kinds have stays
    assert reward.scalar_rm.model == "tiny"             # the new kind's own fields start at their defaults
    assert load_recipe(RECIPES / "serve_reward.yaml").serve.reward.judge.model == "runs/pgenrm/curriculum/model"


def test_switching_to_the_same_kind_keeps_everything():
    reward = load_recipe(RECIPES / "serve_reward.yaml", ["serve.reward.kind=genrm"]).serve.reward
    assert isinstance(reward, GenRMRewardConfig)
    assert reward.judge.model == "runs/pgenrm/curriculum/model" and reward.sec_format == "sec_compact"


def test_rollout_backend_switch_keeps_the_shared_engine_fields():
    path = RECIPES / "grpo_tiny.yaml"   # rollout: {backend: hf, model: tiny, dtype: float32}
    vllm = load_recipe(path, ["train.rollout.device=cuda", "train.rollout.backend=vllm"]).train.rollout
    assert isinstance(vllm, VLLMEngineConfig)
    assert (vllm.model, vllm.dtype, vllm.device) == ("tiny", "float32", "cuda")   # hf's fields vLLM also has
    openai = load_recipe(path, ["train.rollout.device=cuda", "train.rollout.backend=openai"]).train.rollout
    assert isinstance(openai, OpenAIEngineConfig)   # hf's `device` is no openai field: dropped
    assert (openai.model, openai.dtype) == ("tiny", "float32")


def test_rollout_backend_switch_drops_the_old_backends_own_fields():
    path = RECIPES / "grpo_personalized.yaml"   # rollout: {backend: vllm, model: smollm2, dtype: bfloat16, ...}
    hf = load_recipe(path, ["train.rollout.tensor_parallel_size=2", "train.rollout.gpu_memory_utilization=0.9",
                            "train.rollout.backend=hf"]).train.rollout
    assert isinstance(hf, HFEngineConfig)
    assert (hf.model, hf.dtype, hf.max_model_len) == ("smollm2", "bfloat16", 1024)


def test_reward_kind_switch():
    tree = {"reward": {"kind": "gold", "normalize": True, "world": {"seed": 3}, "pool": {"workers": 2}}}
    apply_override(tree, "reward.kind=world_estimate")
    assert tree["reward"] == {"kind": "world_estimate", "world": {"seed": 3}, "pool": {"workers": 2}}
    reward = load_recipe(RECIPES / "grpo_tiny.yaml", ["reward.kind=world_estimate",
                                                      "reward.estimator=no_history"]).reward
    assert isinstance(reward, WorldEstimateRewardConfig)
    assert reward.estimator == "no_history" and reward.pool.num_cpus == 0.5


def test_a_field_given_for_the_new_kind_survives_before_or_after_the_switch():
    path = RECIPES / "serve_reward.yaml"
    after = load_recipe(path, ["serve.reward.kind=scalar", "serve.reward.scalar_rm.model=models/rm",
                               "serve.reward.scalar_rm.batch_size=4"]).serve.reward
    before = load_recipe(path, ["serve.reward.scalar_rm.model=models/rm", "serve.reward.scalar_rm.batch_size=4",
                                "serve.reward.kind=scalar"]).serve.reward
    for reward in (after, before):
        assert isinstance(reward, ScalarRewardConfig)
        assert (reward.scalar_rm.model, reward.scalar_rm.batch_size) == ("models/rm", 4)
    # an override inside the new member resolves through the member the section now holds
    rubric = load_recipe(path, ["serve.reward.kind=rubric", "serve.reward.judge.device=cuda",
                                "serve.reward.judge.backend=openai"]).serve.reward
    assert isinstance(rubric, RubricRewardConfig) and isinstance(rubric.judge, OpenAIEngineConfig)
    assert rubric.judge.model == "runs/pgenrm/curriculum/model"


def test_unknown_kind_still_gives_the_clear_error():
    with pytest.raises(RecipeError, match=r"field serve\.reward: unknown reward kind: expected one of 'gold', "
                                          r"'world_estimate', 'scalar', 'genrm', 'http', 'rubric'"):
        load_recipe(RECIPES / "serve_reward.yaml", ["serve.reward.kind=scalr"])
    with pytest.raises(RecipeError, match=r"unknown engine backend: expected one of 'hf', 'vllm', 'openai'"):
        load_recipe(RECIPES / "grpo_tiny.yaml", ["train.rollout.backend=vlm"])


def test_a_typo_is_not_dropped_by_the_switch():
    # a key no member has is no old kind's field: validation still names it
    with pytest.raises(RecipeError, match=r"field serve\.reward\.scalar_rn: Extra inputs are not permitted"):
        load_recipe(RECIPES / "serve_reward.yaml", ["serve.reward.scalar_rn.model=x", "serve.reward.kind=scalar"])


def test_unions_inside_dicts_options_and_defaults():
    # a dict of unions (bon.reward_models), the default member of a section without its key, an optional union
    # (eval.planner), the real-data member's teacher engine (pgenrm.psi.teacher)
    bon = load_recipe(RECIPES / "bon_sweep.yaml", ["bon.reward_models.pgenrm_full.kind=scalar"]).bon
    assert isinstance(bon.reward_models["pgenrm_full"], ScalarRewardConfig)
    assert isinstance(bon.reward_models["pgenrm_psi"], GenRMRewardConfig)
    tree = {"eval": {"judge": {"model": "m", "device": "cuda"}, "planner": {"model": "p", "device": "cuda"}},
            "pgenrm": {"psi": {"source": "teacher", "teacher": {"model": "t", "device": "cuda"}}}}
    for section in ("eval.judge", "eval.planner", "pgenrm.psi.teacher"):
        apply_override(tree, f"{section}.backend=openai")
    assert tree["eval"] == {"judge": {"model": "m", "backend": "openai"},
                            "planner": {"model": "p", "backend": "openai"}}
    assert tree["pgenrm"]["psi"]["teacher"] == {"model": "t", "backend": "openai"}


def test_keys_named_kind_outside_a_union_are_plain_fields():
    tree = {"train": {"learner": {"kl": {"coef": 0.05, "kind": "k3", "where": "loss"}}}}
    apply_override(tree, "train.learner.kl.kind=k1")
    assert tree["train"]["learner"]["kl"] == {"coef": 0.05, "kind": "k1", "where": "loss"}
    tree = {"eval": {"models": {"big": {"judge": {"device": "cuda"}}}}}   # dict[str, Any]: the schema says nothing
    apply_override(tree, "eval.models.big.judge.backend=openai")
    assert tree["eval"]["models"]["big"]["judge"] == {"device": "cuda", "backend": "openai"}
