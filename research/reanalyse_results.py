"""Recompute every CI under docs/results/ that its committed per-pair or per-prompt outcomes allow, resampling users
(docs/protocols.md section 3), and write the regenerated reports beside them. Outside CI; seconds.

    python research/reanalyse_results.py            # all of them
    python research/reanalyse_results.py rl pgenrm  # some
    python research/reanalyse_results.py quickstart bon   # after `make quickstart`, `make quickstart-full`, the BoN run

- RL sweeps (personalized_vs_global, its PPO twin, rl_validity): each arm's committed history (held-out downstream
  per prompt, with each prompt's user) -> sweep.json / sweep.md / sweep.png regenerated in place, the agreement
  groups from the world the recipe builds.
- P-GenRM runs (pgenrm = world 0, the development world; pgenrm_w2): outcomes.json (per pair, with its user) ->
  reanalysis.json / reanalysis.md: each stage's accuracy and the paired gains the results pages (docs/studies/)
  quote, all pairs and contested ones. Arms whose per-pair verdicts were never committed (CRE-B/C/D, filtered
  PSI, CRE-D's curriculum and control) are listed as not re-analysable.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "docs" / "results"

# (folder, arm -> committed history file, the recipe whose world the users come from, title); the baseline arm
# is the one the committed sweep.json names
RL_SWEEPS = (
    ("personalized_vs_global", "histories/{arm}.json", "recipe_as_run.yaml",
     "personalized_vs_global: GRPO per reward"),
    ("personalized_vs_global/ppo", "{arm}.history.json", "../recipe_as_run.yaml",
     "personalized_vs_global: PPO per reward"),
    ("rl_validity", "arms/{arm}.history.json", "recipe.yaml", "rl_validity: GRPO per reward"),
)
# further paired comparisons the results pages (docs/studies/) quote, (new arm, old arm), per sweep folder
RL_EXTRA = {"rl_validity": (("pgenrm", "rm_profile"), ("rm_plan", "rm_profile"))}
PGENRM_RUNS = {
    "pgenrm": ("recipes/pgenrm_pipeline.yaml",
               ["cre_b", "cre_c", "cre_d", "psi_filtered", "cre_d_curriculum", "cre_d_control"]),
    "pgenrm_w2": ("docs/results/pgenrm_w2/recipe_effective.yaml", []),
}
# (new, old) comparisons of the P-GenRM runs, per group, on all and on contested pairs
PGENRM_COMPARISONS = (("psi", "base"), ("cre", "psi"), ("control", "psi"), ("curriculum", "psi"),
                      ("curriculum", "control"), ("curriculum", "cre"), ("control", "cre"))


def reanalyse_rl() -> None:
    import yaml

    from pr_rlhf.configs.world import WorldConfig
    from pr_rlhf.rl.compare import compare_runs
    from pr_rlhf.rl.sweep import arm_row, write_sweep_report
    from pr_rlhf.world import build_world
    from pr_rlhf.world.reference import population_agreement

    for folder, pattern, recipe, title in RL_SWEEPS:
        base = RESULTS / folder
        old = json.loads((base / "sweep.json").read_text())
        baseline = old["baseline"]
        arms = list(old["arms"])
        world_cfg = yaml.safe_load((base / recipe).read_text())["world"]
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            for arm in arms:
                (out / arm).mkdir()
                shutil.copy2(base / pattern.format(arm=arm), out / arm / "history.json")
            users = json.loads((out / baseline / "history.json").read_text())["heldout_users"]
            cosine = population_agreement(build_world(WorldConfig.model_validate(world_cfg)), sorted(set(users)))
            groups = {"agree": [i for i, u in enumerate(users) if cosine[u] > 0],
                      "disagree": [i for i, u in enumerate(users) if cosine[u] <= 0]}
            rows = {arm: arm_row(out / arm, out / baseline, groups) for arm in arms}
            extra_pairs = {f"{a} - {b}": compare_runs(out / a, out / b, groups=groups)
                           for a, b in RL_EXTRA.get(folder, ())}
        for arm, row in rows.items():
            row["run"] = old["arms"][arm]["run"]
            row["benchmark_accuracy"] = old["arms"][arm].get("benchmark_accuracy")
            if "vs_baseline" in row:
                row["vs_baseline"]["new"] = old["arms"][arm]["run"]
                row["vs_baseline"]["old"] = old["arms"][baseline]["run"]
        extra = {k: v for k, v in old.items() if k not in ("baseline", "arms", "comparisons")}
        extra["ci_unit"] = "user"
        if extra_pairs:
            extra["comparisons"] = extra_pairs
        files = write_sweep_report(base, rows, baseline, title, extra)
        print(f"{folder}: {files.markdown.relative_to(ROOT)}")


def reanalyse_pgenrm() -> None:
    from pr_rlhf.eval.report import PairOutcomes, paired_gain
    from pr_rlhf.eval.worlds import WorldOutcomes
    from pr_rlhf.stats import mean_ci

    for folder, (recipe, lost) in PGENRM_RUNS.items():
        base = RESULTS / folder
        if not (base / "outcomes.json").is_file():
            import subprocess

            subprocess.run([sys.executable, str(ROOT / "research" / "pgenrm_worlds.py"), "convert",
                            "--folder", str(base), "--recipe", str(ROOT / recipe)], check=True)
        w = WorldOutcomes.load(base / "outcomes.json")
        doc: dict = {"source": "outcomes.json", "ci_unit": "user", "arms": {}, "comparisons": [],
                     "not_reanalysable": {arm: "its per-pair verdicts were not committed and its run directory is "
                                               "gone" for arm in lost}}

        def outcomes(arm: str, group: str, part: str = "all") -> PairOutcomes:
            idx = w.select(group, part, arm)
            return PairOutcomes({w.pairs[i]: w.arms[arm][i] for i in idx}, {w.pairs[i]: w.users[i] for i in idx})

        for arm in w.arms:
            doc["arms"][arm] = {}
            for group in ("seen", "cold"):
                o = outcomes(arm, group)
                values = [o[p] for p in o]
                low, high = mean_ci(values, seed=0, clusters=[o.user(p) for p in o])
                doc["arms"][arm][group] = {"accuracy": sum(values) / len(values), "ci_low": low, "ci_high": high,
                                           "pairs": len(values), "users": len(set(o.users.values()))}
        for new, old in PGENRM_COMPARISONS:
            if new in w.arms and old in w.arms:
                row = {"new": new, "old": old}
                for group in ("seen", "cold"):
                    row[group] = {part: paired_gain(outcomes(new, group, part), outcomes(old, group, part))
                                  for part in ("all", "contested", "rest")}
                doc["comparisons"].append(row)
        (base / "reanalysis.json").write_text(json.dumps(doc, indent=1) + "\n")
        (base / "reanalysis.md").write_text(pgenrm_markdown(folder, doc))
        print(f"{folder}: reanalysis.md")


def reanalyse_bt() -> None:
    """The shipped BT RMs and planner (models/) re-evaluated on their report's 1,500 held-out pairs (the run that
    trained them kept no per-pair verdicts): `pr-rlhf train-rm recipes/rm_bt_quickstart.yaml --set
    rm.out=runs/rm_bt_reeval --set rm.shards=runs/rm_bt_reeval/data --set rm.planner.model=models/planner_tiny`
    with the shipped models placed as finished (`<out>/<mode>/model`) evaluates without training; this copies its
    report and per-pair predictions, adds plan - profile, and re-runs the planner's evaluation."""
    import numpy as np
    import pyarrow.parquet as pq

    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.eval.report import correct_by_pair, paired_gain
    from pr_rlhf.pgenrm.planner_data import planner_examples
    from workers.pgenrm import _run_planner_eval

    run, dest = ROOT / "runs" / "rm_bt_reeval", RESULTS / "rm_bt_quickstart"
    for name in ("report.md", "report.json", "report.png"):
        shutil.copy2(run / name, dest / name)
    outcomes = {}
    for mode in ("none", "profile", "plan"):
        table = pq.read_table(run / mode / "eval" / "predictions.parquet")
        pq.write_table(table, dest / f"predictions_{mode}.parquet", compression="zstd")
        outcomes[mode] = correct_by_pair(dest / f"predictions_{mode}.parquet")
    doc = {"source": "predictions_<mode>.parquet (the shipped models, re-evaluated)", "ci_unit": "user",
           "plan_vs_profile": paired_gain(outcomes["plan"], outcomes["profile"])}
    recipe = load_recipe(ROOT / "recipes" / "rm_bt_quickstart.yaml", [f"pgenrm.shards={run / 'data'}"])
    cfg = recipe.pgenrm.planner
    held = planner_examples(str(run / "data"), ("val", "test"), cfg.top_k)
    keep = np.sort(np.random.default_rng(recipe.seed).permutation(len(held))[:cfg.eval_queries])
    held = [held[i] for i in keep]
    planner = _run_planner_eval(str(ROOT / "models" / "planner_tiny"), [e.input for e in held],
                                [e.aspects for e in held], cfg.top_k, cfg.max_tokens, 2, recipe.seed)
    users = [q["user_id"] for q in planner["per_query"]]
    planner["users"] = len(set(users))
    doc["planner"] = planner
    (dest / "reanalysis.json").write_text(json.dumps(doc, indent=1) + "\n")
    p = planner
    print(f"rm_bt_quickstart: plan - profile {_ci(doc['plan_vs_profile'])}; planner precision "
          f"{p['precision']['mean']:.3f} [{p['precision']['ci_low']:.3f}, {p['precision']['ci_high']:.3f}], recall "
          f"{p['recall']['mean']:.3f} [{p['recall']['ci_low']:.3f}, {p['recall']['ci_high']:.3f}] ({len(users)} "
          f"queries of {p['users']} users)")


def reanalyse_rl_tiny() -> None:
    """`pr-rlhf train recipes/{grpo,ppo}_tiny.yaml --out runs/rl_tiny/<name> --set
    train.data.shards=runs/rl_tiny/shards`: each run's history (held-out reward per prompt, each prompt's user) and
    the rise from step 0 to the last evaluation, resampling users."""
    from workers.controller import heldout_rise

    dest = RESULTS / "rl_tiny"
    dest.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name in ("grpo_tiny", "ppo_tiny"):
        history = json.loads((ROOT / "runs" / "rl_tiny" / name / "history.json").read_text())
        shutil.copy2(ROOT / "runs" / "rl_tiny" / name / "history.json", dest / f"{name}.history.json")
        evals = history["evals"]
        summary[name] = {"steps": [e["step"] for e in evals],
                         "heldout_reward_mean": [e["eval/heldout_reward_mean"] for e in evals],
                         "rise": heldout_rise(evals[0], evals[-1], history["heldout_users"])}
    (dest / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))


def reanalyse_world() -> None:
    """The default world's (seed 0) reference accuracies with CIs resampling users, as a shard manifest reports
    them (``reference_summary``)."""
    from pr_rlhf.world import WorldConfig, build_world
    from pr_rlhf.world.reference import reference_summary

    dest = RESULTS / "world"
    dest.mkdir(parents=True, exist_ok=True)
    summary = {"world": WorldConfig().model_dump(mode="json"), **reference_summary(build_world(WorldConfig()))}
    (dest / "references_default.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "world"})[:600])


def _ci(g: dict) -> str:
    return f"{100 * g['gain']:+.1f} [{100 * g['ci_low']:+.1f}, {100 * g['ci_high']:+.1f}]"


def pgenrm_markdown(folder: str, doc: dict) -> str:
    lines = [f"## {folder}: re-analysed resampling users", "",
             "From the committed per-pair verdicts (`outcomes.json`, each pair with its user). Accuracy % [95% CI "
             "resampling users]; gains in points, paired over the same pairs, CI resampling users.", "",
             "| stage | seen | cold-start |", "|---|---|---|"]
    for arm, groups in doc["arms"].items():
        cells = [f"{100 * g['accuracy']:.1f} [{100 * g['ci_low']:.1f}, {100 * g['ci_high']:.1f}] "
                 f"({g['pairs']} pairs, {g['users']} users)" for g in (groups["seen"], groups["cold"])]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += ["", "| comparison | seen, all | seen, contested | seen, rest | cold-start |", "|---|---|---|---|---|"]
    for row in doc["comparisons"]:
        seen, cold = row["seen"], row["cold"]
        lines.append(f"| {row['new']} - {row['old']} | {_ci(seen['all'])} ({seen['all']['changed']} changed in "
                     f"{seen['all']['changed_users']} users) | {_ci(seen['contested'])} | {_ci(seen['rest'])} | "
                     f"{_ci(cold['all'])} |")
    if doc["not_reanalysable"]:
        lines += ["", "Not re-analysable (per-pair verdicts never committed, run directories gone): "
                  + ", ".join(f"`{a}`" for a in doc["not_reanalysable"]) + "."]
    return "\n".join(lines) + "\n"


def _keep(run: Path, dest: Path, names: list[str]) -> None:
    """Copy a run's small result files (relative paths; globs allowed) into dest, same layout."""
    for pattern in names:
        for src in sorted(run.glob(pattern)):
            out = dest / src.relative_to(run)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)


QUICKSTART_FILES = ["summary.json", "recipe.yaml", "eval/metrics.json", "eval/models.json", "eval/models.md",
                    "eval/predictions.parquet", "eval/models/*/metrics.json", "eval/models/*/predictions.parquet",
                    "pgenrm/*/result.json", "pgenrm/*/eval_*/predictions.parquet", "pgenrm/ablation.json",
                    "pgenrm/headroom.json", "rl/history.json", "scaling/scaling_grid.json",
                    "scaling/scaling_grid_pairs.json", "bon/bon.json", "bon/correlation.json", "bon/samples.parquet"]


def reanalyse_quickstart() -> None:
    """`make quickstart` (runs/quickstart) and `make quickstart-full` (runs/quickstart_full) on an otherwise idle
    machine: each run's summary (minutes, peak RSS of the process tree), every evaluated model's per-pair
    predictions with user ids and its metrics (CIs resampling users), the brief PSI's and the untrained base's
    per-pair predictions, the GRPO stage's per-prompt history, and the full tour's scaling grid and Best-of-N
    samples. `run.json` beside them (written by hand at the run) says the command, commit and CPU."""
    for name in ("quickstart", "quickstart_full"):
        run = ROOT / "runs" / name
        if not (run / "summary.json").is_file():
            print(f"{name}: no finished run in {run}")
            continue
        if (run / "bon" / "pool").is_dir():
            bon_samples(run / "bon")
        _keep(run, RESULTS / name, QUICKSTART_FILES)
        print(f"{name}: {RESULTS / name}")


def bon_samples(run: Path) -> Path:
    """One row per pooled sample: prompt, user, subset, sample index, response, the downstream quality and every
    reward model's score (``score/<rm>``): what the best-of-k curves are computed from, re-analysable alone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from workers.bon import DOWNSTREAM, read_parts

    # the sweep's own order (parts in order, stably by sample), so the curves' bootstrap sees the same sequence
    rows = sorted(read_parts(run / "pool"), key=lambda r: int(r["sample"]))
    keep = ("prompt_id", "user_id", "subset", "question", "sample", "text")
    out = [{k: r.get(k) for k in keep} for r in rows]
    for folder in sorted((run / "scores").iterdir()):
        scores = {(r["prompt_id"], int(r["sample"])): r["score"] for r in read_parts(folder)}
        column = "quality" if folder.name == DOWNSTREAM else f"score/{folder.name}"
        for r, o in zip(rows, out):
            o[column] = scores.get((r["prompt_id"], int(r["sample"])))
    path = run / "samples.parquet"
    pq.write_table(pa.Table.from_pylist(out), path, compression="zstd")
    return path


def reanalyse_bon() -> None:
    """The Best-of-N sweep of the shipped P-GenRM beside the world's reference predictors (`pr-rlhf bon
    docs/results/bon/recipe.yaml`, runs/bon_shipped): its per-sample scores (samples.parquet), the curves recomputed
    from them alone (every CI resampling users) and checked against the sweep's own bon.json, the validity report."""
    import pyarrow.parquet as pq

    from pr_rlhf.bon.curves import curve, scored_pool

    run, dest = ROOT / "runs" / "bon_shipped", RESULTS / "bon"
    bon_samples(run)
    _keep(run, dest, ["samples.parquet", "bon.json", "bon.md", "correlation.json", "correlation.md"])
    rows = pq.read_table(dest / "samples.parquet").to_pylist()
    report = json.loads((dest / "bon.json").read_text())
    rms = [c.split("/", 1)[1] for c in rows[0] if c.startswith("score/")]
    by_prompt: dict[str, list[dict]] = {}
    for r in rows:
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    for rm in rms:
        pools = []
        for pid, samples in by_prompt.items():
            kept = [s for s in samples if s["quality"] is not None]
            if kept:   # as the sweep: a prompt whose samples the downstream judge never scored is left out
                pools.append(scored_pool(pid, kept[0]["subset"], kept[0]["user_id"],
                                         [s[f"score/{rm}"] for s in kept], [s["quality"] for s in kept]))
        points = {(p.subset, p.k): p for p in curve(pools, seed=0)}
        for old in report["curves"][rm]:
            new = points[(old["subset"], old["k"])]
            if abs(new.mean - old["mean"]) > 1e-9 or abs(new.ci_low - old["ci_low"]) > 1e-9:
                sys.exit(f"bon: {rm} at {old['subset']}, k={old['k']}: recomputed {new.mean}, {new.ci_low} vs "
                         f"bon.json {old['mean']}, {old['ci_low']}")
    doc = {"prompts": len(by_prompt), "users": len({r["user_id"] for r in rows}), "samples": len(rows),
           "reward_models": rms, "ci_unit": "user", "curves_recomputed_equal_bon_json": True}
    (dest / "reanalysis.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"bon: {doc['prompts']} prompts of {doc['users']} users, {len(rms)} reward models; curves recomputed "
          "from samples.parquet equal bon.json")


def main() -> None:
    jobs = {"rl": reanalyse_rl, "pgenrm": reanalyse_pgenrm, "bt": reanalyse_bt, "rl_tiny": reanalyse_rl_tiny,
            "world": reanalyse_world, "quickstart": reanalyse_quickstart, "bon": reanalyse_bon}
    parser = argparse.ArgumentParser(description="Recompute the committed results' analyses (module docstring).")
    parser.add_argument("jobs", nargs="*", metavar="JOB", help=f"any of {', '.join(jobs)} (default: all)")
    names = parser.parse_args().jobs or list(jobs)
    if unknown := sorted(set(names) - set(jobs)):
        parser.error(f"unknown job(s) {', '.join(unknown)}; choose from {', '.join(jobs)}")
    for name in names:
        jobs[name]()


if __name__ == "__main__":
    main()
