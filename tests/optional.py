"""Optional dependencies in tests: skipped where they are not installed, a failure where they must be.

`make test` installs every test dependency (verl, bm25s, httpx, Ray Serve) and sets PR_RLHF_ALL_EXTRAS=1, so
there a missing one is an installation bug that must fail, not a skip that hides the golden comparison.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def need(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if os.environ.get("PR_RLHF_ALL_EXTRAS") == "1":
            pytest.fail(f"{module} must be importable here (`make` installs it): {exc}", pytrace=False)
        pytest.skip(f"{module} is not installed ({exc})", allow_module_level=True)
