"""P-GenRM over several worlds, as pre-registered in docs/results/pgenrm_worlds/PREREGISTRATION.md (outside CI:
about two hours of 2 cores per world and arm set).

    python research/pgenrm_worlds.py gate --seeds 3 4 5 6 7 8     # the offline headroom gate of candidate worlds
    python research/pgenrm_worlds.py plan                         # the queue: every (world, arm set) and its command
    python research/pgenrm_worlds.py run [--only main] [--worlds 2 4]   # the queue in order (finished stages kept)
    python research/pgenrm_worlds.py collect                      # per-pair outcomes -> docs/results/pgenrm_worlds/
    python research/pgenrm_worlds.py analyse                      # the pre-registered analysis -> analysis.{json,md}
    python research/pgenrm_worlds.py convert --folder docs/results/pgenrm_w2 --recipe <its recipe>   # an earlier run

Each world's runs live under runs/pgenrm_worlds/w<seed>/ (shards, the main arm set, the label-filtered one, the
scaling grid, and `rerun`: a fresh PSI for the ablations and the grid where the main set's is gone); a rerun
continues where the last one stopped, and an arm set already collected counts as done (DEVIATIONS.md). What is
committed: docs/results/pgenrm_worlds/
w<seed>/outcomes.json (every arm's verdict per pair, with user ids and the contested flag), the stages' results,
headroom, references and the commands with their wall times (runs.jsonl).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pr_rlhf.eval.worlds import OUTCOMES_FILE, Endpoint, WorldOutcomes, analyse, forest_plot, markdown, moderator  # noqa: E402

RECIPE = "recipes/pgenrm_pipeline.yaml"
RUNS_REL = Path("runs") / "pgenrm_worlds"   # the commands run from the repository root
RUNS = ROOT / RUNS_REL
RESULTS = ROOT / "docs" / "results" / "pgenrm_worlds"
DEVELOPMENT_WORLD = 0
# The pre-registered worlds: world 2 and the next seeds whose offline gate passes (see PREREGISTRATION.md).
WORLDS = (2, 3, 4, 5)
ABLATION_WORLDS = WORLDS[:2]
SCALING_WORLDS = WORLDS[:3]
COLD_START_USERS = 200
SCALING_POINTS = [[0, 0], [16, 0], [16, 8]]

# Every arm set, in the queue's order: (name, stages, extra overrides)
ARM_SETS = (
    ("main", ["psi", "cre", "curriculum", "control"], []),
    ("filtered", ["psi", "cre"], ["pgenrm.psi.label_filter=true"]),
    ("ablations", ["cre_no_pr", "cre_no_or"], []),   # from the main set's PSI, in its run directory
)
# Run directories do not outlive the machine they ran on, and a rerun of PSI is not bit-identical (its loss
# drifts from the 6th step on). Where the main set's PSI is gone, the ablations start from a fresh PSI -> CRE in
# RERUN and are compared with that CRE (the same PSI, as the pre-registered contrast means; DEVIATIONS.md), and
# the scaling grid runs on that PSI.
RERUN = "rerun"
RERUN_ABLATION_STAGES = ["psi", "cre", "cre_no_pr", "cre_no_or"]
# arm name in the analysis -> (arm set's run directory, stage); the ablation arms: ablation_arms()
ARMS = {"psi": ("main", "psi"), "cre": ("main", "cre"), "curriculum": ("main", "curriculum"),
        "control": ("main", "control"), "psi_filtered": ("filtered", "psi"), "cre_filtered": ("filtered", "cre")}
# the arms each arm set yields, for telling from the collected outcomes that a set has finished
SET_ARMS = {"main": ["psi", "cre", "curriculum", "control"], "filtered": ["psi_filtered", "cre_filtered"],
            "ablations": ["cre_no_pr", "cre_no_or"]}

ENDPOINTS = (
    Endpoint("primary: CRE - PSI (seen)", "cre", "psi"),
    Endpoint("CRE - PSI, label-filtered PSI (seen)", "cre_filtered", "psi_filtered"),
    Endpoint("curriculum - control (seen, contested)", "curriculum", "control", part="contested"),
    Endpoint("curriculum - control (seen)", "curriculum", "control"),
    Endpoint("full pipeline - PSI (seen)", "curriculum", "psi"),
    Endpoint("cold-start cost: CRE - PSI", "cre", "psi", group="cold"),
    Endpoint("cold-start cost: curriculum - CRE", "curriculum", "cre", group="cold"),
    Endpoint("cold-start cost: control - CRE", "control", "cre", group="cold"),
    Endpoint("cold-start cost: filtered CRE - filtered PSI", "cre_filtered", "psi_filtered", group="cold"),
    Endpoint("cold-start cost: full pipeline - PSI", "curriculum", "psi", group="cold"),
    # the CRE from the same PSI as its ablations: the main set's CRE, or the rerun's (DEVIATIONS.md)
    Endpoint("ablation: CRE - CRE w/o PR (seen)", "cre_ablation_ref", "cre_no_pr"),
    Endpoint("ablation: CRE - CRE w/o OR (seen)", "cre_ablation_ref", "cre_no_or"),
    Endpoint("exploratory: scaling (16, 0) - (0, 0) on PSI (seen)", "scaling_16_0", "scaling_0_0"),
    Endpoint("exploratory: scaling (16, 8) - (0, 0) on PSI (seen)", "scaling_16_8", "scaling_0_0"),
    Endpoint("exploratory: scaling (16, 8) - (0, 0) on PSI (cold)", "scaling_16_8", "scaling_0_0", group="cold"),
)
MODERATED = ENDPOINTS[2]


def world_sets(world: int) -> list[str]:
    sets = ["main", "filtered"]
    if world in ABLATION_WORLDS:
        sets.append("ablations")
    if world in SCALING_WORLDS:
        sets.append("scaling")
    return sets


def complete(world: int, run: str, stage: str) -> bool:
    return (RUNS / f"w{world}" / run / stage / "COMPLETE").is_file()


def psi_home(world: int) -> str:
    """The run directory whose PSI the ablations and the scaling grid start from."""
    return "main" if complete(world, "main", "psi") else RERUN


def ablation_arms(world: int) -> dict[str, tuple[str, str]]:
    """The ablation arms and the CRE they are compared with, from the run directory that holds them."""
    home = "main" if complete(world, "main", "cre_no_pr") else RERUN
    return {"cre_ablation_ref": (home, "cre"), "cre_no_pr": (home, "cre_no_pr"), "cre_no_or": (home, "cre_no_or"),
            **({"psi_rerun": (RERUN, "psi")} if home == RERUN else {})}


def pgenrm_command(world: int, arm_set: str) -> list[str]:
    if arm_set == RERUN:   # a fresh PSI alone, for the scaling grid
        run, stages, extra = RERUN, ["psi"], []
    else:
        run, stages, extra = next(a for a in ARM_SETS if a[0] == arm_set)
    if run == "ablations":
        run = psi_home(world)
        stages = stages if run == "main" else RERUN_ABLATION_STAGES
    cmd = [sys.executable, "-m", "pr_rlhf.cli", "pgenrm", RECIPE, "--out", str(RUNS_REL / f"w{world}" / run),
           "--set", f"seed={world}", "--set", f"pgenrm.world.seed={world}",
           "--set", f"pgenrm.world.cold_start_users={COLD_START_USERS}",
           "--set", f"pgenrm.shards={RUNS_REL / f'w{world}' / 'data'}"]
    for override in extra:
        cmd += ["--set", override]
    for stage in stages:
        cmd += ["--stage", stage]
    return cmd


def scaling_recipe(world: int) -> Path:
    """The exploratory grid on the world's PSI model: (0, 0), (16, 0), (16, 8) on seeded samples of 300 seen and
    160 cold-start pairs (the grid's cost is per pair: 16 sampled and 8 neighbour chains each)."""
    import yaml

    from pr_rlhf.configs.recipe import load_recipe

    recipe = load_recipe(ROOT / RECIPE, [f"pgenrm.world.seed={world}",
                                         f"pgenrm.world.cold_start_users={COLD_START_USERS}"])
    path = RUNS / f"w{world}" / "scaling.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"name": f"pgenrm_worlds_w{world}_scaling", "seed": world, "scaling": {
        "model": str(RUNS / f"w{world}" / psi_home(world) / "psi" / "model"),
        "shards": str(RUNS / f"w{world}" / "data"),
        "world": recipe.pgenrm.world.model_dump(mode="json"), "points": SCALING_POINTS,
        "seen_pairs": 300, "cold_pairs": 160, "out": str(RUNS / f"w{world}" / "scaling")}}))
    return path


def commands(world: int, arm_set: str) -> list[list[str]]:
    """The arm set's commands, in order (the scaling grid first trains a fresh PSI where the main one is gone)."""
    if arm_set != "scaling":
        return [pgenrm_command(world, arm_set)]
    first = [] if psi_home(world) == "main" or complete(world, RERUN, "psi") else [pgenrm_command(world, RERUN)]
    return first + [[sys.executable, "-m", "pr_rlhf.cli", "scaling",
                     os.path.relpath(scaling_recipe(world), ROOT)]]


def queue(only: str | None = None, worlds: list[int] | None = None) -> list[tuple[int, str]]:
    """Main arm sets of every world first, then the filtered ones, then ablations, then scaling (``worlds``: a
    subset, for runners side by side)."""
    order = ("main", "filtered", "ablations", "scaling")
    return [(w, s) for s in order for w in WORLDS if s in world_sets(w) and (only is None or s == only)
            and (not worlds or w in worlds)]


def collected_arms(world: int) -> set[str]:
    path = RESULTS / f"w{world}" / OUTCOMES_FILE
    return set(WorldOutcomes.load(path).arms) if path.is_file() else set()


def done(world: int, arm_set: str) -> bool:
    """Finished on disk, or already collected (the run directories may be gone; the collected outcomes stay)."""
    if arm_set == "scaling":
        return any((d / "scaling_grid_pairs.json").is_file()
                   for d in (RUNS / f"w{world}" / "scaling", RESULTS / f"w{world}"))
    if set(SET_ARMS[arm_set]) <= collected_arms(world):
        return True
    if arm_set == "ablations":
        return all(complete(world, ablation_arms(world)[arm][0], arm) for arm in SET_ARMS[arm_set])
    name, stages, _ = next(a for a in ARM_SETS if a[0] == arm_set)
    return all(complete(world, name, s) for s in stages)


def cmd_run(args: argparse.Namespace) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    for world, arm_set in queue(args.only, args.worlds):
        if done(world, arm_set):
            print(f"w{world} {arm_set}: done")
            continue
        log = RUNS / f"w{world}" / f"{arm_set}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        for cmd in commands(world, arm_set):
            print(f"w{world} {arm_set}: {' '.join(cmd)}", flush=True)
            start = time.time()
            with open(log, "a") as f:
                rc = subprocess.call(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                     env={**os.environ, "RAY_AUTH_MODE": "disabled"})
            record = {"world": world, "arm_set": arm_set, "command": " ".join(cmd[1:]), "returncode": rc,
                      "wall_s": round(time.time() - start, 1), "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
            with open(RESULTS / "runs.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            print(f"w{world} {arm_set}: rc {rc}, {record['wall_s'] / 60:.1f} min", flush=True)
            if rc != 0:
                sys.exit(f"w{world} {arm_set} failed: see {log}")
        cmd_collect(argparse.Namespace(worlds=[world]))


def world_outcomes(world: int) -> WorldOutcomes | None:
    """Every arm of the world as per-pair outcomes: what was collected before, and every arm finished on disk
    (the evaluation set and its contested flags from the first place that has them)."""
    from pr_rlhf.eval.report import correct_by_pair
    from pr_rlhf.pgenrm.report import stage_predictions

    base = RUNS / f"w{world}"
    collected = RESULTS / f"w{world}" / OUTCOMES_FILE
    contested_path = next((d / "contested.json" for d in (RESULTS / f"w{world}", base / "main", base / "filtered",
                                                          base / RERUN) if (d / "contested.json").is_file()), None)
    if contested_path is None:
        return None
    contested = json.loads(contested_path.read_text())
    arms: dict[str, tuple] = {}
    for arm, (run, stage) in {**ARMS, **ablation_arms(world)}.items():
        if complete(world, run, stage):
            result = json.loads((base / run / stage / "result.json").read_text())
            arms[arm] = tuple(correct_by_pair(stage_predictions(base / run, stage, g, result[g]["predictions"]))
                              for g in ("seen", "cold"))
    if collected.is_file():
        out = WorldOutcomes.load(collected)
    elif arms:
        users: dict[str, str] = {}
        groups: dict[str, str] = {}
        for seen, cold in arms.values():
            for group, outcomes in (("seen", seen), ("cold", cold)):
                for p in outcomes:
                    users[p], groups[p] = outcomes.user(p), group
        pairs = sorted(users)
        out = WorldOutcomes(world, pairs, [users[p] for p in pairs], [groups[p] for p in pairs],
                            [bool(contested.get(p, False)) for p in pairs])
    else:
        return None
    for arm, (seen, cold) in arms.items():
        merged = {**seen, **cold}
        out.add_arm(arm, merged, {p: outcomes.user(p) for outcomes in (seen, cold) for p in outcomes})
    if "cre_ablation_ref" not in out.arms and ({"cre_no_pr", "cre_no_or"} & set(out.arms)) and "cre" in out.arms:
        out.arms["cre_ablation_ref"] = list(out.arms["cre"])   # ablations collected from the main set's PSI
    grid = base / "scaling" / "scaling_grid_pairs.json"
    if grid.is_file():   # per-pair outcomes of each (m, n), written by the scaling grid
        for point, rows in json.loads(grid.read_text()).items():
            out.add_arm(f"scaling_{point}", {r["pair_id"]: r["correct"] for r in rows},
                        {r["pair_id"]: r["user_id"] for r in rows})
    return out


def cmd_collect(args: argparse.Namespace) -> None:
    import shutil

    for world in args.worlds or WORLDS:
        outcomes = world_outcomes(world)
        if outcomes is None:
            print(f"w{world}: nothing finished")
            continue
        dest = RESULTS / f"w{world}"
        outcomes.save(dest / OUTCOMES_FILE)
        base = RUNS / f"w{world}"
        for name in ("headroom.json", "references.json", "contested.json", "recipe.yaml"):
            # the main set's, else (where its directory is gone and nothing was collected) another set's
            src = next((base / r / name for r in ("main", "filtered", RERUN) if (base / r / name).is_file()), None)
            if src is not None and (src.parent.name == "main" or not (dest / name).is_file()):
                shutil.copy2(src, dest / name)
        for arm, (run, stage) in {**ARMS, **ablation_arms(world)}.items():
            folder = base / run / stage
            if (folder / "COMPLETE").is_file():
                shutil.copy2(folder / "result.json", dest / f"stage_{arm}.json")
                if (folder / "history.json").is_file():
                    shutil.copy2(folder / "history.json", dest / f"history_{arm}.json")
        for name in ("scaling_grid.json", "scaling_grid.md", "scaling_grid_pairs.json"):
            if (base / "scaling" / name).is_file():
                shutil.copy2(base / "scaling" / name, dest / name)
        print(f"w{world}: {sorted(outcomes.arms)} -> {dest}")


def unlearned_on_contested(world: int) -> float | None:
    """What CRE left unlearned on contested seen pairs: the best rule's accuracy there (the offline headroom
    check) minus CRE's (the moderator of the curriculum's gain)."""
    head = RESULTS / f"w{world}" / "headroom.json"
    path = RESULTS / f"w{world}" / OUTCOMES_FILE
    if not head.is_file() or not path.is_file():
        return None
    rule = json.loads(head.read_text())["groups"]["seen"]["best_rule"]["contested"]
    cre = WorldOutcomes.load(path).accuracy("cre", "seen", "contested")
    return None if cre is None else rule - cre["accuracy"]


def cmd_analyse(args: argparse.Namespace) -> None:
    worlds = [WorldOutcomes.load(RESULTS / f"w{w}" / OUTCOMES_FILE) for w in WORLDS
              if (RESULTS / f"w{w}" / OUTCOMES_FILE).is_file()]
    result = {"worlds": [w.world for w in worlds], "endpoints": analyse(worlds, ENDPOINTS)}
    unlearned = {w.world: u for w in worlds if (u := unlearned_on_contested(w.world)) is not None}
    result["moderator"] = {"endpoint": MODERATED.name, "moderator": "best rule - CRE on contested seen pairs",
                           **moderator(worlds, MODERATED, unlearned)}
    dev = ROOT / "docs" / "results" / "pgenrm" / OUTCOMES_FILE   # world 0's first pipeline run
    if dev.is_file():   # the development world, reported apart (its pairs chose the setting)
        result["development_world"] = analyse([WorldOutcomes.load(dev)], ENDPOINTS)
    (RESULTS / "analysis.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result["endpoints"], [w.world for w in worlds], "P-GenRM over worlds (pre-registered)")
    if "development_world" in result:
        text += "\n" + markdown(result["development_world"], [DEVELOPMENT_WORLD],
                                f"Development world {DEVELOPMENT_WORLD} (chose the setting; reported apart)")
    (RESULTS / "analysis.md").write_text(text)
    forest_plot(result["endpoints"], [w.world for w in worlds], RESULTS / "forest.png")
    print(text)


def cmd_convert(args: argparse.Namespace) -> None:
    """An earlier run's committed ``per_pair_correct.json`` ({stage: {group: {pair: correct}}}) as outcomes.json:
    each pair's user from the world its recipe builds (the file itself names none)."""
    import yaml

    from pr_rlhf.configs.world import WorldConfig
    from pr_rlhf.world.generator import build_world

    folder = Path(args.folder)
    world_cfg = yaml.safe_load(Path(args.recipe).read_text())
    world_cfg = (world_cfg.get("pgenrm") or world_cfg)["world"]
    world = build_world(WorldConfig.model_validate(world_cfg))
    user_of = {p.pair_id: p.user_id for p in world.pairs}
    per_pair = json.loads((folder / "per_pair_correct.json").read_text())
    contested = json.loads((folder / "contested.json").read_text())
    groups = {p: g for stage in per_pair.values() for g, pairs in stage.items() for p in pairs}
    pairs = sorted(groups)
    out = WorldOutcomes(world.config.seed, pairs, [user_of[p] for p in pairs], [groups[p] for p in pairs],
                        [bool(contested.get(p, False)) for p in pairs],
                        meta={"source": f"{folder.name}/per_pair_correct.json", "world": world_cfg})
    for stage, by_group in per_pair.items():
        merged = {p: c for g in by_group.values() for p, c in g.items()}
        out.add_arm(stage, merged, {p: user_of[p] for p in merged})
    print(out.save(folder / OUTCOMES_FILE))


def cmd_gate(args: argparse.Namespace) -> None:
    """The offline headroom gate of each candidate world (seen users: the cold-start count does not enter)."""
    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.pgenrm.headroom import pipeline_headroom

    for seed in args.seeds:
        recipe = load_recipe(ROOT / RECIPE, [f"pgenrm.world.seed={seed}", f"seed={seed}",
                                             f"pgenrm.world.cold_start_users={COLD_START_USERS}"])
        report = pipeline_headroom(recipe.pgenrm, recipe.seed)
        g = report["gate"]
        print(json.dumps({"seed": seed, "go": g["go"], "rule_minus_teacher": round(g["rule_minus_teacher"], 4),
                          "rule_minus_teacher_contested": round(g["rule_minus_teacher_contested"], 4),
                          "contested_share": round(g["contested_share"], 4)}), flush=True)


def cmd_plan(args: argparse.Namespace) -> None:
    for world, arm_set in queue(args.only, args.worlds):
        status = "done" if done(world, arm_set) else "todo"
        for cmd in commands(world, arm_set):
            print(f"w{world} {arm_set} {status}: {' '.join(cmd[1:])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    gate = sub.add_parser("gate")
    gate.add_argument("--seeds", type=int, nargs="+", required=True)
    for name in ("plan", "run"):
        p = sub.add_parser(name)
        p.add_argument("--only", choices=("main", "filtered", "ablations", "scaling"))
        p.add_argument("--worlds", type=int, nargs="*", help="a subset of the worlds (runners side by side)")
    collect = sub.add_parser("collect")
    collect.add_argument("--worlds", type=int, nargs="*")
    sub.add_parser("analyse")
    convert = sub.add_parser("convert")
    convert.add_argument("--folder", required=True)
    convert.add_argument("--recipe", required=True, help="the run's recipe (its pgenrm.world builds the users)")
    args = parser.parse_args()
    {"gate": cmd_gate, "plan": cmd_plan, "run": cmd_run, "collect": cmd_collect, "analyse": cmd_analyse,
     "convert": cmd_convert}[args.cmd](args)


if __name__ == "__main__":
    main()
