"""Dump the effective (validated, defaults filled) settings of every shipped recipe as one JSON file.

The restructure check: `tests/data/recipe_effective_configs.json` was written by this script before the configs
became discriminated unions; the test compares every recipe's dump today against it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pr_rlhf.configs.recipe import load_recipe  # noqa: E402


def effective_configs() -> dict[str, dict]:
    dumps = {"<defaults>": load_recipe(None).model_dump(mode="json")}
    for path in sorted((ROOT / "recipes").rglob("*.yaml")):
        dumps[str(path.relative_to(ROOT))] = load_recipe(path).model_dump(mode="json")
    return dumps


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "data" / "recipe_effective_configs.json"
    out.write_text(json.dumps(effective_configs(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")
