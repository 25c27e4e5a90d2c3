"""The P-GenRM training pipeline on Ray (docs/protocols.md section 4): base -> PSI -> CRE -> curriculum, plus the CRE
ablations (without PR, without OR), each stage on a fresh FSDP learner group (and rollout workers for the GRPO
stages) started from the model the previous stage wrote.

Every stage writes ``<out>/<stage>/``: ``model/`` (an HF directory any engine loads), ``checkpoints/`` (resumed
from when a killed stage is run again), ``history.json``, ``eval_seen/`` and ``eval_cold/`` (`pr-rlhf eval`
reports on held-out pairs of seen users and of cold-start users, run as Ray tasks), ``result.json`` and
``COMPLETE`` (a complete stage is never run again). Each stage is one mlflow run.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pr_rlhf.actors import ActorGroup, cpus_needed, pgenrm_groups
from pr_rlhf.configs.base import engine_config
from pr_rlhf.configs.pgenrm import GRPO_STAGES, STAGE_PARENT, GRPOStageConfig, PGenRMConfig, SFTStageConfig
from pr_rlhf.configs.recipe import EvalConfig, GenerationConfig, Recipe, TrackingConfig, dump_recipe
from pr_rlhf.configs.rl import RLConfig
from pr_rlhf.eval.groups import EVAL_GROUPS
from pr_rlhf.files import atomic_dir, is_complete, mark_complete
from pr_rlhf.models.base import Generation, SamplingParams
from pr_rlhf.models.prompting import load_tokenizer
from pr_rlhf.models.sources import resolve_model
from pr_rlhf.pgenrm.curriculum import hard_share_at, step_prompts
from pr_rlhf.pgenrm.headroom import HeadroomGateError
from pr_rlhf.pgenrm.open_source import open_source
from pr_rlhf.pgenrm.psi_data import PSIExample
from pr_rlhf.pgenrm.sources import PGenRMSource
from pr_rlhf.rl.prompts import batch_at, sft_example
from pr_rlhf.stats import mean_ci
from pr_rlhf.threads import capped_threads, set_torch_threads
from pr_rlhf.tracking import make_tracker
from pr_rlhf.world.generator import build_world
from workers.rl_loop import (
    Colocated,
    checkpoint_step,
    complete_checkpoints,
    read_checkpoint,
    rl_step,
    sft_steps,
    sync_weights,
    write_checkpoint,
)

RESULT = "result.json"
__all__ = ["HeadroomGateError", "PGenRMPipeline", "StageOrderError", "run_pgenrm"]

StepCallback = Callable[[str, int, int, dict], None]   # (stage, step done, steps, metrics)


class StageOrderError(RuntimeError):
    """A stage was asked for before the stage it starts from was complete."""


def _run_model_headroom(model_dir: str, recipe_json: str, threads: int) -> dict:
    """The model part of the headroom check (a Ray task)."""

    from pr_rlhf.pgenrm.headroom import sampled_model_headroom

    set_torch_threads(threads)
    recipe = Recipe.model_validate_json(recipe_json)
    return sampled_model_headroom(model_dir, build_world(recipe.pgenrm.world), recipe.pgenrm, recipe.seed)


def _run_eval_json(recipe_json: str, threads: int) -> dict:
    """`pr-rlhf eval` on one recipe (a Ray task: module-level so that it pickles by reference)."""

    from pr_rlhf.eval.runner import run_eval

    set_torch_threads(threads)
    result = run_eval(Recipe.model_validate_json(recipe_json))
    summary = next(iter(result.report.summaries.values()))
    return {"summary": summary, "predictions": str(result.report.predictions), "seconds": result.seconds}


def _run_planner_eval(model_dir: str, inputs: list, gold: list[list[str]], top_k: int, max_tokens: int,
                      threads: int, seed: int) -> dict:
    """Greedy plans of ``model_dir`` (the Planner reward models use) for ``inputs``; aspect precision / recall
    (exact (attribute, direction) keys of the synthetic world) with 95% bootstrap CIs resampling users (a user's
    queries share their profile), and the parse failures (a Ray task)."""

    from pr_rlhf.models import make_engine
    from pr_rlhf.pgenrm.planner_data import aspect_precision_recall, world_aspect_key
    from pr_rlhf.reward.planner import Planner

    set_torch_threads(threads)
    engine = make_engine(engine_config(backend="hf", model=model_dir))
    try:
        plans = Planner(engine, params=SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=seed)).plan(
            inputs, top_k)
    finally:
        engine.close()
    scores = np.array([aspect_precision_recall(plan.aspects, want, key=world_aspect_key)
                       for plan, want in zip(plans, gold)]).reshape(-1, 2)
    out: dict[str, Any] = {"queries": len(gold), "parse_failures": sum(plan.error is not None for plan in plans),
                           "per_query": [{"user_id": i.user_id, "pair_id": i.pair_id, "precision": float(p),
                                          "recall": float(r)} for i, (p, r) in zip(inputs, scores)]}
    for name, values in (("precision", scores[:, 0]), ("recall", scores[:, 1])):
        low, high = mean_ci(values, seed=seed, clusters=[i.user_id for i in inputs])
        out[name] = {"mean": float(values.mean()), "ci_low": low, "ci_high": high}
    return out


def hardness_accuracy(predictions: str, kinds: dict[str, set[str]], seed: int = 0) -> dict[str, dict]:
    """Accuracy with a 95% bootstrap CI (resampling users) per kind of pair (``sources.pair_kinds``) from an eval's
    predictions."""
    from pr_rlhf.pgenrm.report import correct_by_pair

    correct = correct_by_pair(predictions)
    out = {}
    for kind in ("standard", "hard", "contested", "uncontested"):
        pairs = [pair_id for pair_id in correct if kind in kinds.get(pair_id, ())]
        values = np.array([correct[p] for p in pairs])
        if values.size:
            low, high = mean_ci(values, seed=seed, clusters=[correct.user(p) for p in pairs])
            out[kind] = {"accuracy": float(values.mean()), "ci_low": low, "ci_high": high, "n": int(values.size)}
    return out


def step_kl(metrics: dict) -> float:
    """A GRPO step's KL per token to the starting model (a loss term, or the reward's penalty)."""
    return metrics.get("actor/kl_loss", metrics.get("train/kl", 0.0))


def step_parse_rate(metrics: dict) -> float:
    return metrics.get("reward/parse_rate", 1.0)


class PGenRMPipeline:
    """Runs the recipe's P-GenRM stages in order (Ray must be initialized: ``workers.ray_utils.init_ray``)."""

    def __init__(self, recipe: Recipe, on_step: StepCallback | None = None,
                 on_event: Callable[[str], None] | None = None):
        if recipe.pgenrm is None:
            raise ValueError("the recipe has no pgenrm: section")
        self.recipe = recipe
        self.cfg: PGenRMConfig = recipe.pgenrm
        self.out = Path(self.cfg.out)
        self.on_step = on_step or (lambda *_: None)
        self.on_event = on_event or (lambda _m: None)
        # the synthetic world or real data, as the config's member says (pr_rlhf.pgenrm.sources)
        self.data: PGenRMSource = open_source(self.cfg, recipe.seed, self.out, self.on_event)
        self._tokens: dict[str, dict[int, str]] = {}

    # ------------------------------------------------------------------------------------------ layout
    def stage_dir(self, stage: str) -> Path:
        return self.out / stage

    def is_complete(self, stage: str) -> bool:
        return is_complete(self.stage_dir(stage))

    def result(self, stage: str) -> dict | None:
        path = self.stage_dir(stage) / RESULT
        return json.loads(path.read_text()) if self.is_complete(stage) and path.is_file() else None

    def start_model(self, stage: str) -> str:
        """The model a stage starts from: the recipe's ``start_from`` for it, else the initial model (the planner's
        own for the planner; a stage without a parent), else its parent stage's output."""
        if stage in self.cfg.start_from:
            return resolve_model(self.cfg.start_from[stage])
        if stage == "planner":
            return resolve_model(self.cfg.planner.model)
        parent = STAGE_PARENT[stage]
        if parent is None:
            return resolve_model(self.cfg.model)
        if not self.is_complete(parent):
            raise StageOrderError(f"stage {stage!r} starts from stage {parent!r}'s model, which is not complete "
                                  f"in {self.stage_dir(parent)}: run `pr-rlhf pgenrm RECIPE --stage {parent}` "
                                  f"first")
        return str(self.stage_dir(parent) / "model")

    # ------------------------------------------------------------------------------------------ run
    def run(self, stages: list[str] | None = None) -> dict[str, dict]:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "recipe.yaml").write_text(dump_recipe(self.recipe))
        todo = stages or list(self.cfg.stages)
        if any(stage != "planner" for stage in todo):   # what the GenRM's reports read (not the planner's)
            self.data.prepare()
        results: dict[str, dict] = {}
        for stage in todo:
            done = self.result(stage)
            if done is not None:
                self.on_event(f"{stage}: complete in {self.stage_dir(stage)}, not run again")
                results[stage] = done
                continue
            results[stage] = self.run_stage(stage)
        return results

    def check_gate(self, stage: str) -> None:
        """Raises :class:`HeadroomGateError` for a GRPO stage the data's headroom check refuses."""
        if self.data.headroom is not None:
            self.data.headroom.check_gate(stage)

    def _group(self, phase: str) -> ActorGroup:
        """The declared group (``pr_rlhf.actors.pgenrm_groups``) of one of this pipeline's task phases."""
        return next(g for g in pgenrm_groups(self.cfg, 0.0) if g.phase == phase)

    def model_headroom(self, model_dir: str) -> dict:
        """The model part of the headroom check on seen-user held-out prompts (a Ray task)."""
        import ray

        task = ray.remote(**self._group("pgenrm headroom").options())(_run_model_headroom)
        return ray.get(task.remote(model_dir, self.recipe.model_dump_json(), self.cfg.torch_threads))

    def run_stage(self, stage: str) -> dict:
        self.check_gate(stage)
        start = self.start_model(stage)
        sdir = self.stage_dir(stage)
        sdir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        tracker = make_tracker(self.recipe.tracking, sdir, f"{self.recipe.name}/{stage}",
                               tags={"stage": f"pgenrm/{stage}"})
        with tracker:
            tracker.log_params(self.cfg.model_dump(mode="json"))
            if stage == "base":
                model_dir, history = start, []
            elif stage == "psi":
                model_dir, history = self._psi(start, sdir, tracker)
            elif stage == "planner":
                model_dir, history = self._planner(start, sdir, tracker)
            else:
                model_dir, history = self._grpo(stage, start, sdir, tracker)
            train_s = time.perf_counter() - t0
            (sdir / "history.json").write_text(json.dumps(history, indent=1))
            self.on_event(f"{stage}: evaluating {model_dir}")
            if stage == "planner":
                evals = {"planner": self.evaluate_planner({"base": start, "trained": model_dir})}
                tracker.log_metrics({f"planner/{name}/{k}/mean": v[k]["mean"] for name, v in
                                     evals["planner"].items() for k in ("precision", "recall")})
            else:
                evals = self.evaluate(stage, model_dir)
                tracker.log_metrics({f"{g}/{k}": v for g in EVAL_GROUPS for k, v in evals[g]["summary"].items()
                                     if isinstance(v, (int, float)) and not isinstance(v, bool)})
                if stage == "psi" and self.data.headroom is not None and self.data.headroom.after_psi:
                    self.on_event(f"{stage}: headroom of {model_dir} (greedy, maj@k, pass@k, decision entropy)")
                    evals["headroom"] = self.model_headroom(model_dir)
            if stage in GRPO_STAGES and history and history[-1].get("stopped"):
                evals["stopped"] = history[-1]["stopped"]
            result = {"stage": stage, "model": model_dir, "train_seconds": train_s,
                      "seconds": time.perf_counter() - t0, **evals}
        (sdir / RESULT).write_text(json.dumps(result, indent=1))
        mark_complete(sdir)
        return result

    # ------------------------------------------------------------------------------------------ evaluation
    def eval_recipe(self, stage: str, model_dir: str, group: str) -> Recipe:
        held_out = EVAL_GROUPS[group]
        ecfg = self.cfg.eval
        max_pairs = ecfg.seen_pairs if group == "seen" else ecfg.cold_pairs
        return Recipe(name=f"{self.recipe.name}/{stage}/eval_{group}", seed=self.recipe.seed, eval=EvalConfig(
            shards=self.cfg.shards, split=held_out.split, users=held_out.users, max_pairs=max_pairs,
            modes=["pairwise"], inputs=["none"], pairwise_format=self.data.eval_format,
            sec_use_stated_preferences=False, history_pairs=ecfg.history_pairs,
            n_bootstrap=ecfg.n_bootstrap, out=str(self.stage_dir(stage) / f"eval_{group}"),
            judge=self.cfg.eval_engine(model_dir),
            generation=GenerationConfig(temperature=0.0, max_tokens=ecfg.max_tokens)),
            tracking=self.recipe.tracking if self.recipe.tracking else TrackingConfig())

    def evaluate(self, stage: str, model_dir: str) -> dict:
        """`pr-rlhf eval` of ``model_dir`` on both held-out groups, each a Ray task, one after the other: two
        evaluations side by side on a small machine oversubscribe its cores (docs/measurements.md)."""
        import ray

        task = ray.remote(**self._group("pgenrm evaluation").options())(_run_eval_json)
        out = {}
        for group in ("cold", "seen"):
            res = ray.get(task.remote(self.eval_recipe(stage, model_dir, group).model_dump_json(),
                                      self.cfg.torch_threads))
            res["hardness"] = hardness_accuracy(res["predictions"], self.data.pair_kinds(), self.recipe.seed)
            out[group] = res
        return out

    # ------------------------------------------------------------------------------------------ learners
    def _learner(self, model_dir: str, lr: float, temperature: float = 1.0, kl: Any = None,
                 colocated: Any = None):
        """``colocated``: the bundle of the rollout engine each rank's bundle also hosts (layout colocated)."""
        from workers.learner import LearnerGroup

        update = {"model": model_dir, "lr": lr, "seed": self.recipe.seed, "temperature": temperature,
                  "torch_threads": self.cfg.torch_threads}
        if kl is not None:
            update["kl"] = kl
        return LearnerGroup(self.cfg.learner.model_copy(update=update), colocated=colocated)

    def _restore(self, sdir: Path, learner: Any) -> tuple[int, list]:
        found = read_checkpoint(sdir / "checkpoints", learner)
        if found is None:
            return 0, []
        self.on_event(f"resumed from {found[0]}")
        return int(found[1]["step"]), found[1]["history"]

    def _record(self, stage: str, sdir: Path, learner: Any, tracker: Any, step: int, steps: int, every: int,
                metrics: dict, history: list, keep: int = 1) -> None:
        """After ``step`` (0-based): keep and log the metrics, report progress, checkpoint every ``every`` steps
        (the newest ``keep`` checkpoints stay)."""
        history.append(metrics)
        tracker.log_metrics(metrics, step=step + 1)
        self.on_step(stage, step + 1, steps, metrics)
        if (step + 1) % every == 0 and step + 1 < steps:
            write_checkpoint(sdir / "checkpoints", learner, step + 1, step + 1,
                             {"step": step + 1, "history": history}, keep=keep)

    def _finish(self, learner: Any, start: str, sdir: Path) -> str:
        """The trained model as ``sdir/model``, an HF directory with ``start``'s tokenizer: streamed by the learner
        ranks (rank 0 writes one file of weights at a time; nothing passes through this driver), into a temporary
        sibling renamed into place (never half-written)."""
        with atomic_dir(sdir / "model") as tmp:
            learner.export_model(tmp)
        return str(sdir / "model")

    # ------------------------------------------------------------------------------------------ SFT
    def _sft(self, stage: str, start: str, sdir: Path, tracker: Any, examples: list[tuple[list, str]],
             cfg: SFTStageConfig) -> tuple[str, list]:
        """Supervised steps on (messages, target) examples (epochs reshuffled with the run's seed), resumable."""
        tokenizer = load_tokenizer(start)
        data = [sft_example(tokenizer, messages, target) for messages, target in examples]
        learner = self._learner(start, cfg.lr)
        try:
            first, history = self._restore(sdir, learner)
            sft_steps(learner, lambda step: batch_at(data, step * cfg.batch_size, cfg.batch_size, self.recipe.seed),
                      cfg.lr_at, cfg.steps, first,
                      on_step=lambda step, m: self._record(stage, sdir, learner, tracker, step, cfg.steps,
                                                           cfg.checkpoint_every, {"step": step, **m}, history))
            return self._finish(learner, start, sdir), history
        finally:
            learner.shutdown()

    def _psi(self, start: str, sdir: Path, tracker: Any) -> tuple[str, list]:
        if self.cfg.psi.steps == 0:   # the given model is the PSI model: evaluated, not trained
            self.on_event(f"psi: 0 steps, {start} is the PSI model")
            return start, []
        chains = self.data.psi_examples(sdir)
        return self._sft("psi", start, sdir, tracker, [(e.messages, e.target) for e in chains], self.cfg.psi)

    def _planner(self, start: str, sdir: Path, tracker: Any) -> tuple[str, list]:
        from pr_rlhf.pgenrm.planner_data import planner_examples

        train = planner_examples(self.cfg.shards, ("train",), self.cfg.planner.top_k)
        self.on_event(f"planner: {len(train)} training queries with gold rubrics")
        return self._sft("planner", start, sdir, tracker, [(e.messages, e.target) for e in train],
                         self.cfg.planner)

    def evaluate_planner(self, model_dirs: dict[str, str]) -> dict:
        """Aspect precision / recall of each model on the same held-out queries (a Ray task each)."""
        import ray

        from pr_rlhf.pgenrm.planner_data import planner_examples

        cfg = self.cfg.planner
        held = planner_examples(self.cfg.shards, ("val", "test"), cfg.top_k)
        keep = np.sort(np.random.default_rng(self.recipe.seed).permutation(len(held))[:cfg.eval_queries])
        held = [held[i] for i in keep]
        task = ray.remote(**self._group("pgenrm planner evaluation").options())(_run_planner_eval)
        return {name: ray.get(task.remote(path, [e.input for e in held], [e.aspects for e in held], cfg.top_k,
                                          cfg.max_tokens, self.cfg.torch_threads, self.recipe.seed))
                for name, path in model_dirs.items()}   # one after the other (see evaluate)

    # ------------------------------------------------------------------------------------------ GRPO
    def token_texts(self, model_dir: str, ids: list[int]) -> list[str]:
        """Each token's text under ``model_dir``'s tokenizer (decoded once per token id)."""
        cache = self._tokens.setdefault(model_dir, {})
        missing = [t for t in set(ids) if t not in cache]
        if missing:
            tokenizer = load_tokenizer(model_dir)
            cache.update({t: tokenizer.decode([t]) for t in missing})
        return [cache[t] for t in ids]

    def step_rewards(self, items: list[PSIExample], gens: list[Generation], scfg: GRPOStageConfig,
                     model_dir: str | None = None) -> tuple[np.ndarray, dict]:
        """The GRPO stages' reward function: the CRE reward of every sampled chain, and its outcome / process parts,
        parse rate, the share of decided chains that prefer the first slot, outcome on contested prompts and (with
        sampled log-probs) the decision-token entropy: the mean of -log p(sampled token) at the token after
        ``Type:``, a Monte-Carlo estimate of that token's entropy at temperature 1."""
        from pr_rlhf.pgenrm.headroom import decision_position

        scored, first_slot, contested_or, fork_nll, fork_nll_contested = [], [], [], [], []
        per_item, source_metrics = self.data.rewards(items, [[s.text for s in gen.samples] for gen in gens], scfg)
        for item, gen, rewards in zip(items, gens, per_item):
            scored += rewards
            for sample, r in zip(gen.samples, rewards):
                if r.prefers_first is not None:
                    first_slot.append(float(r.prefers_first))
                if r.parsed and item.contested:
                    contested_or.append(r.outcome)
                if model_dir and sample.logprobs:
                    pos = decision_position(self.token_texts(model_dir, sample.token_ids))
                    if pos is not None and pos < len(sample.logprobs):
                        fork_nll.append(-sample.logprobs[pos])
                        if item.contested:
                            fork_nll_contested.append(-sample.logprobs[pos])
        parsed = [r for r in scored if r.parsed]

        def mean(values: list) -> float:
            return float(np.mean(values)) if values else 0.0
        metrics = {
            "reward/outcome": mean([r.outcome for r in parsed]),
            "reward/process": mean([r.process for r in parsed if r.process is not None]),
            "reward/parse_rate": len(parsed) / len(scored),
            "reward/outcome_contested": mean(contested_or),
            "data/contested_share": mean([float(e.contested) for e in items]),
            "decision/first_slot_share": mean(first_slot), **source_metrics}
        if fork_nll:
            metrics["decision/entropy_mc"] = mean(fork_nll)
            metrics["decision/entropy_mc_contested"] = mean(fork_nll_contested)
        return np.array([r.reward for r in scored]), metrics

    def grpo_prompts(self, items: list[PSIExample], both_orders: bool, first_group: int = 0
                     ) -> tuple[list[PSIExample], list[int]]:
        """The step's prompts and the GRPO group of each: one group per (history, pair), shown in both response
        orders when ``both_orders`` (half of the group's chains each)."""
        if not both_orders:
            return items, list(range(first_group, first_group + len(items)))
        prompts, groups = [], []
        for i, item in enumerate(items):
            prompts += [item, self.data.other_order(item)]
            groups += [first_group + i] * 2
        return prompts, groups

    @staticmethod
    def stop_reason(history: list[dict], scfg: GRPOStageConfig) -> str | None:
        """Why the stage stops now: the KL per token above ``stop_kl`` or the parse rate below ``stop_parse_rate``
        for the last ``stop_patience`` steps (None: go on)."""
        recent = history[-scfg.stop_patience:]
        if len(recent) < scfg.stop_patience:
            return None
        kl = [step_kl(m) for m in recent]
        if scfg.stop_kl is not None and min(kl) > scfg.stop_kl:
            return f"KL per token {kl[-1]:.4f} > {scfg.stop_kl} for {scfg.stop_patience} steps"
        rate = [step_parse_rate(m) for m in recent]
        if scfg.stop_parse_rate is not None and max(rate) < scfg.stop_parse_rate:
            return f"parse rate {rate[-1]:.3f} < {scfg.stop_parse_rate} for {scfg.stop_patience} steps"
        return None

    @staticmethod
    def rollback_step(history: list[dict], kept: list[int], scfg: GRPOStageConfig) -> int:
        """``on_stop: rollback``: the newest kept checkpoint step whose weights passed both limits when the next step
        measured them (``history[n]`` is the step that starts from checkpoint ``n``'s weights), else 0 (the stage's
        starting model)."""
        def passed(m: dict) -> bool:
            return ((scfg.stop_kl is None or step_kl(m) <= scfg.stop_kl) and
                    (scfg.stop_parse_rate is None or step_parse_rate(m) >= scfg.stop_parse_rate))
        return max((n for n in kept if n < len(history) and passed(history[n])), default=0)

    def _roll_back(self, learner: Any, start: str, sdir: Path, history: list[dict], scfg: GRPOStageConfig) -> str:
        """The stopped stage's model from the checkpoint :meth:`rollback_step` picks (or a copy of ``start``)."""
        kept = {checkpoint_step(p): p for p in complete_checkpoints(sdir / "checkpoints")}
        back = self.rollback_step(history, list(kept), scfg)
        history[-1]["rolled_back_to"] = back
        self.on_event(f"rolled back to {kept[back] if back else start}")
        if back:
            learner.load_checkpoint(kept[back] / "learner")
            return self._finish(learner, start, sdir)
        with atomic_dir(sdir / "model") as tmp:
            shutil.copytree(start, tmp, dirs_exist_ok=True)
        return str(sdir / "model")

    def _grpo(self, stage: str, start: str, sdir: Path, tracker: Any) -> tuple[str, list]:
        import ray

        from workers.rollout import spawn_rollout_worker

        scfg = self.cfg.stage_config(stage)
        pool, hard = self.data.grpo_pool(scfg, sdir)
        schedule = None if scfg.hard_share_start is None else (scfg.hard_share_start, scfg.hard_share_end,
                                                               scfg.steps)
        group = next(g for g in pgenrm_groups(self.cfg, ray.cluster_resources().get("GPU", 0.0))
                     if g.role == "rollout")
        learner = self._learner(start, scfg.lr, scfg.temperature, scfg.kl,
                                colocated=group.bundle if group.colocated_with else None)
        rl_cfg = RLConfig(algorithm="grpo", advantage=scfg.advantage, group_size=scfg.group_size,
                          temperature=scfg.temperature, max_tokens=scfg.max_tokens, learner=learner.config)
        engine = self.cfg.rollout.model_copy(update={"model": start, "seed": self.recipe.seed})
        placement: list[dict[str, Any]] = [{} for _ in range(group.count)]
        if group.colocated_with:   # engine i in learner rank i's bundle (the hybrid engine)
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            engine = Colocated.engine(engine)
            placement = [{"scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=learner.placement_group, placement_group_bundle_index=i)} for i in range(group.count)]
        rollouts = [spawn_rollout_worker(engine, **group.options(), **where,
                                         env={"OMP_NUM_THREADS": str(capped_threads(self.cfg.torch_threads))})
                    for where in placement]
        colocated = Colocated(rollouts, self.cfg.sleep_level) if group.colocated_with else None
        rewards = lambda prompts, gens: self.step_rewards(prompts, gens, scfg, start)   # noqa: E731
        try:
            first, history = self._restore(sdir, learner)
            sync_weights(learner, rollouts, first)
            for step in range(first, scfg.steps):
                items = step_prompts(pool, hard, step, scfg.prompts_per_step, self.recipe.seed, schedule)
                prompts, group_of = self.grpo_prompts(items, scfg.both_orders)

                drawn = list(items)

                def refill(rnd: int, count: int, step: int = step, drawn: list = drawn) -> tuple[list, list[int]]:
                    # fresh prompts at the step's mix, seeded by (step, round), none the step already has; group
                    # ids after the step's own
                    more = step_prompts(pool, hard, step, count, self.recipe.seed, schedule, draw=rnd + 1,
                                        exclude=drawn)
                    drawn.extend(more)
                    return self.grpo_prompts(more, scfg.both_orders, first_group=len(items) * (rnd + 2))
                metrics = rl_step(learner, rollouts, rl_cfg, prompts, rewards, step, self.recipe.seed,
                                  group_of=group_of, refill=refill if scfg.refill_rounds else None,
                                  refill_rounds=scfg.refill_rounds, logprobs=True, colocated=colocated)
                picked = {id(e) for e in items}
                metrics.update({
                    "data/hard_share": float(np.mean([h for e, h in zip(pool, hard) if id(e) in picked])),
                    "data/scheduled_hard_share": hard_share_at(step, scfg.steps, *schedule[:2]) if schedule else
                    float(np.mean(hard)),
                })
                self._record(stage, sdir, learner, tracker, step, scfg.steps, scfg.checkpoint_every, metrics,
                             history, keep=scfg.checkpoints_kept)
                reason = self.stop_reason(history, scfg)
                if reason:
                    history[-1]["stopped"] = f"after step {step + 1}: {reason}"
                    self.on_event(f"{stage}: stopped {history[-1]['stopped']}")
                    if scfg.on_stop == "rollback":
                        return self._roll_back(learner, start, sdir, history, scfg), history
                    break
            return self._finish(learner, start, sdir), history
        finally:
            for w in rollouts:
                ray.kill(w)
            learner.shutdown()
            self.data.end_stage(sdir)


def run_pgenrm(recipe: Recipe, stages: list[str] | None = None, address: str | None = None, *,
               on_step: StepCallback | None = None, on_event: Callable[[str], None] | None = None,
               log: Callable[[str], None] = print) -> tuple[dict[str, dict], Any]:
    """`pr-rlhf pgenrm`: the recipe's synthetic world built into its shards when absent, Ray joined at ``address``
    (else a local Ray), the stages (all of the recipe's, or ``stages``; raises :class:`StageOrderError`), then the
    ablation report over every complete GenRM stage. Returns ``({stage: result}, the ablation report, or None
    when no GenRM stage is complete: a planner-only run)``."""

    from pr_rlhf.pgenrm.report import collect, write_ablation_report
    from workers.ray_utils import check_resources, start_driver

    cfg = recipe.pgenrm
    if cfg is None:
        raise ValueError("the recipe has no pgenrm: section")
    start_driver(address, max(3, cpus_needed(pgenrm_groups(cfg, 0.0))), shards=cfg.shards, world=cfg.shards_world(),
                 log=log)
    check_resources(recipe, "pgenrm", log=log)
    results = PGenRMPipeline(recipe, on_step=on_step, on_event=on_event).run(stages)
    if not collect(cfg.out, recipe.seed):
        return results, None
    return results, write_ablation_report(cfg.out, title=f"{recipe.name}: P-GenRM ablation", seed=recipe.seed)
