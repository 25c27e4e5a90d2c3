"""The learner's config (pr_rlhf/configs/learner.py): defaults, validation, the removed DeepSpeed strategy. No Ray."""
import subprocess
import sys
from pathlib import Path

import pytest

from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.configs.recipe import RecipeError, load_recipe

ROOT = Path(__file__).resolve().parents[2]


def test_config_defaults_validation_and_no_torch_import():
    cfg = LearnerConfig()
    assert cfg.strategy == "fsdp2" and cfg.loss_agg_mode == "token-mean" and not cfg.critic.enabled
    assert LearnerConfig.model_validate(cfg.model_dump(mode="json")) == cfg
    with pytest.raises(ValueError, match="world_size 1"):
        LearnerConfig(strategy="none", world_size=2)
    with pytest.raises(ValueError):
        LearnerConfig(kl={"coef": 0.1, "kind": "k4"})
    with pytest.raises(ValueError):
        LearnerConfig(clip_ratio_c=1.0)
    with pytest.raises(ValueError):
        LearnerConfig(learning_rate=1e-5)  # unknown keys are errors
    assert LearnerConfig(kl={"coef": 0.1}).kl_in_loss
    assert not LearnerConfig(kl={"coef": 0.1, "where": "reward"}).kl_in_loss
    code = ("import sys, pr_rlhf.configs.learner; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'transformers'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_deepspeed_strategy_is_a_clear_validation_error():
    with pytest.raises(ValueError, match="strategy 'deepspeed' was removed until it can be tested on a GPU machine; "
                                         "use 'fsdp2'") as err:
        LearnerConfig(strategy="deepspeed")
    assert err.value.errors()[0]["loc"] == ("strategy",)
    with pytest.raises(RecipeError, match=r"field train\.learner\.strategy: .*'deepspeed' was removed"):
        load_recipe(ROOT / "recipes" / "grpo_tiny.yaml", ["train.learner.strategy=deepspeed"])
    with pytest.raises(ValueError, match="zero_stage"):   # its ZeRO stage went with it: an unknown key
        LearnerConfig(zero_stage=2)
