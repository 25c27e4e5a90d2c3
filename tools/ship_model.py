"""Copy a trained model into the repository as one the quickstart ships, with a manifest that records where it
came from and the sha256 of every file (tests/unit/test_shipped_models.py checks them).

    python tools/ship_model.py genrm runs/pgenrm/curriculum models/pgenrm_tiny \\
        --recipe recipes/pgenrm_pipeline.yaml --command "pr-rlhf pgenrm recipes/pgenrm_pipeline.yaml"
    python tools/ship_model.py rm runs/rm_bt_quickstart/profile models/rm_bt_tiny_profile \\
        --recipe recipes/rm_bt_quickstart.yaml --command "pr-rlhf train-rm recipes/rm_bt_quickstart.yaml"

``genrm``: a finished `pr-rlhf pgenrm` stage (``model/`` and ``result.json`` with seen / cold-start summaries).
``rm``: a finished `pr-rlhf train-rm` mode (``model/`` and ``eval/result.json`` with the held-out summary).
``planner``: a finished planner stage of `pr-rlhf pgenrm` (``result.json`` with the trained planner's aspect
precision / recall on held-out queries).
The shipped folder gets the model files, ``eval.json`` (the summaries, which Best-of-N and RL sweep recipes read as
the model's benchmark accuracy, e.g. ``models/pgenrm_tiny/eval.json:seen``; a planner's precision and recall) and
``MANIFEST.json``.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script from anywhere
# one file hash for shard manifests and the shipped checkpoints' manifests
from pr_rlhf.shards import sha256_file as sha256


def summaries_of(kind: str, stage_dir: Path) -> dict[str, dict]:
    """group -> {"summary": ...} of the stage's held-out evaluation (a planner: its trained model's aspect
    precision / recall)."""
    if kind == "planner":
        return json.loads((stage_dir / "result.json").read_text())["planner"]["trained"]
    if kind == "genrm":
        result = json.loads((stage_dir / "result.json").read_text())
        return {group: {"summary": result[group]["summary"]} for group in ("seen", "cold") if group in result}
    result = json.loads((stage_dir / "eval" / "result.json").read_text())
    return {"heldout": {"summary": result["summary"]}}


def ship(kind: str, stage_dir: Path, dest: Path, recipe: str, command: str, seed: int) -> dict:
    summaries = summaries_of(kind, stage_dir)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(stage_dir / "model", dest, ignore=shutil.ignore_patterns("COMPLETE"))
    (dest / "eval.json").write_text(json.dumps(summaries, indent=1) + "\n")
    manifest = {"kind": kind, "stage": stage_dir.name, "recipe": recipe, "seed": seed, "command": command,
                **({"aspects": {k: round(summaries[k]["mean"], 4) for k in ("precision", "recall")}}
                   if kind == "planner" else
                   {"accuracy": {g: round(s["summary"]["accuracy"], 4) for g, s in summaries.items()}}),
                "files": {p.name: sha256(p) for p in sorted(dest.iterdir()) if p.is_file()}}
    (dest / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["genrm", "rm", "planner"])
    parser.add_argument("stage_dir", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    manifest = ship(args.kind, args.stage_dir, args.dest, args.recipe, args.command, args.seed)
    print(json.dumps({k: v for k, v in manifest.items() if k != "files"}, indent=1))


if __name__ == "__main__":
    main()
