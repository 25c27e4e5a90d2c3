"""One recipe override (``key=value``) written from a Python value, for the code that places a command's outputs
(the CLI's ``--out``, the quickstart's stage folders) through the same ``--set`` path a user types."""
from __future__ import annotations

import json
import math
from pathlib import PurePath
from typing import Any

import yaml


def override(key: str, value: Any) -> str:
    """``key=value`` as an override that reads back as ``value`` itself: a string is double-quoted by YAML's own
    emitter, so that a folder named ``2024``, ``true`` or ``a: b #c`` stays a string and every character (one
    outside the BMP, a lone surrogate from an undecodable file name) survives; one line however long."""
    if isinstance(value, (str, PurePath)):
        quoted = yaml.safe_dump(str(value), default_style='"', allow_unicode=True, width=math.inf)
        return f"{key}={quoted.rstrip()}"
    if isinstance(value, (bool, int, float)):
        return f"{key}={json.dumps(value)}"
    raise TypeError(f"override {key}: a {type(value).__name__} is no recipe value")
