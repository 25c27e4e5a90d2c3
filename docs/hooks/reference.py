"""MkDocs hook: the reference pages, written from the code at every build so that they cannot drift from it.

- ``reference/cli.md``: every command of the ``pr-rlhf`` typer app (``pr_rlhf.cli.app``, walked as click
  commands): its usage, help and options, as ``--help`` prints them.
- ``reference/recipe.md``: every field of a recipe, walked from the pydantic ``Recipe`` model down: dotted name,
  type, default and description. A model is documented once, where the walk meets it first; a field that holds a
  tagged union (an engine keyed by ``backend``, a reward keyed by ``kind``) or a collection of models links to
  each member's own table.

Listed under ``hooks:`` in mkdocs.yml; imports the CLI and the configs only (neither imports torch nor Ray).
"""
from __future__ import annotations

import json
import re
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

CLI_PAGE = "reference/cli.md"
RECIPE_PAGE = "reference/recipe.md"


# ---------------------------------------------------------------------------------------------------- markdown


def escape(text: str) -> str:
    """Text for a Markdown paragraph or table cell: code spans kept, everything else taken literally."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part.replace("|", "\\|"))
        else:
            out.append(re.sub(r"([\\*_\[\]|>#])", r"\\\1", part).replace("<", "&lt;"))
    return "".join(out)


def code(text: str) -> str:
    """``text`` as one inline code span (a backtick inside it widens the fence)."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}".replace("|", "\\|")


def anchor(*parts: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")


# ---------------------------------------------------------------------------------------------------- the CLI


def cli_commands(app: typer.Typer) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, click command) of every command and group of ``app``, depth first, groups before their commands;
    the path starts with ``pr-rlhf``."""

    def walk(command: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
        yield path, command
        if hasattr(command, "list_commands"):
            context = typer.Context(command, info_name=" ".join(path))
            for name in command.list_commands(context):
                yield from walk(command.get_command(context, name), (*path, name))

    yield from walk(typer.main.get_command(app), ("pr-rlhf",))


def cli_page(app: typer.Typer) -> str:
    commands = list(cli_commands(app))
    leaves = [(path, cmd) for path, cmd in commands if not hasattr(cmd, "list_commands")]
    lines = ["# CLI reference", "",
             "Written from the `pr-rlhf` app (`pr_rlhf.cli.app`) when the site is built: every command, its usage "
             "and its options, as `pr-rlhf COMMAND --help` prints them. Every command that takes a recipe also "
             "takes `--set a.b.c=value` overrides ([recipe fields](recipe.md)).", "",
             "| command | what it does |", "|---|---|"]
    for path, cmd in leaves:
        name = " ".join(path)
        lines.append(f"| [{code(name)}](#{anchor(name)}) | {escape(_first_sentence(cmd.help or ''))} |")
    for path, cmd in commands:
        name = " ".join(path)
        if hasattr(cmd, "list_commands"):
            if len(path) > 1:
                lines += ["", f"## {code(name)} {{ #{anchor(name)} }}", "", escape(cmd.help or ""), ""]
            continue
        context = typer.Context(cmd, info_name=name)
        usage = cmd.get_usage(context).removeprefix("Usage: ").strip()
        lines += ["", f"{'###' if len(path) > 2 else '##'} {code(name)} {{ #{anchor(name)} }}", "",
                  escape(cmd.help or ""), "", "```text", usage, "```", ""]
        records = [p.get_help_record(context) for p in cmd.params]
        records = [r for r in records if r]
        if records:
            lines += ["| argument / option | description |", "|---|---|"]
            lines += [f"| {code(opts)} | {escape(help_text)} |" for opts, help_text in records]
    return "\n".join(lines) + "\n"


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    match = re.match(r"(.+?(?<!e\.g)(?<!i\.e)\.)(\s|$)", text)
    return match.group(1) if match else text


# ---------------------------------------------------------------------------------------------------- recipes


@dataclass
class Section:
    """One table of the recipe page: the fields of ``model`` under the dotted ``path``."""

    anchor: str
    title: str
    model: type[BaseModel]
    path: str
    note: str = ""
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)


def _union_key(annotation: Any, metadata: list[Any]) -> Any:
    """The ``UnionKey`` (pr_rlhf.configs.base) a field's union is keyed by, wherever the annotation keeps it."""
    for item in metadata:
        if hasattr(item, "members") and hasattr(item, "key"):
            return item
    if get_origin(annotation) is Annotated:
        _, *extra = get_args(annotation)
        found = _union_key(get_args(annotation)[0], extra)
        if found is not None:
            return found
    for arg in get_args(annotation) if get_origin(annotation) is not Annotated else ():
        found = _union_key(arg, [])
        if found is not None:
            return found
    return None


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def type_name(tp: Any) -> str:
    """A readable type: ``int``, ``str | None``, ``list['pointwise' | 'pairwise']``, an engine by its key."""
    origin = get_origin(tp)
    if tp is type(None):
        return "None"
    if tp is Any:
        return "any"
    if origin is Annotated:
        key = _union_key(tp, [])
        return f"one of {key.key}: {' | '.join(key.members)}" if key is not None else type_name(get_args(tp)[0])
    if origin is Literal:
        return " | ".join(repr(v) for v in get_args(tp))
    if _is_union(tp):
        key = _union_key(tp, [])
        if key is not None and not any(a is type(None) for a in get_args(tp)):
            return f"one of {key.key}: {' | '.join(key.members)}"
        return " | ".join(type_name(a) for a in get_args(tp))
    if origin in (list, tuple, set, frozenset):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    if origin is dict:
        return f"dict[{', '.join(type_name(a) for a in get_args(tp))}]"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _constraints(metadata: list[Any]) -> str:
    symbols = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    out = [f"{symbols[k]} {getattr(m, k)}" for m in metadata for k in symbols if getattr(m, k, None) is not None]
    return f" ({', '.join(out)})" if out else ""


def _default(info: Any, key: Any = None) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    if info.default_factory is not None:
        try:
            value = info.default_factory()
        except TypeError:   # a factory that reads the validated data
            return "computed"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        if key is None:
            return "its defaults"
        chosen: Any = value
        for part in key.key.split("."):   # a key may sit in a subsection (pgenrm's psi.source)
            chosen = getattr(chosen, part, None)
        return code(f"{key.key}: {chosen}")
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return code(text if len(text) <= 60 else text[:57] + "...")


def _models(tp: Any) -> list[type[BaseModel]]:
    """The pydantic models a type holds (inside Optional, unions, lists, dicts, Annotated)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    found: list[type[BaseModel]] = []
    for arg in get_args(tp):
        found += [m for m in _models(arg) if m not in found]
    return found


def _direct_model(tp: Any) -> type[BaseModel] | None:
    """The one model of a plain nested section (``M`` or ``M | None``), else None."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    if _is_union(tp):
        members = [a for a in get_args(tp) if a is not type(None)]
        if len(members) == 1:
            return _direct_model(members[0])
    return None


class RecipeWalk:
    """Every model reachable from the recipe root, each in exactly one section (its home)."""

    def __init__(self, root: type[BaseModel]) -> None:
        self.sections: list[Section] = []
        self.home: dict[type[BaseModel], tuple[str, str]] = {}   # model -> (anchor, dotted path)
        top = Section("top-level", "Top-level fields", root, "")
        self.sections.append(top)
        self.home[root] = (top.anchor, "")
        queue: list[Section] = []
        for name, info in root.model_fields.items():   # every top-level section gets its own table first
            model = _direct_model(info.annotation)
            key = _union_key(info.annotation, list(info.metadata))
            if model is not None and model not in self.home:
                queue.append(self._claim(model, anchor(name), name, name))
            elif key is not None:   # a section of several kinds: a heading of its own, then each kind's table
                members, links = self._member_sections(name, key)
                queue.append(Section(anchor(name), name, None, name,  # type: ignore[arg-type]
                                     f"One of several kinds, chosen by `{key.key}` (absent: `{key.default}`): "
                                     f"{links}. {escape(info.description or '')}".strip()))
                queue.extend(members)
        self._fill(top, queue_after=queue)
        while queue:
            section = queue.pop(0)
            self.sections.append(section)
            if section.model is None:
                continue
            later: list[Section] = []
            self._fill(section, queue_after=later)
            queue[:0] = later

    def _claim(self, model: type[BaseModel], anchor_: str, title: str, path: str, note: str = "") -> Section:
        self.home[model] = (anchor_, path)
        return Section(anchor_, title, model, path, note)

    def _link(self, model: type[BaseModel]) -> str:
        anchor_, path = self.home[model]
        return f"[{code(path or model.__name__)}](#{anchor_})"

    def _member_sections(self, path: str, key: Any) -> tuple[list[Section], str]:
        new, links = [], []
        for member_name, member in key.members.items():
            if member not in self.home:
                a = anchor(path, key.key, member_name)
                new.append(self._claim(member, a, f"{path} ({key.key}: {member_name})", path,
                                       f"`{key.key}: {member_name}` ({member.__name__})."))
            links.append(f"[{member_name}](#{self.home[member][0]})")
        return new, ", ".join(links)

    def _fill(self, section: Section, queue_after: list[Section], prefix: str | None = None,
              model: type[BaseModel] | None = None) -> None:
        model = model or section.model
        prefix = section.path if prefix is None else prefix
        for name, info in model.model_fields.items():
            path = f"{prefix}.{name}" if prefix else name
            tp, metadata = info.annotation, list(info.metadata)
            key = _union_key(tp, metadata)
            direct = _direct_model(tp)
            description = escape(info.description or "")
            kind = escape(type_name(tp)) + _constraints(metadata)
            if key is not None:
                new, links = self._member_sections(path, key)
                queue_after.extend(new)
                kind = f"one of `{key.key}`: {links}"
                if get_origin(tp) in (list, dict) or any(get_origin(a) in (list, dict) for a in get_args(tp)):
                    kind = f"{escape(type_name(tp).split('[')[0])} of {kind}"
                section.rows.append((code(path), kind, _default(info, key), description))
            elif direct is not None and section.model is not None and prefix is not None and path.count(".") < 8:
                if direct in self.home:
                    section.rows.append((code(path), f"see {self._link(direct)}", _default(info), description))
                else:   # a plain nested section: its fields flattened here, under its dotted path
                    self.home[direct] = (section.anchor, path)
                    section.rows.append((code(path), f"section ({direct.__name__})", _default(info), description))
                    self._fill(section, queue_after, prefix=path, model=direct)
            elif _models(tp):   # a list or a dict of models
                links = []
                for inner in _models(tp):
                    if inner not in self.home:
                        queue_after.append(self._claim(inner, anchor(path, inner.__name__), f"{path}[] "
                                                       f"({inner.__name__})", f"{path}[]"))
                    links.append(self._link(inner))
                section.rows.append((code(path), f"{kind} (each: {', '.join(links)})", _default(info), description))
            else:
                section.rows.append((code(path), kind, _default(info), description))


def recipe_page(root: type[BaseModel]) -> str:
    walk = RecipeWalk(root)
    lines = ["# Recipe reference", "",
             "Written from the pydantic configs (`pr_rlhf/configs/`, the root `Recipe` in "
             "`pr_rlhf/configs/recipe.py`) when the site is built. A recipe is YAML; any field can be overridden "
             "on the command line as `--set a.b.c=value` (the value is parsed as YAML). Unknown fields are errors. "
             "A nested section's fields are listed under their dotted path; a section that holds one of several "
             "kinds (an engine's `backend`, a reward's `kind`) links to each kind's own table.", ""]
    for section in walk.sections:
        level = "##" if "." not in section.path and "(" not in section.title and not section.path.endswith("[]") \
            else "###"
        lines += [f"{level} {code(section.title) if level == '##' and section.path else escape(section.title)} "
                  f"{{ #{section.anchor} }}", ""]
        if section.note:
            lines += [section.note, ""]
        if section.rows:
            lines += ["| field | type | default | description |", "|---|---|---|---|"]
            lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in section.rows]
            lines.append("")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- the hook


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    import pr_rlhf.cli
    from pr_rlhf.configs.recipe import Recipe

    files.append(File.generated(config, CLI_PAGE, content=cli_page(pr_rlhf.cli.app)))
    files.append(File.generated(config, RECIPE_PAGE, content=recipe_page(Recipe)))
    return files
