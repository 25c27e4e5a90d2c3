"""Recipes validate with errors naming file and field; the CLI starts without torch or Ray."""
import subprocess
import sys
from pathlib import Path

import pytest

from pr_rlhf.configs.recipe import Recipe, RecipeError, apply_override, load_recipe

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "pr_rlhf.cli"]


def test_defaults_validate():
    recipe = load_recipe(None)
    assert isinstance(recipe, Recipe) and recipe.data.source == "synthetic"


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_validates(path):
    load_recipe(path)


def test_overrides_are_typed_and_nested():
    tree: dict = {}
    apply_override(tree, "data.retrieval.top_k=5")
    apply_override(tree, "data.source=prb")
    apply_override(tree, "data.skip_invalid=true")
    recipe = Recipe.model_validate(tree)
    assert recipe.data.retrieval.top_k == 5 and recipe.data.source == "prb" and recipe.data.skip_invalid is True
    with pytest.raises(RecipeError, match="key.path=value"):
        apply_override(tree, "no_equals_sign")


def test_unknown_and_mistyped_fields_name_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  retrieval:\n    top_k: many\n  sourse: prb\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(bad)
    message = str(err.value)
    assert str(bad) in message
    assert "data.retrieval.top_k" in message and "data.sourse" in message
    with pytest.raises(RecipeError, match="not found"):
        load_recipe(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(RecipeError, match="mapping"):
        load_recipe(tmp_path / "list.yaml")


def test_cli_imports_neither_torch_nor_ray():
    code = ("import sys, pr_rlhf.cli, pr_rlhf.configs.recipe; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'transformers', 'vllm'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_cli_help_and_check(tmp_path):
    help_out = subprocess.run(CLI + ["--help"], capture_output=True, text=True, cwd=ROOT)
    assert help_out.returncode == 0 and "data" in help_out.stdout and "quickstart" in help_out.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("world:\n  user_noise: loud\n")
    res = subprocess.run(CLI + ["check", str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2
    assert "world.user_noise" in res.stderr and "bad.yaml" in res.stderr
    ok = subprocess.run(CLI + ["check", str(ROOT / "recipes/quickstart.yaml"), "--set", "data.retrieval.top_k=3"],
                        capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr


def test_single_update_means_one_epoch_over_one_mini_batch():
    from pr_rlhf.configs.learner import LearnerConfig

    assert LearnerConfig().single_update(64)
    assert LearnerConfig(mini_batch_size=64).single_update(64)
    assert not LearnerConfig(mini_batch_size=16).single_update(64)
    assert not LearnerConfig(ppo_epochs=2).single_update(8)


def test_cli_errors_name_the_recipes_own_path(tmp_path):
    """A union member's error is reported at the recipe's path (reward.judge.concurrency), not pydantic's tagged
    location (reward.genrm.judge.vllm.concurrency)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("reward: {kind: genrm, judge: {backend: vllm, concurrency: 3}}\n")
    res = subprocess.run(CLI + ["check", str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2 and "bad.yaml: invalid recipe" in res.stderr
    assert "field reward.judge.concurrency:" in res.stderr and "genrm" not in res.stderr
