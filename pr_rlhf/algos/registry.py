"""A small name -> callable registry shared by the algorithm tables (advantages, policy losses, KL estimators).

    ESTIMATORS = Registry("advantage estimator")

    @ESTIMATORS.register("grpo")
    def grpo(...): ...

    ESTIMATORS.get("grpo")                     # the function
    ESTIMATORS.get("nope")                     # UnknownNameError listing the known names
    ESTIMATORS.call("grpo", **superset)        # drops keyword arguments the function does not take
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class UnknownNameError(KeyError, ValueError):
    """Raised by `Registry.get` for a name nobody registered; catchable as KeyError or ValueError."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class Registry(Generic[F]):
    """Maps names (and aliases) to callables. Registering a different callable under a taken name is an error."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, name: str, *aliases: str) -> Callable[[F], F]:
        """Decorator: register the function under `name` and any `aliases`; returns the function unchanged."""

        def decorator(fn: F) -> F:
            for key in (name, *aliases):
                self.add(key, fn)
            return fn

        return decorator

    def add(self, name: str, fn: F) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        current = self._items.get(name)
        if current is not None and current is not fn:
            raise ValueError(f"{self.kind} {name!r} is already registered to {current!r}")
        self._items[name] = fn

    def get(self, name: str) -> F:
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}") from None

    def call(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call the function registered as `name`, passing only the keyword arguments it accepts.

        Lets a trainer hand every estimator/loss the same superset of settings (values, gamma, index, clip_ratio_c,
        ...) and have each take what it needs. A missing required argument still raises TypeError.
        """
        fn = self.get(name)
        return fn(*args, **supported_kwargs(fn, kwargs))

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


def supported_kwargs(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The subset of `kwargs` that `fn` accepts by keyword (all of them if it takes **kwargs)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(kwargs)
    accepted = {
        p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return {k: v for k, v in kwargs.items() if k in accepted}
