"""Prompt templates (``pr_rlhf/prompts/*.txt``) and the one renderer.

A template file is made of sections, each opened by a marker line ``=== name ===``. The sections ``system`` and
``user`` are the two chat messages; any other section is a fragment that code renders on its own with
:func:`fragment` (headed blocks such as the user's profile), or plain documentation (``notes``). A file without
marker lines is one ``user`` section.

Placeholders are ``{name}`` (a Python identifier in braces); everything else, JSON examples included, is literal
text, and ``{{name}}`` writes a literal ``{name}``. Substitution is a single pass, so braces, ``$`` or
``{placeholders}`` inside a *value* are never interpreted. A missing variable raises :class:`PromptError` naming the
template, the section and the variable; extra variables are ignored (one call can feed several sections).
A line holding nothing but a placeholder whose value is empty is dropped, together with the blank line after it,
so optional blocks vanish without leaving gaps.
"""
from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

_MARKER = re.compile(r"^===\s*([A-Za-z_][A-Za-z0-9_]*)\s*===\s*$")
_TOKEN = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ALONE = re.compile(r"^\s*\{([A-Za-z_][A-Za-z0-9_]*)\}\s*$")


class PromptError(ValueError):
    """A template that does not exist, lacks a section, or needs a variable the caller did not give."""


def names() -> list[str]:
    """Every template shipped in this package (file stems)."""
    return sorted(p.name[:-4] for p in resources.files(__name__).iterdir() if p.name.endswith(".txt"))


def sections(name: str) -> dict[str, str]:
    """The sections of template ``name`` (surrounding blank lines stripped), in file order."""
    return dict(_sections(name))


@cache
def _sections(name: str) -> dict[str, str]:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_]+", name) \
            or not (resources.files(__name__) / f"{name}.txt").is_file():
        raise PromptError(f"no prompt template {name!r}; available: {', '.join(names())}")
    text = (resources.files(__name__) / f"{name}.txt").read_text(encoding="utf-8")
    found: dict[str, list[str]] = {}
    current = "user"
    for line in text.splitlines():
        marker = _MARKER.match(line)
        if marker:
            current = marker.group(1)
            if current in found:
                raise PromptError(f"template {name!r}: section {current!r} appears twice")
            found[current] = []
        else:
            found.setdefault(current, []).append(line)
    return {key: "\n".join(lines).strip("\n") for key, lines in found.items()}


def placeholders(name: str, section: str | None = None) -> set[str]:
    """The variables a template (or one of its sections) needs."""
    parts = sections(name)
    chosen = [parts[section]] if section is not None else [parts[s] for s in ("system", "user") if s in parts]
    return {m.group(2) for text in chosen for m in _TOKEN.finditer(text) if m.group(2)}


def _substitute(text: str, values: dict[str, Any], where: str) -> str:
    def value(key: str) -> str:
        if key not in values:
            given = ", ".join(sorted(values)) or "none"
            raise PromptError(f"{where} needs variable {key!r} (given: {given})")
        return str(values[key])

    out: list[str] = []
    skip_blank = False
    for line in text.split("\n"):
        alone = _ALONE.match(line)
        if alone and value(alone.group(1)) == "":
            skip_blank = True  # drop the line and the blank line after it
            continue
        if skip_blank and not line.strip():
            skip_blank = False
            continue
        skip_blank = False
        out.append(_TOKEN.sub(lambda m: "{" + m.group(1) + "}" if m.group(1) else value(m.group(2)), line))
    return "\n".join(out).strip("\n")


def fragment(name: str, section: str, **values: Any) -> str:
    """Render one section of a template."""
    parts = sections(name)
    if section not in parts:
        raise PromptError(f"template {name!r} has no section {section!r}; it has: {', '.join(parts)}")
    return _substitute(parts[section], values, f"template {name!r} (section {section!r})")


def chat(name: str, **values: Any) -> list[dict]:
    """The template as chat messages: a system message when it has a ``system`` section, then the user one."""
    parts = sections(name)
    if "user" not in parts:
        raise PromptError(f"template {name!r} has no user section")
    messages = []
    if "system" in parts:
        messages.append({"role": "system", "content": fragment(name, "system", **values)})
    messages.append({"role": "user", "content": fragment(name, "user", **values)})
    return messages


def render(name: str, **values: Any) -> str:
    """The template as one string (system part, a blank line, then the user part)."""
    return "\n\n".join(m["content"] for m in chat(name, **values))
