"""Copy a trained P-GenRM stage into the repository as the quickstart's shipped checkpoint, with a manifest that
records where it came from and the sha256 of every file (tests/unit/test_shipped_genrm.py checks them).

    python tools/ship_genrm.py runs/pgenrm/curriculum models/pgenrm_tiny \\
        --recipe recipes/pgenrm_pipeline.yaml --command "pr-rlhf pgenrm recipes/pgenrm_pipeline.yaml"

The stage directory must hold ``model/`` and ``result.json`` (a finished `pr-rlhf pgenrm` stage). The shipped
folder gets the model files, ``eval.json`` (the stage's seen / cold-start summaries, which Best-of-N recipes read
as the model's benchmark accuracy: ``models/pgenrm_tiny/eval.json:seen``) and ``MANIFEST.json``.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script from anywhere
# one file hash for shard manifests and the shipped checkpoint's manifest
from pr_rlhf.shards import sha256_file as sha256


def ship(stage_dir: Path, dest: Path, recipe: str, command: str, seed: int) -> dict:
    result = json.loads((stage_dir / "result.json").read_text())
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(stage_dir / "model", dest)
    summaries = {group: {"summary": result[group]["summary"]} for group in ("seen", "cold") if group in result}
    (dest / "eval.json").write_text(json.dumps(summaries, indent=1) + "\n")
    manifest = {"stage": result.get("stage", stage_dir.name), "recipe": recipe, "seed": seed, "command": command,
                "accuracy": {g: round(s["summary"]["accuracy"], 4) for g, s in summaries.items()},
                "files": {p.name: sha256(p) for p in sorted(dest.iterdir()) if p.is_file()}}
    (dest / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage_dir", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--recipe", default="recipes/pgenrm_pipeline.yaml")
    parser.add_argument("--command", default="pr-rlhf pgenrm recipes/pgenrm_pipeline.yaml")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    manifest = ship(args.stage_dir, args.dest, args.recipe, args.command, args.seed)
    print(json.dumps({k: v for k, v in manifest.items() if k != "files"}, indent=1))


if __name__ == "__main__":
    main()
