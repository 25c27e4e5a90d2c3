"""The prologue every recipe command shares, run in process up to the resolved recipe: ``--out`` sets the section's
output folder to exactly the folder name given (``2024``, ``true``, ``a: b #c`` or any character stay that string),
every command that writes a run directory takes ``--out``, and a recipe without the section a command needs is
refused with the message naming the recipe and the section."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import pr_rlhf.cli as cli

ROOT = Path(__file__).resolve().parents[2]

# the command (up to its recipe), and the section whose `out` its --out sets
WRITERS = [
    (["data", "build", "--recipe", "recipes/quickstart.yaml"], "data"),
    (["eval", "recipes/eval_synthetic.yaml"], "eval"),
    (["train", "recipes/grpo_tiny.yaml"], "train"),
    (["rl-sweep", "recipes/rl_validity.yaml"], "rl_sweep"),
    (["train-rm", "recipes/rm_bt.yaml"], "rm"),
    (["pgenrm", "recipes/pgenrm_smoke.yaml"], "pgenrm"),
    (["headroom", "recipes/pgenrm_smoke.yaml"], "pgenrm"),
    (["scaling", "recipes/scaling_grid.yaml"], "scaling"),
    (["bon", "recipes/bon_sweep.yaml"], "bon"),
    (["leaderboard", "recipes/leaderboard.yaml"], "leaderboard"),
]
# folder names YAML would read as something else than that string, unquoted or quoted the JSON way
FOLDERS = ["2024", "true", "runs/a: b #c", "runs/\u00e9t\u00e9 \U0001f600", "null"]


class _Resolved(Exception):
    """Raised where the command has its recipe, before it would run anything."""


def resolve(argv: list[str], monkeypatch: pytest.MonkeyPatch):
    """The recipe the command resolves (None when it stops before), and its output."""
    got = {}
    load = cli._recipe

    def stop_at_recipe(path, overrides):
        got["recipe"] = load(path, overrides)
        raise _Resolved

    monkeypatch.setattr(cli, "_recipe", stop_at_recipe)
    result = CliRunner().invoke(cli.app, argv)
    return (got["recipe"] if isinstance(result.exception, _Resolved) else None), result.output


def _with_root(argv: list[str]) -> list[str]:
    return [str(ROOT / a) if a.startswith("recipes/") else a for a in argv]


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("command,section", WRITERS, ids=[" ".join(c[:-1]) for c, _ in WRITERS])
def test_out_sets_the_sections_folder_to_the_string_given(command, section, folder, monkeypatch):
    recipe, output = resolve([*_with_root(command), "--out", folder], monkeypatch)
    assert recipe is not None, output
    assert getattr(recipe, section).out == folder


def test_out_comes_after_the_set_overrides(monkeypatch):
    recipe, output = resolve([*_with_root(["bon", "recipes/bon_sweep.yaml"]), "--set", "bon.out=runs/x",
                              "--out", "runs/y"], monkeypatch)
    assert recipe is not None, output
    assert recipe.bon.out == "runs/y"


@pytest.mark.parametrize("command,message", [
    ("train", "no train: section"),
    ("rl-sweep", "rl-sweep needs train: and rl_sweep: sections"),
    ("train-rm", "no rm: section"),
    ("pgenrm", "no pgenrm: section"),
    ("headroom", "no pgenrm: section"),
    ("scaling", "no scaling: section (see recipes/scaling_grid.yaml)"),
    ("bon", "no bon: section (see recipes/bon_sweep.yaml)"),
    ("leaderboard", "no leaderboard: section (see recipes/leaderboard.yaml)"),
    ("serve-reward", "no serve: section (see recipes/serve_reward.yaml)"),
])
def test_a_recipe_without_the_section_is_refused(command, message):
    recipe = ROOT / "recipes/eval_synthetic.yaml"
    result = CliRunner().invoke(cli.app, [command, str(recipe)])
    assert result.exit_code == 2, result.output
    assert f"error: {recipe}: {message}" in " ".join(result.output.split())
