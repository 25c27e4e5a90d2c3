"""The prologue every recipe command shares, run in process up to the resolved recipe: ``--out`` sets the section's
output folder to exactly the folder name given (``2024``, ``true``, ``a: b #c`` or any character stay that string),
every command that writes a run directory takes ``--out``, and a recipe without the section a command needs is
refused with the message naming the recipe and the section."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import pr_rlhf.cli as cli
from pr_rlhf.cli import prologue
from pr_rlhf.configs.recipe import apply_override

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
    load = cli.prologue.read_recipe

    def stop_at_recipe(path, overrides):
        got["recipe"] = load(path, overrides)
        raise _Resolved

    monkeypatch.setattr(cli.prologue, "read_recipe", stop_at_recipe)
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


@pytest.mark.parametrize("value", ["2024", "a: b #c", "new\nline", "\u00e9\U0001f600\x85\u2028", "\udc80",
                                   " padded ", "x" * 300, "", 3, 0.5, True])
def test_an_override_reads_back_as_the_value_itself(value):
    tree: dict = {}
    apply_override(tree, prologue.override("a.b", value))
    assert tree == {"a": {"b": value}}


# a command, its recipe, the stage function its prologue hands the recipe to, and the banner it draws first
BANNERS = [
    (["eval", "recipes/eval_synthetic.yaml"], "evaluation", "run_eval_stage", "eval runs/quickstart/data -> OUT"),
    (["train", "recipes/grpo_tiny.yaml"], "training", "run_train_stage", "train grpo -> OUT"),
    (["train-rm", "recipes/rm_bt.yaml"], "training", "run_train_rm_stage", "train-rm {modes} -> OUT"),
    (["pgenrm", "recipes/pgenrm_smoke.yaml"], "pgenrm", "run_pgenrm_stage", "pgenrm {stages} -> OUT"),
    (["pgenrm", "recipes/pgenrm_smoke.yaml", "--stage", "base", "--stage", "psi"], "pgenrm", "run_pgenrm_stage",
     "pgenrm base -> psi -> OUT"),
    (["scaling", "recipes/scaling_grid.yaml"], "evaluation", "run_scaling_stage", "scaling {model} -> OUT"),
    (["bon", "recipes/bon_sweep.yaml"], "evaluation", "run_bon_stage", "bon n={n}, {prompts} prompts -> OUT"),
]


@pytest.mark.parametrize("command,module,stage,banner", BANNERS, ids=[" ".join(b[0]) for b in BANNERS])
def test_the_prologue_draws_the_banner_then_hands_the_recipe_on(command, module, stage, banner, monkeypatch):
    handed = []
    monkeypatch.setattr(getattr(cli, module), stage, lambda recipe, *args: handed.append(recipe))
    result = CliRunner().invoke(cli.app, [*_with_root(command), "--out", "runs/banner test"], terminal_width=200)
    assert result.exit_code == 0, result.output
    (recipe,) = handed
    expected = banner.replace("OUT", "runs/banner test").format(
        stages=" -> ".join(recipe.pgenrm.stages) if recipe.pgenrm else "",
        model=recipe.scaling.model if recipe.scaling else "", n=recipe.bon.n if recipe.bon else "",
        prompts=recipe.bon.prompts if recipe.bon else "", modes=", ".join(recipe.rm.input_modes) if recipe.rm else "")
    assert expected in result.output, result.output


def test_an_unknown_stage_is_refused_before_anything_runs(monkeypatch):
    monkeypatch.setattr(cli.pgenrm, "run_pgenrm_stage", lambda *args: pytest.fail("ran"))
    result = CliRunner().invoke(cli.app, ["pgenrm", str(ROOT / "recipes/pgenrm_smoke.yaml"), "--stage", "psy"])
    assert result.exit_code == 2
    assert "error: --stage 'psy': expected one of base, psi" in result.output


def test_the_quickstart_shows_each_stage_as_its_command_does(monkeypatch):
    """The quickstart's stages are the commands' stage functions, each opened by its command's banner."""
    import workers.quickstart

    ran = []
    monkeypatch.setattr(cli.quickstart, "run_eval_stage", ran.append)

    def evaluation_only(recipe, out, runners):
        runners.eval(recipe)
        raise _Resolved

    monkeypatch.setattr(workers.quickstart, "run_quickstart", evaluation_only)
    result = CliRunner().invoke(cli.app, ["quickstart", "--recipe", str(ROOT / "recipes/quickstart.yaml"),
                                          "--out", "runs/qs"])
    assert isinstance(result.exception, _Resolved), result.output
    assert len(ran) == 1 and "eval runs/qs/data -> runs/qs/eval" in result.output, result.output


def test_the_user_store_commands_read_their_recipe_through_the_prologue(tmp_path, monkeypatch):
    export = tmp_path / "users.jsonl"
    result = CliRunner().invoke(cli.app, ["users", "export", str(export), "--recipe",
                                          str(ROOT / "recipes/eval_synthetic.yaml")])
    assert result.exit_code == 2 and not export.exists()
    assert "no serve.users: section (see recipes/serve_online.yaml)" in " ".join(result.output.split())
    recipe, output = resolve(["users", "export", str(export), "--recipe", str(ROOT / "recipes/serve_online.yaml")],
                             monkeypatch)
    assert recipe is not None and not export.exists(), output


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_quickstart_places_its_stages_under_any_folder_name(folder):
    """The quickstart's own placements go through the same override writer as every command's --out."""
    from workers.quickstart import quickstart_recipe

    recipe = quickstart_recipe(ROOT / "recipes/quickstart.yaml", Path(folder), [])
    assert recipe.data.out == str(Path(folder) / "data") and recipe.eval.out == str(Path(folder) / "eval")


def test_headroom_refuses_real_data_by_name():
    """The headroom check compares the teacher with the Bayes oracle of a synthetic world; real data has none."""
    result = CliRunner().invoke(cli.app, ["headroom", str(ROOT / "recipes/pgenrm_real.yaml")])
    assert result.exit_code == 2, result.output
    assert "headroom needs the synthetic world" in result.output and "psi.source" in result.output
