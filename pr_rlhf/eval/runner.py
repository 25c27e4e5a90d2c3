"""`pr-rlhf eval`: reward models on benchmark shards, in every (mode, inputs) cell, with honest accounting.

Pointwise = a scalar RM (or the judge engine rating each answer 1-10) scores chosen and rejected separately;
pairwise = a generative judge (``Result: A|B``, or P-GenRM's evaluation chain) sees both. Each runs with the user
shown as nothing, the top-k retrieved profile posts, or the planner's rubric. Outputs go to the run directory
(predictions parquet, metrics JSON, markdown table, PNG) and to mlflow.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pr_rlhf.configs.recipe import EngineConfig, EvalConfig, Recipe, dump_recipe
from pr_rlhf.eval.metrics import Prediction
from pr_rlhf.eval.report import Report, metrics_for_tracking, write_report
from pr_rlhf.models.base import SamplingParams
from pr_rlhf.reward.inputs import RMInput, history_rows_by_user, rm_inputs_from_rows, with_plans
from pr_rlhf.shards import ShardReader
from pr_rlhf.tracking import make_tracker


class EvalError(ValueError):
    """An evaluation that cannot start (no shards, no pairs); the message says which file or field."""


@dataclass
class EvalResult:
    run_dir: Path
    report: Report
    n_pairs: int
    plan_failures: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    models: dict[str, EvalResult] = field(default_factory=dict)   # eval.models', each in <run_dir>/models/<name>
    model_rows: list[dict] = field(default_factory=list)           # pr_rlhf.eval.models.model_rows


def load_eval_inputs(cfg: EvalConfig, seed: int) -> list[RMInput]:
    """The evaluated pairs as RM inputs, each with the user's first k history pairs and stated preferences."""
    reader = ShardReader(cfg.shards)
    splits = cfg.split.split("+")
    for split in splits:
        if split not in reader.splits("pairs"):
            raise EvalError(f"{cfg.shards}: no pairs in split {split!r} (splits: {reader.splits('pairs')})")
    profiles = {(r["user_id"], r["subset"]): r for r in reader.iter_rows("profiles")}

    def wanted(row: dict) -> bool:
        if cfg.subsets and row["subset"] not in cfg.subsets:
            return False
        if cfg.users == "all":
            return True
        profile = profiles.get((row["user_id"], row["subset"]))
        cold = bool(profile and profile.get("cold_start"))
        return cold == (cfg.users == "cold_start")

    pairs = [r for split in splits for r in reader.iter_rows("pairs", split) if wanted(r)]
    if not pairs:
        raise EvalError(f"{cfg.shards}: no {cfg.split} pairs in subsets {cfg.subsets}"
                        + ("" if cfg.users == "all" else f" from {cfg.users} users"))
    if cfg.max_pairs and len(pairs) > cfg.max_pairs:
        keep = np.sort(np.random.default_rng(seed).choice(len(pairs), cfg.max_pairs, replace=False))
        pairs = [pairs[i] for i in keep]
    histories = history_rows_by_user(reader.iter_rows("histories"), reader.iter_rows("pairs", "train")) \
        if cfg.history_pairs > 0 and "train" in reader.splits("pairs") else {}
    return rm_inputs_from_rows(pairs, histories, profiles, cfg.history_pairs)


class _Engines:
    """One engine per distinct config, shared by judge and planner, closed at the end."""

    def __init__(self) -> None:
        self._engines: dict[str, Any] = {}

    def get(self, cfg: EngineConfig):
        from pr_rlhf.models import make_engine

        key = cfg.model_dump_json()
        if key not in self._engines:
            self._engines[key] = make_engine(cfg)
        return self._engines[key]

    def close(self) -> None:
        for engine in self._engines.values():
            engine.close()


def _pointwise_scorer(cfg: EvalConfig, engines: _Engines, params: SamplingParams):
    if cfg.pointwise_model == "scalar":
        from pr_rlhf.reward.scalar import ScalarRM

        return ScalarRM(cfg.scalar_rm, device=cfg.scalar_rm.device, dtype=cfg.scalar_rm.dtype)
    from pr_rlhf.reward.pointwise import PointwiseJudge

    return PointwiseJudge(engines.get(cfg.judge), params=params)


def predict_all(cfg: EvalConfig, inputs: list[RMInput], seed: int, engines: _Engines,
                on_cell=lambda _name: None) -> tuple[list[Prediction], int]:
    """Every configured (mode, inputs) cell; returns the predictions and how many plans failed to parse."""
    from pr_rlhf.reward.judge import PairwiseJudge
    from pr_rlhf.reward.planner import Planner

    gen = cfg.generation
    params = SamplingParams(temperature=gen.temperature, top_p=gen.top_p, max_tokens=gen.max_tokens, seed=seed)
    by_mode: dict[str, list[RMInput]] = {}
    plan_failures = 0
    for inputs_mode in cfg.inputs:
        if inputs_mode == "plan":
            on_cell("planning rubrics")
            planner = Planner(engines.get(cfg.planner or cfg.judge), params=params,
                              max_aspects=cfg.planner_max_aspects)
            plans = planner.plan(inputs, cfg.top_k_profile)
            plan_failures = sum(p.error is not None for p in plans)
            by_mode["plan"] = with_plans(inputs, plans)
        else:
            by_mode[inputs_mode] = inputs

    preds: list[Prediction] = []
    pointwise = _pointwise_scorer(cfg, engines, params) if "pointwise" in cfg.modes else None
    for inputs_mode, batch in by_mode.items():
        if pointwise is not None:
            on_cell(f"pointwise / {inputs_mode}")
            for inp, s in zip(batch, pointwise.score_pairs(batch, inputs_mode, cfg.top_k_profile)):
                preds.append(Prediction.pointwise(pair_id=inp.pair_id, user_id=inp.user_id, subset=inp.subset,
                                                  inputs=inputs_mode, score_chosen=s.chosen,
                                                  score_rejected=s.rejected, error=s.error))
        if "pairwise" in cfg.modes:
            on_cell(f"pairwise / {inputs_mode}")
            judge = PairwiseJudge(engines.get(cfg.judge), params=params, seed=seed, fmt=cfg.pairwise_format,
                                  use_stated_preferences=cfg.sec_use_stated_preferences)
            verdicts = judge.judge(batch, inputs_mode, cfg.top_k_profile, both_orders=cfg.both_orders)
            per_pair = 2 if cfg.both_orders else 1
            for i, v in enumerate(verdicts):
                inp = batch[i // per_pair]
                tie = v.error == "tie"
                scores = v.scores or (None, None)
                # scores are per slot; report them per answer
                s_chosen, s_rejected = (scores if v.chosen_slot == "A" else scores[::-1])
                preds.append(Prediction.pairwise(
                    pair_id=inp.pair_id, user_id=inp.user_id, subset=inp.subset, inputs=inputs_mode,
                    chosen_slot=v.chosen_slot, predicted=v.predicted, error=None if tie else v.error, tie=tie,
                    order=i % per_pair, score_chosen=s_chosen, score_rejected=s_rejected, raw=v.raw))
    return preds, plan_failures


def shard_references(shards: str) -> dict[str, Any]:
    """Reference accuracies the shards know of (the synthetic world's oracle etc.), plus chance."""
    summary = ShardReader(shards).manifest.get("summary") or {}
    refs: dict[str, Any] = {"chance": 0.5}
    for name, est in (summary.get("reference") or {}).items():
        refs[f"world {name}"] = est
    return refs


def run_eval(recipe: Recipe, on_stage=lambda _s: None) -> EvalResult:
    cfg = recipe.eval
    run_dir = Path(cfg.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "recipe.yaml").write_text(dump_recipe(recipe))
    seconds: dict[str, float] = {}

    t0 = time.perf_counter()
    on_stage(f"loading {cfg.split} pairs from {cfg.shards}")
    inputs = load_eval_inputs(cfg, recipe.seed)
    seconds["load"] = time.perf_counter() - t0

    engines = _Engines()
    t0 = time.perf_counter()
    try:
        preds, plan_failures = predict_all(cfg, inputs, recipe.seed, engines, on_cell=on_stage)
    finally:
        engines.close()
    seconds["predict"] = time.perf_counter() - t0

    on_stage("writing the report")
    extra = {"n_pairs": len(inputs), "plan_failures": plan_failures, "shards": cfg.shards, "split": cfg.split,
             "seconds": seconds}
    report = write_report(run_dir, preds, n_bootstrap=cfg.n_bootstrap, seed=recipe.seed,
                          references=shard_references(cfg.shards), title=f"{recipe.name}: {cfg.shards}",
                          extra=extra)
    with make_tracker(recipe.tracking, run_dir, recipe.name, tags={"stage": "eval"}) as tracker:
        tracker.log_params(recipe.model_dump(mode="json"))
        tracker.log_metrics({**metrics_for_tracking(report.summaries), "eval/n_pairs": len(inputs),
                             "eval/plan_failures": plan_failures,
                             **{f"time/eval_{k}_s": v for k, v in seconds.items()}})
        for path in report.paths:
            tracker.log_artifact(path)
    (run_dir / "run.json").write_text(json.dumps({"n_pairs": len(inputs), "plan_failures": plan_failures,
                                                  "seconds": seconds}, indent=2))
    result = EvalResult(run_dir, report, len(inputs), plan_failures, seconds)
    if cfg.models:
        _run_named_models(recipe, result, on_stage)
    return result


def _run_named_models(recipe: Recipe, result: EvalResult, on_stage) -> None:
    """Each of ``eval.models`` on the section's pairs, then ``models.md|json`` beside the section's report."""
    from pr_rlhf.eval.models import model_rows, write_models_report

    cfg = recipe.eval
    for name in cfg.models:
        on_stage(f"model {name}")
        named = recipe.model_copy(update={"name": f"{recipe.name}/{name}", "eval": cfg.model_config_for(name)})
        result.models[name] = run_eval(named, on_stage)
    floor = cfg.label
    result.model_rows = model_rows(floor, result.report, {n: r.report for n, r in result.models.items()},
                                   recipe.seed)
    result.report.paths.extend(write_models_report(result.run_dir, result.model_rows, floor,
                                                   f"{recipe.name}: {result.n_pairs} pairs, every model"))
