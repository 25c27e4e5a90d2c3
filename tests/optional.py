"""Optional dependencies in tests: skipped where they are not installed, a failure where they must be.

`make test` installs every test dependency (verl, bm25s, httpx, Ray Serve) and sets PR_RLHF_ALL_EXTRAS=1, so
there a missing one is an installation bug that must fail, not a skip that hides the golden comparison.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import pytest


def need(module: str, *, load: bool = True) -> ModuleType | None:
    """The module (``load=False``: only check that it is installed, for a module whose import would change this
    process, e.g. numba's under vLLM)."""
    try:
        if not load:
            if importlib.util.find_spec(module) is None:
                raise ImportError(f"No module named {module!r}")
            return None
        return importlib.import_module(module)
    except ImportError as exc:
        if os.environ.get("PR_RLHF_ALL_EXTRAS") == "1":
            pytest.fail(f"{module} must be importable here (`make` installs it): {exc}", pytrace=False)
        pytest.skip(f"{module} is not installed ({exc})", allow_module_level=True)
