"""The documentation site builds in strict mode with no warning (a broken link or anchor, a missing page, a
hand-written page left out of the navigation), and its generated reference lists every command of the CLI and
every section of a recipe with its fields (docs/hooks/reference.py writes them from the code at build time)."""
from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
import typer
from pydantic import BaseModel

import pr_rlhf.cli
from pr_rlhf.configs.recipe import Recipe
from tests.optional import need

need("mkdocs", load=False)
need("material", load=False)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    log = build.stdout + build.stderr
    warnings = [line for line in log.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert build.returncode == 0 and not warnings, f"mkdocs build --strict:\n{log[-6000:]}"
    return out


def page_text(site: Path, page: str) -> str:
    """The page's HTML with tags stripped (code spans read as their text)."""
    return html.unescape(re.sub(r"<[^>]+>", "", (site / page / "index.html").read_text()))


def anchors(site: Path, page: str) -> set[str]:
    return set(re.findall(r'id="([^"]+)"', (site / page / "index.html").read_text()))


def cli_commands() -> list[str]:
    """``pr-rlhf ...`` of every command (not group) of the app."""
    found: list[str] = []

    def walk(command, path: str) -> None:
        if not hasattr(command, "list_commands"):
            found.append(path)
            return
        context = typer.Context(command, info_name=path)
        for name in command.list_commands(context):
            walk(command.get_command(context, name), f"{path} {name}")

    walk(typer.main.get_command(pr_rlhf.cli.app), "pr-rlhf")
    return found


def test_the_site_builds_without_a_warning(site):
    for page in ("index.html", "getting-started/index.html", "studies/pgenrm-worlds/index.html",
                 "guides/integrations/index.html", "reference/cli/index.html", "reference/recipe/index.html"):
        assert (site / page).is_file(), page


def test_the_cli_reference_lists_every_command(site):
    commands = cli_commands()
    assert len(commands) >= 20 and "pr-rlhf data build" in commands, commands
    ids, text = anchors(site, "reference/cli"), page_text(site, "reference/cli")
    missing = [c for c in commands if c.replace(" ", "-") not in ids or f"{c} [OPTIONS]" not in text]
    assert not missing, f"commands without a section (and its usage) in the CLI reference: {missing}"


def test_the_recipe_reference_lists_every_section_and_its_fields(site):
    ids, text = anchors(site, "reference/recipe"), page_text(site, "reference/recipe")
    sections = list(Recipe.model_fields)
    assert {"data", "eval", "reward", "train", "pgenrm", "serve"} <= set(sections)
    missing = [name for name in sections if name not in text]
    assert not missing, f"top-level recipe fields missing from the reference: {missing}"
    nested = [name for name, info in Recipe.model_fields.items() if _holds_a_model(info.annotation)]
    headings = [name for name in nested if name.replace("_", "-") not in ids]
    assert not headings, f"recipe sections without a heading of their own: {headings}"
    # a plain section's fields, each under its dotted name (eval.judge, train.learner.lr, ...)
    fields = [f"{name}.{field}" for name in ("eval", "train", "bon", "serve", "scaling")
              for field in _model(Recipe.model_fields[name].annotation).model_fields]
    missing = [f for f in fields if f not in text]
    assert not missing, f"recipe fields missing from the reference: {missing}"


def _model(annotation) -> type[BaseModel]:
    """The model of ``M`` or ``M | None``."""
    return next(a for a in (annotation, *get_args(annotation)) if isinstance(a, type) and issubclass(a, BaseModel))


def _holds_a_model(annotation) -> bool:
    """A section: a model, or a union of models (data by source, reward by kind)."""
    if isinstance(annotation, type):
        return issubclass(annotation, BaseModel)
    return any(_holds_a_model(a) for a in get_args(annotation))
