"""Every command of README.md and of the documentation pages under docs/ (the studies' files under docs/results/
included) that resolves a recipe (``pr-rlhf <subcommand> ... recipes/x.yaml --set k=v``, in a shell block or
inline, ``python -m pr_rlhf.cli ...``, a recipe table's ``pr-rlhf eval R`` with R each recipe of its row, and the
``make`` targets that run one) resolves it as the command would, in process: the CLI's own option parsing and
overrides, the recipe loaded and validated as ``pr-rlhf check`` does, the sections the subcommand needs present.
A failure names the page and line."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import pr_rlhf.cli as cli
import workers.quickstart
from pr_rlhf.configs.pgenrm import STAGE_PARENT
from tests.unit.test_readme_numbers import documentation_pages

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SHELL_OPERATORS = {"&", "&&", "|", "||", ";", ">", ">>", "<", "(", ")"}
# the sections each subcommand stops without (pr_rlhf/cli.py: "no train: section", ...)
NEEDS = {"train": ("train",), "rl-sweep": ("train", "rl_sweep"), "train-rm": ("rm",), "pgenrm": ("pgenrm",),
         "headroom": ("pgenrm",), "scaling": ("scaling",), "bon": ("bon",), "serve-reward": ("serve",)}
# commands of the pages that cannot be checked as written: Command.command -> why
NOT_CHECKABLE: dict[str, str] = {
    "pr-rlhf ...": "docs/guides/clusters.md: `ray job submit ... -- python -m pr_rlhf.cli ...` names no subcommand "
                   "(it says any command runs this way)",
}


@dataclass(frozen=True)
class Command:
    where: str          # "<page>:<line>", e.g. "README.md:12" (and the make target that runs it)
    text: str           # as written: one logical shell line, or the inline span
    argv: tuple[str, ...] | None   # after `pr-rlhf`; None: the line did not parse
    error: str = ""

    @property
    def command(self) -> str:
        """The command alone, shell-quoted (no comment, no `cluster/submit.sh --` or `ray job submit ... --`)."""
        return self.text if self.argv is None else f"pr-rlhf {shlex.join(self.argv)}"

    @property
    def id(self) -> str:
        return f"{self.where}: {self.command}"


def _segments(text: str) -> list[list[str]]:
    """``text`` as shell words (quotes, ``# comments``), split at the shell's operators."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    segments: list[list[str]] = [[]]
    for token in lexer:
        if token in SHELL_OPERATORS:
            segments.append([])
        else:
            segments[-1].append(token)
    return [s for s in segments if s]


def _pr_rlhf_argv(words: list[str]) -> list[str] | None:
    """The words after ``pr-rlhf`` (``.venv/bin/pr-rlhf``, ``python -m pr_rlhf.cli``), or None."""
    for i, word in enumerate(words):
        if word == "pr-rlhf" or word.endswith("/pr-rlhf") or (word == "pr_rlhf.cli" and words[i - 1:i] == ["-m"]):
            return words[i + 1:]
    return None


def _make_target_commands(target: str) -> list[str]:
    """The recipe lines of a Makefile target."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(rf"{re.escape(target)}\s*:(?!=)", line)]
    out: list[str] = []
    for i in starts:
        for line in lines[i + 1:]:
            if not line.startswith("\t"):
                break
            out.append(line.strip())
    return out


def _commands_in(text: str, where: str) -> list[Command]:
    """The pr-rlhf commands of one logical shell line or inline span (make targets followed into the Makefile)."""
    if "pr-rlhf" not in text and "pr_rlhf.cli" not in text and not re.search(r"(^|[\s;&|])make\s", text):
        return []
    try:
        segments = _segments(text)
    except ValueError as exc:   # unbalanced quotes
        return [Command(where, text, None, f"shell words: {exc}")]
    found: list[Command] = []
    for words in segments:
        argv = _pr_rlhf_argv(words)
        if argv is not None:
            found.append(Command(where, text, tuple(argv)))
        elif words[0] == "make":
            for target in [w for w in words[1:] if "=" not in w and not w.startswith("-")]:
                for line in _make_target_commands(target):
                    found += [Command(f"{where} (make {target})", text, c.argv, c.error)
                              for c in _commands_in(line, where)]
    return found


def readme_commands() -> list[Command]:
    """Every pr-rlhf command README.md and the documentation pages write."""
    return [c for page in documentation_pages() for c in page_commands(page)]


def page_commands(page: Path) -> list[Command]:
    """Every pr-rlhf command one page writes: shell blocks (``\\`` continuations joined), inline code spans (a
    span may wrap across lines), a recipe table's rows (``R``: each recipe its first column names)."""
    name = page.relative_to(ROOT).as_posix()
    lines = page.read_text().splitlines()
    found: list[Command] = []
    prose: list[tuple[int, str]] = []

    def flush_prose() -> None:
        text = "\n".join(line for _, line in prose)
        for span in re.finditer(r"`([^`]+)`", text):
            number = prose[0][0] + text.count("\n", 0, span.start())
            found.extend(_commands_in(" ".join(span.group(1).split()), f"{name}:{number}"))
        prose.clear()

    fence = False
    logical: tuple[int, str] | None = None
    for number, line in enumerate(lines, 1):
        if line.strip().startswith("```"):
            flush_prose()
            fence = not fence
            continue
        if fence:
            start, text = logical if logical else (number, "")
            text += line
            if text.endswith("\\"):
                logical = (start, text[:-1])
                continue
            logical = None
            found.extend(_commands_in(text.strip(), f"{name}:{start}"))
        elif line.lstrip().startswith("|"):
            flush_prose()
            cells = line.strip().strip("|").split("|")
            recipes = [f"recipes/{name}" for name in re.findall(r"`([\w./-]+\.yaml)`", cells[0])]
            for span in re.findall(r"`([^`]+)`", "|".join(cells[1:])):
                for recipe in recipes if re.search(r"(^|\s)R(\s|$)", span) else [None]:
                    text = re.sub(r"(^|\s)R(?=\s|$)", rf"\g<1>{recipe}", span) if recipe else span
                    found.extend(_commands_in(text, f"{name}:{number}"))
        elif not line.strip():
            flush_prose()
        else:
            prose.append((number, line))
    flush_prose()
    return [c for c in found if _resolves_a_recipe(c)]


def _click_command(argv: tuple[str, ...]):
    """The (sub)command ``argv`` names (typer's own click), its remaining arguments, and its name."""
    command = typer.main.get_command(cli.app)
    args, name = list(argv), "pr-rlhf"
    while hasattr(command, "get_command") and args and not args[0].startswith("-"):   # a group, and its subcommand
        name = args.pop(0)
        command = command.get_command(typer.Context(command), name)
        if command is None:
            return None, args, name
    return command, args, name


def _resolves_a_recipe(command: Command) -> bool:
    """Checked: a subcommand with a recipe, given one (or one by default); not ``pr-rlhf train-rm`` named in prose,
    nor ``pr-rlhf report ...``. An unknown subcommand or an unparsable line is checked (and fails)."""
    if command.argv is None:
        return True
    cmd, args, _ = _click_command(command.argv)
    if cmd is None:
        return True
    recipe = next((p for p in cmd.params if p.name == "recipe"), None)
    return recipe is not None and (bool(args) or not recipe.required)


COMMANDS = readme_commands()


class _Resolved(Exception):
    """Raised where the command has its recipe, before it would run anything."""


def resolve_in_process(argv: tuple[str, ...], monkeypatch: pytest.MonkeyPatch):
    """Run the CLI on ``argv`` up to the recipe: (the resolved recipe or None, the CLI's output)."""
    got = {}
    load = cli.prologue.read_recipe   # every recipe command loads its recipe through this one name

    def stop_at_recipe(path, overrides):
        got["recipe"] = load(path, overrides)
        raise _Resolved

    def stop_quickstart(resolved, *args, **kwargs):
        got["recipe"] = resolved
        raise _Resolved

    monkeypatch.setattr(cli.prologue, "read_recipe", stop_at_recipe)
    monkeypatch.setattr(workers.quickstart, "run_quickstart", stop_quickstart)
    result = CliRunner().invoke(cli.app, list(argv))
    if not isinstance(result.exception, _Resolved):
        return None, result.output
    return got["recipe"], result.output


def test_the_scanner_finds_the_readme_commands():
    texts = {c.command for c in COMMANDS}
    subcommands = {c.argv[0] if c.argv[0] != "data" else " ".join(c.argv[:2]) for c in COMMANDS if c.argv}
    print("\n".join(c.id for c in COMMANDS))
    assert len(COMMANDS) >= 50, len(COMMANDS)
    assert {"check", "data build", "eval", "train", "rl-sweep", "train-rm", "pgenrm", "headroom", "scaling", "bon",
            "serve-reward", "quickstart"} <= subcommands, subcommands
    assert "pr-rlhf serve-reward recipes/serve_reward.yaml --set serve.reward.kind=scalar" in texts
    assert any("(make quickstart-full" in c.where for c in COMMANDS)
    pages = {c.where.split(":")[0] for c in COMMANDS}   # the README and the guides, studies and results files
    assert {"README.md", "docs/getting-started.md", "docs/guides/pgenrm.md", "docs/studies/bon.md",
            "docs/results/leaderboard/RESULTS.md"} <= pages, pages
    readme = {c.argv[0] for c in COMMANDS if c.where.startswith("README.md:") and c.argv}
    assert {"quickstart", "train", "pgenrm", "bon"} <= readme, readme   # make quickstart and the cluster commands
    assert any("pr_rlhf.cli" in c.text for c in COMMANDS)                     # python -m pr_rlhf.cli
    assert "pr-rlhf pgenrm recipes/pgenrm_smoke.yaml --stage base --stage psi" in texts   # the table's R
    # an inline span broken over two lines (the full tour's `--out` and its folder)
    assert "pr-rlhf quickstart --recipe recipes/quickstart_full.yaml --out runs/quickstart_full" in texts
    assert any(c.where.endswith("(make quickstart)") and c.text.startswith("make quickstart ")
               for c in COMMANDS)   # a shell block's make
    assert set(NOT_CHECKABLE) <= texts, set(NOT_CHECKABLE) - texts   # the allowlist names current lines only


CHECKABLE = [c for c in COMMANDS if c.command not in NOT_CHECKABLE]   # the allowlist is checked above


@pytest.mark.parametrize("command", CHECKABLE, ids=[c.id for c in CHECKABLE])
def test_readme_command_resolves_its_recipe(command: Command, monkeypatch):
    assert command.argv is not None, f"{command.id}: {command.error}"
    cmd, args, name = _click_command(command.argv)
    assert cmd is not None, f"{command.id}: no subcommand {name!r}"
    try:   # the CLI's own parsing: unknown options, missing arguments, wrong types
        params = cmd.make_context(name, list(args)).params
    except Exception as exc:   # typer's click's UsageError
        if not hasattr(exc, "format_message"):
            raise
        pytest.fail(f"{command.id}: {exc.format_message()}")
    recipe, output = resolve_in_process(command.argv, monkeypatch)
    assert recipe is not None, f"{command.id}:\n{output}"
    missing = [s for s in NEEDS.get(name, ()) if getattr(recipe, s) is None]
    assert not missing, f"{command.id}: `pr-rlhf {name}` needs the recipe's {missing} section(s)"
    unknown = set(params.get("stage") or ()) - set(STAGE_PARENT) if name == "pgenrm" else set()
    assert not unknown, f"{command.id}: no P-GenRM stage {sorted(unknown)}"


# records of what was there when they were committed (a pre-registration names the recipe its run was to use)
RECORDS = ("PREREGISTRATION.md", "DEVIATIONS.md")


def test_every_recipe_file_the_pages_name_exists():
    named = {(page.relative_to(ROOT).as_posix(), number, path) for page in documentation_pages()
             if page.name not in RECORDS
             for number, line in enumerate(page.read_text().splitlines(), 1)
             for path in re.findall(r"recipes/[\w/.-]*\w\.(?:yaml|sh)", line)}
    assert len({path for _, _, path in named}) >= 20, named
    missing = sorted(f"{page}:{number}: {path}" for page, number, path in named if not (ROOT / path).is_file())
    assert not missing, "pages name recipe files that do not exist:\n" + "\n".join(missing)
