"""`pr-rlhf quickstart`: the main job on the embedded default (local Ray, CPU, no network), stage after stage.

The stages are the CLI's own subcommands (data build, eval, pgenrm, scaling, bon, train), each run and shown by
the callable the CLI hands in (:class:`StageRunners`), so the quickstart prints exactly what those commands print.
This module places every stage's output under one folder, sequences the stages the recipe has, keeps one mlflow
store for all of them (plus the quickstart's own summary run) and measures time and peak memory.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pr_rlhf.configs.override import override
from pr_rlhf.configs.recipe import Recipe, dump_recipe, load_recipe
from pr_rlhf.peak_memory import PeakRSS
from pr_rlhf.tracking import DB_FILE, ENV_URI, make_tracker

DEFAULT_RECIPE = Path("recipes/quickstart.yaml")


def quickstart_recipe(recipe: Path, out: Path, overrides: list[str]) -> Recipe:
    """The recipe (the embedded default when ``recipe`` does not exist) with every stage it has placed under
    ``out`` and, unless one is configured, one mlflow store for all of them; ``overrides`` apply last.
    Raises :class:`~pr_rlhf.configs.recipe.RecipeError`."""
    placed = [override("data.out", out / "data"), override("eval.shards", out / "data"),
              override("eval.out", out / "eval")]
    source = recipe if recipe.exists() else None
    resolved = load_recipe(source, placed + overrides)
    # place every later stage that the recipe has under out (placing one it lacks would conjure a default)
    world_shards = out / "data"   # the shipped models' world: evaluation, scaling and Best-of-N
    later = {"train": [override("train.out", out / "rl"), override("train.data.shards", out / "rl_world")],
             "pgenrm": [override("pgenrm.out", out / "pgenrm"), override("pgenrm.shards", out / "pgenrm" / "data")],
             "scaling": [override("scaling.out", out / "scaling"), override("scaling.shards", world_shards)],
             "bon": [override("bon.out", out / "bon"), override("bon.shards", world_shards)]}
    placed += [o for section, opts in later.items() if getattr(resolved, section) is not None for o in opts]
    if resolved.tracking.mlflow_uri is None and not os.environ.get(ENV_URI):
        # one store for every stage's run: `mlflow ui --backend-store-uri sqlite:///<out>/mlflow.db` shows them all
        placed.append(override("tracking.mlflow_uri", f"sqlite:///{(out / DB_FILE).resolve()}"))
    return load_recipe(source, placed + overrides)


@dataclass
class StageRunners:
    """Runs and shows one stage each (the CLI's subcommands), and draws the rule that opens a stage."""

    rule: Callable[[str], None]
    data: Callable[[Recipe], Any]      # -> data_pipelines.build.BuildReport
    eval: Callable[[Recipe], Any]      # -> pr_rlhf.eval.runner's result (run_dir)
    pgenrm: Callable[[Recipe], dict]   # -> {stage: result}
    scaling: Callable[[Recipe], dict]  # -> workers.scaling.run_scaling's result
    bon: Callable[[Recipe], dict]      # -> the sweep's report
    train: Callable[[Recipe], Any]     # -> (workers.controller.RLResult, paired held-out rise)


@dataclass
class StageTime:
    stage: str
    result: str
    seconds: float


@dataclass
class QuickstartSummary:
    stages: list[StageTime] = field(default_factory=list)
    minutes: float = 0.0
    peak_rss_gb: float = 0.0

    def as_dict(self) -> dict:
        return {"minutes": self.minutes, "peak_rss_gb": self.peak_rss_gb,
                "stages": [{"stage": s.stage, "result": s.result, "minutes": s.seconds / 60} for s in self.stages]}


def accuracy_with_misses(summary: dict) -> str:
    """'52.5% (3 ties, 1 unparsed of 40)': an accuracy that says how much of the rest is ties and parse failures."""
    return (f"{100 * summary['accuracy']:.1f}% ({summary.get('ties', 0)} ties, {summary.get('failures', 0)} unparsed"
            f" of {summary.get('n', 0)})")


def run_quickstart(recipe: Recipe, out: Path, run: StageRunners) -> QuickstartSummary:
    """Every stage the recipe has, in order; writes ``<out>/recipe.yaml`` and ``<out>/summary.json`` and logs the
    summary to the quickstart's own mlflow run."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.yaml").write_text(dump_recipe(recipe))
    summary = QuickstartSummary()
    # the quickstart's own run opens first, so a new experiment keeps its artifacts under <out>/mlartifacts
    tracker = make_tracker(recipe.tracking, out, f"{recipe.name}/summary", tags={"stage": "quickstart"})
    with tracker:
        tracker.log_params(recipe.model_dump(mode="json"))
        with PeakRSS() as memory:
            start = time.perf_counter()

            def stage(title: str, name: str, body: Callable[[], str]) -> None:
                run.rule(f"{len(summary.stages) + 1}. {title}")
                t = time.perf_counter()
                result = body()
                summary.stages.append(StageTime(name, result, time.perf_counter() - t))

            run.rule(f"[bold]pr-rlhf quickstart[/] -> {out}")
            stage("data: the synthetic persona world -> Arrow shards", "data",
                  lambda: f"{run.data(recipe).out_dir}")
            stage("reward models on held-out pairs: the untrained floor (~50% or parse failures), then the shipped "
                  "trained models", "evaluation", lambda: _eval_result(run.eval(recipe)))
            if recipe.pgenrm is not None:
                stage("P-GenRM: PSI from scratch on a small world, briefly (the RL stages are `pr-rlhf pgenrm`'s)",
                      "P-GenRM PSI (brief)", lambda: _pgenrm_result(recipe, run))
            if recipe.scaling is not None:
                stage(f"test-time scaling of the shipped P-GenRM ({recipe.scaling.model})", "test-time scaling",
                      lambda: ", ".join(f"{r.group} ({r.m},{r.n}) {100 * r.accuracy:.1f}"
                                        for r in run.scaling(recipe)["rows"]))
            if recipe.bon is not None:
                stage(f"Best-of-N: {recipe.bon.n} samples per prompt, best-of-k per reward model", "Best-of-N",
                      lambda: _bon_result(run.bon(recipe)))
            if recipe.train is not None:
                stage("GRPO with personalized rewards (tiny policy; held-out = cold-start users)", "GRPO",
                      lambda: _rl_result(run.train(recipe)[0]))
            summary.minutes = (time.perf_counter() - start) / 60
        summary.peak_rss_gb = memory.peak_gb
        (out / "summary.json").write_text(json.dumps(summary.as_dict(), indent=1))
        tracker.log_metrics({"quickstart/minutes": summary.minutes, "quickstart/peak_rss_gb": summary.peak_rss_gb,
                             # 'P-GenRM PSI (brief)' -> quickstart/minutes/p-genrm psi (the tracker sanitizes)
                             **{f"quickstart/minutes/{s.stage.split(' (')[0].lower()}": s.seconds / 60
                                for s in summary.stages}})
        tracker.log_artifact(out / "summary.json")
    return summary


def _pgenrm_result(recipe: Recipe, run: StageRunners) -> str:
    """The last stage's accuracy with its CI (seen and cold-start users), beside the first stage's on the same pairs
    as coin flips for what it could not decide (an untrained GenRM parses nothing: 0%, 50% as coin flips)."""
    from pr_rlhf.pgenrm.report import collect

    cfg = recipe.pgenrm
    last = run.pgenrm(recipe)[cfg.stages[-1]]
    rows = {r["stage"]: r for r in collect(cfg.out, recipe.seed)}
    first = rows.get(cfg.stages[0]) if len(cfg.stages) > 1 else None
    seen = last["seen"]["summary"]
    before = "" if first is None else (f"; {cfg.stages[0]} on the same pairs "
                                       f"{100 * first['seen']['coin_flip_accuracy']:.1f}% with unparsed and ties "
                                       f"as coin flips ({first['seen']['failures']} unparsed)")
    return (f"{cfg.stages[-1]} after {cfg.psi.steps} PSI steps: seen {accuracy_with_misses(seen)} "
            f"[{100 * seen['ci_low']:.1f}, {100 * seen['ci_high']:.1f}]{before}, cold "
            f"{accuracy_with_misses(last['cold']['summary'])}")


def _eval_result(result: Any) -> str:
    """Each trained model's cells with the paired gain over the untrained floor (unparsed verdicts and ties as coin
    flips on both sides: pr_rlhf.eval.models), else the report's path."""
    from pr_rlhf.eval.report import fmt_paired_gain

    trained = [r for r in result.model_rows if "vs_floor" in r]
    if not trained:
        return f"{result.run_dir}/report.md"
    floor = result.model_rows[0]["model"]
    return "; ".join(f"{r['model']} {r['cell']} {100 * r['summary']['accuracy']:.1f}% "
                     f"({fmt_paired_gain(r['vs_floor'])} over {floor})" for r in trained) + \
        f" (gains in points over {floor}, whose unparsed verdicts count as coin flips)"


def _bon_result(report: dict) -> str:
    validity = report.get("validity", {})
    return (f"rho {validity.get('spearman_rho', float('nan')):+.2f}, NDCG {validity.get('ndcg', float('nan')):.2f} "
            f"over {len(validity.get('reward_models', []))} RMs ({validity.get('downstream', '-')})")


def _rl_result(rl: Any) -> str:
    first, last = rl.evals[0], rl.evals[-1]
    return f"held-out reward {first['eval/heldout_reward_mean']:+.3f} -> {last['eval/heldout_reward_mean']:+.3f}"
