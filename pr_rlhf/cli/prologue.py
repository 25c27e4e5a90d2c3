"""What every recipe command does before its work: the recipe loaded with the ``--set`` overrides and the command's
own options (``--out`` among them) applied after them, the sections it needs checked, its banner drawn. Also the
consoles, the error exit and the options the commands share."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, List, NoReturn, Optional

import typer
from rich.console import Console

from pr_rlhf.configs.override import override
from pr_rlhf.configs.recipe import Recipe, RecipeError, load_recipe

console = Console()
err_console = Console(stderr=True)

OverridesOpt = typer.Option(None, "--set", "-s", help="override a recipe field: a.b.c=value (repeatable)")
# every Ray driver joins its cluster the same way (workers.ray_utils.init_ray)
AddressOpt = typer.Option(None, help="Ray address; default: $RAY_ADDRESS (the cluster of a `ray job submit` job), "
                                     "else a private local Ray")


def out_option(help: str) -> Any:
    """The ``--out`` / ``-o`` option of a command that writes a run directory."""
    return typer.Option(None, "--out", "-o", help=help)


def fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def read_recipe(path: Optional[PurePath], overrides: Optional[List[str]]) -> Recipe:
    """The recipe at ``path`` (the defaults when None) with ``overrides`` applied; a bad one exits 2 with the
    loader's message. Every command loads its recipe through this one name, called as ``prologue.read_recipe``
    (by :func:`open_recipe`), never imported by name elsewhere: tests stop a command at its recipe by patching it."""
    try:
        return load_recipe(path, overrides or [])
    except RecipeError as exc:
        fail(str(exc))
        raise  # unreachable: keeps type checkers quiet


@dataclass(frozen=True)
class RecipeCommand:
    """What a subcommand needs of its recipe: the sections it stops without (and a shipped recipe that has them,
    for the error), the field its ``--out`` sets, and the banner opening its work ("what -> where")."""

    name: str
    sections: tuple[str, ...] = ()
    example: Optional[str] = None
    out_field: Optional[str] = None
    headline: Optional[Callable[[Recipe], str]] = None

    def missing(self, recipe: Recipe) -> Optional[str]:
        """The error when ``recipe`` lacks a section this command needs (``serve.users``: one inside another),
        else None."""
        if all(_section(recipe, s) is not None for s in self.sections):
            return None
        if len(self.sections) > 1:
            return f"{self.name} needs {' and '.join(s + ':' for s in self.sections)} sections"
        return f"no {self.sections[0]}: section" + (f" (see {self.example})" if self.example else "")

    def banner(self, recipe: Recipe, headline: Optional[Callable[[Recipe], str]] = None) -> None:
        headline = headline or self.headline
        if headline is not None:
            console.rule(f"[bold]{self.name}[/] {headline(recipe)}")

    def announced(self, run: Callable[[Recipe], Any]) -> Callable[[Recipe], Any]:
        """``run`` opened by this command's banner: the stage as the command shows it (the quickstart's stages)."""
        def announced_run(recipe: Recipe) -> Any:
            self.banner(recipe)
            return run(recipe)
        return announced_run


def _section(recipe: Recipe, dotted: str) -> Any:
    node: Any = recipe
    for name in dotted.split("."):
        node = getattr(node, name, None)
    return node


def open_recipe(command: RecipeCommand, path: Optional[PurePath], overrides: Optional[List[str]], *,
                out: Optional[PurePath] = None, options: Optional[Mapping[str, Any]] = None,
                headline: Optional[Callable[[Recipe], str]] = None) -> Recipe:
    """The prologue of a recipe command: ``path`` loaded with the ``--set`` overrides, then the command's own
    options (``options``: recipe field -> value, None where not given; ``out``: the command's ``out_field``),
    which win over them; exit 2 naming the recipe and the section when one it needs is missing; the banner
    (``headline`` in place of the command's own). The recipe, ready to run."""
    given = dict(options or {})
    if out is not None:
        if command.out_field is None:
            raise ValueError(f"{command.name} has no output folder for --out")
        given[command.out_field] = out
    resolved = read_recipe(path, [*(overrides or []), *(override(k, v) for k, v in given.items() if v is not None)])
    problem = command.missing(resolved)
    if problem is not None:
        fail(f"{path}: {problem}")
    command.banner(resolved, headline)
    return resolved
