"""Fields declared once and inherited by the sections inside: a section that leaves such a field unset takes the
value of the nearest enclosing declaration.

Declarations: the recipe root declares ``seed`` (always: its default 0 is every section's default) and, when the
recipe sets it, ``world``; a Best-of-N sweep declares its ``world`` to its reward models and judge. Each section
names what it inherits in ``StrictModel.INHERITED`` (``seed`` in every engine, scorer, learner and refinement;
``world`` in the scorers that judge in a world and in the sections that build shards from one) and what it
declares to the sections inside it in ``StrictModel.DECLARES``.

A strict declaration (the root's seed, a sweep's world) makes an explicit value that differs an error naming both
fields. The root's world is a default, not strict: one recipe may run several worlds (the quickstart builds its
data from the root's world, trains the P-GenRM on another and runs RL on a third), so ``pgenrm.world`` is the
section's own. Since a dumped recipe sets every field, these rules keep a valid recipe valid when its dump is
loaded again. The effective value stays explicit in every section: code reads ``cfg.reward.world``, never the root.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from pydantic import BaseModel

from pr_rlhf.configs.base import StrictModel


class Declared(NamedTuple):
    value: Any
    where: str      # the dotted field that declares it
    strict: bool    # an explicit value inside must be equal


def fill_children(model: BaseModel, declared: Mapping[str, Declared], path: str = "") -> None:
    """Fill the sections inside ``model`` in place (``model`` is being validated: its own fields are fresh; the
    sections inside are replaced by filled copies, never changed, since a caller may share them)."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        filled = _fill(value, declared, f"{path}{name}")
        if filled is not value:
            model.__dict__[name] = filled   # already validated: no assignment validation


def _fill(value: Any, declared: Mapping[str, Declared], path: str) -> Any:
    if isinstance(value, BaseModel):
        return _fill_model(value, declared, path)
    if isinstance(value, dict):
        items = {k: _fill(v, declared, f"{path}.{k}") for k, v in value.items()}
        return items if any(items[k] is not v for k, v in value.items()) else value
    if isinstance(value, (list, tuple)):
        items = [_fill(v, declared, f"{path}.{i}") for i, v in enumerate(value)]
        return type(value)(items) if any(a is not b for a, b in zip(items, value)) else value
    return value


def _fill_model(model: BaseModel, declared: Mapping[str, Declared], path: str) -> BaseModel:
    if not isinstance(model, StrictModel):   # e.g. a WorldConfig: nothing inside inherits
        return model
    updates: dict[str, Any] = {}
    for name in model.inherited_fields():
        if name not in declared:
            continue
        outer = declared[name]
        if name not in model.model_fields_set:
            updates[name] = outer.value
        elif outer.strict and getattr(model, name) != outer.value:
            raise ValueError(f"{path}.{name} ({_short(getattr(model, name))}) disagrees with {outer.where} "
                             f"({_short(outer.value)}): declare it once, in {outer.where}, or give both the same "
                             "value")
    scope = dict(declared)
    for name, strict in model.DECLARES.items():
        own = updates.get(name, getattr(model, name))
        if own is None:   # declares none: the sections inside keep their own
            scope.pop(name, None)
        else:
            scope[name] = Declared(own, f"{path}.{name}", strict)
    for name in type(model).model_fields:
        if name not in updates:
            value = getattr(model, name)
            filled = _fill(value, scope, f"{path}.{name}")
            if filled is not value:
                updates[name] = filled
    return model.model_copy(update=updates) if updates else model


def _short(value: Any) -> str:
    if isinstance(value, BaseModel):
        set_fields = {k: getattr(value, k) for k in sorted(value.model_fields_set)}
        return f"{type(value).__name__}({', '.join(f'{k}={v!r}' for k, v in set_fields.items())})"
    return repr(value)
