"""`pr-rlhf rl-sweep`: the recipe's RL run once per reward arm on one Ray, then the sweep's report
(:mod:`pr_rlhf.rl.sweep`) and its benchmark-validity table (:mod:`pr_rlhf.bon.correlation`). An arm whose run
finished is not trained again (its last checkpoint is complete); a killed arm resumes from its checkpoint."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from pr_rlhf.configs.recipe import Recipe


def arm_recipe(recipe: Recipe, name: str) -> Recipe:
    """The recipe with the arm's reward and its own run folder (``<rl_sweep.out>/<arm>``); the arms share one warm
    start (``<rl_sweep.out>/warm_start`` unless the recipe names another cache)."""
    sweep, train = recipe.rl_sweep, recipe.train
    cache = train.warm_start_cache or str(Path(sweep.out) / "warm_start")
    return recipe.model_copy(update={
        "name": f"{recipe.name}/{name}", "reward": sweep.arms[name],
        "train": train.model_copy(update={"out": str(Path(sweep.out) / name), "warm_start_cache": cache})})


def run_rl_sweep(recipe: Recipe, address: str | None = None, *, on_step: Callable[[str, dict], None] | None = None,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    from pr_rlhf.bon.correlation import correlation_report, write_correlation_report
    from pr_rlhf.eval.benchmark import benchmark_accuracies
    from pr_rlhf.report_files import write_json
    from pr_rlhf.rl.sweep import sweep_rows, write_sweep_report
    from workers.controller import RLController, cpus_needed, in_shards_world
    from workers.ray_utils import check_resources, start_driver

    sweep, train = recipe.rl_sweep, recipe.train
    if sweep is None or train is None:
        raise ValueError("rl-sweep needs the recipe's train: and rl_sweep: sections")
    if train.downstream is None:
        raise ValueError("rl_sweep compares the arms on one judge: set train.downstream (e.g. {kind: gold})")
    recipes = {name: arm_recipe(recipe, name) for name in sweep.arms}
    start_driver(address, math.ceil(max(cpus_needed(r) for r in recipes.values())), shards=train.data.shards,
                 world=train.data.world, log=log)
    check_resources(recipe, "rl-sweep", log=log)
    for name, arm in recipes.items():
        log(f"arm {name}: reward {arm.reward.kind} -> {arm.train.out}")
        RLController(arm, on_step=(lambda m, n=name: on_step(n, m)) if on_step else None).run()
    out = Path(sweep.out)
    judges = {name: in_shards_world(cfg, train.data.shards) for name, cfg in sweep.arms.items()}
    bench = benchmark_accuracies(judges, sweep.benchmark_accuracy, sweep.benchmark_users)
    rows = sweep_rows(out, list(sweep.arms), sweep.baseline, bench, seed=recipe.seed)
    downstream = {f"{train.algorithm}_downstream": {n: r["downstream"] for n, r in rows.items()}}
    validity = correlation_report([], downstream, benchmark=bench)
    if validity.agreements:
        write_correlation_report(validity, out, title=f"Benchmark validity under {train.algorithm.upper()} "
                                                     f"({len(validity.agreements[0].reward_models)} rewards)")
    write_json(out / "downstream.json", downstream)   # the format of `pr-rlhf report correlation --extra`
    files = write_sweep_report(out, rows, sweep.baseline, f"{recipe.name}: {train.algorithm.upper()} per reward",
                               extra={"validity": validity.as_dict()})
    return {"rows": rows, "validity": validity, "files": files}
