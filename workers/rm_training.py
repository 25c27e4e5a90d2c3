"""`pr-rlhf train-rm`: Bradley-Terry scalar reward models on the learner ranks, one per input mode, each exported
as an HF model folder and evaluated on held-out pairs, then the per-mode report.

For each mode (none / profile / plan / history / persona): the seen users' training pairs encoded as the scalar RM
reads them (``pr_rlhf.rm.data``), ``steps`` Bradley-Terry updates on a ``LearnerGroup`` with ``trains: reward_model``
(FSDP2 ranks or one plain module) under the supervised stage's learning-rate schedule, checkpoints every
``checkpoint_every`` steps (a rerun resumes; a finished mode is skipped), the model exported to ``<out>/<mode>/model``
(the ``scalar`` reward kind, ``pr-rlhf eval`` and the reward service load it by path), then `pr-rlhf eval`'s
pointwise cell on it as a Ray task. Metrics go to mlflow per mode.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pr_rlhf.actors import cpus_needed, persona_book_beside, rm_eval_scalar_rm, rm_eval_task, rm_groups
from pr_rlhf.configs.recipe import EvalConfig, Recipe, dump_recipe
from pr_rlhf.configs.rm import RMTrainConfig
from pr_rlhf.files import is_complete, mark_complete
from pr_rlhf.reward.inputs import RMInput, with_plans
from pr_rlhf.rm.data import encode_pairs, step_pairs, training_pairs
from pr_rlhf.tracking import make_tracker
from workers.rl_loop import read_checkpoint, write_checkpoint

StepCallback = Callable[[str, int, int, dict], None]


def plan_inputs(cfg: RMTrainConfig, inputs: list[RMInput], cache: Path, seed: int) -> list[RMInput]:
    """The planner's rubric attached to every training pair, made once per run (``cache``: pair id -> aspects)."""
    if cache.is_file():
        aspects = json.loads(cache.read_text())
        return with_plans(inputs, [aspects.get(inp.pair_id, []) for inp in inputs])
    from pr_rlhf.models import make_engine
    from pr_rlhf.models.base import SamplingParams
    from pr_rlhf.reward.planner import Planner

    engine = make_engine(cfg.planner)
    try:
        gen = cfg.planner_generation
        params = SamplingParams(temperature=gen.temperature, top_p=gen.top_p, max_tokens=gen.max_tokens, seed=seed)
        plans = Planner(engine, params=params, max_aspects=cfg.planner_max_aspects).plan(inputs, cfg.top_k_profile)
    finally:
        engine.close()
    planned = with_plans(inputs, plans)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({inp.pair_id: inp.plan for inp in planned}))
    return planned


def persona_inputs(cfg: RMTrainConfig, inputs: list[RMInput], book_path: Path,
                   log: Callable[[str], None] = print) -> list[RMInput]:
    """Every training pair with its user's SynthesizeMe persona as stated preferences, induced from the user's
    history pairs (the shards' histories table) once per run, every user in one batch, and kept in the persona book
    at ``book_path`` that the ``persona`` reward kind reads when it scores the RM. Says how many users got no
    persona and how many of the engine's guesses could not be read."""
    from dataclasses import replace

    from pr_rlhf.reward.inputs import history_rows_by_user, history_triple
    from pr_rlhf.scorers import persona_book
    from pr_rlhf.shards import ShardReader

    reader = ShardReader(cfg.shards)
    rows = history_rows_by_user(reader.iter_rows("histories"), reader.iter_rows("pairs", "train"))
    histories = {(inp.user_id, inp.subset): [history_triple(p) for p in rows.get((inp.user_id, inp.subset), [])]
                 for inp in inputs}
    book = persona_book(cfg.persona.model_copy(update={"personas": str(book_path)}))
    by_user = [(user, history) for (user, _), history in histories.items()]
    if book.lacks(by_user):
        from pr_rlhf.models import make_engine

        engine = make_engine(cfg.persona.judge)
        try:
            book.fill(engine, by_user)
        finally:
            engine.close()
        book.save()
    personas = {(user, subset): book.persona(user, history) for (user, subset), history in histories.items()}
    shown = list(personas.values())
    log(f"persona: {len(shown)} seen users, {sum(not p.text for p in shown)} without a persona (no trace "
        f"predicted their label, or too few pairs); {sum(p.unparsed for p in shown)} of "
        f"{sum(p.traces for p in shown)} guesses unreadable, {sum(p.traces_kept for p in shown)} traces kept")
    return [replace(inp, stated_preferences=personas[inp.user_id, inp.subset].text) for inp in inputs]


def eval_recipe(recipe: Recipe, mode: str, model_dir: Path, out: Path) -> Recipe:
    """`pr-rlhf eval`'s recipe for one trained RM: its pointwise cell in its own input mode."""
    cfg = recipe.rm
    planner = {"planner": cfg.planner, "judge": cfg.planner} if cfg.planner is not None else {}
    section = EvalConfig(shards=cfg.shards, split=cfg.eval.split, users=cfg.eval.users, max_pairs=cfg.eval.max_pairs,
                         modes=["pointwise"], inputs=[mode], pointwise_model="scalar",
                         history_pairs=cfg.history_pairs(mode),
                         top_k_profile=cfg.top_k_profile, planner_max_aspects=cfg.planner_max_aspects,
                         n_bootstrap=cfg.eval.n_bootstrap, out=str(out), generation=cfg.planner_generation,
                         scalar_rm=rm_eval_scalar_rm(cfg).model_copy(update={"model": str(model_dir)}), **planner)
    return recipe.model_copy(update={"name": f"{recipe.name}/{mode}", "eval": section})


def _evaluate(recipe: Recipe) -> dict:
    from pr_rlhf.eval.runner import run_eval

    result = run_eval(recipe)
    return {"summary": next(iter(result.report.summaries.values())), "predictions": str(result.report.predictions)}


class RMTrainer:
    """One reward model per input mode of ``recipe.rm``; ``run()`` trains (or resumes, or skips) and evaluates."""

    def __init__(self, recipe: Recipe, on_step: StepCallback | None = None,
                 log: Callable[[str], None] = print) -> None:
        if recipe.rm is None:
            raise ValueError("the recipe has no rm: section")
        self.recipe = recipe
        self.cfg: RMTrainConfig = recipe.rm
        self.out = Path(self.cfg.out)
        self.on_step = on_step or (lambda *_: None)
        self.log = log

    def train(self, mode: str) -> Path:
        """The exported model folder of ``mode``'s RM (trained now unless a finished one is there)."""
        from pr_rlhf.models.sources import resolve_model
        from pr_rlhf.reward.scalar import ScalarRMEncoder
        from workers.learner import LearnerGroup

        cfg, mdir = self.cfg, self.out / mode
        model_dir = mdir / "model"
        if is_complete(model_dir):
            self.log(f"{mode}: {model_dir} is complete, not retrained")
            return model_dir
        data = training_pairs(cfg.shards, cfg.train_split, cfg.history_pairs(mode))
        inputs = plan_inputs(cfg, data.inputs, self.out / "plans_train.json", self.recipe.seed) \
            if mode == "plan" else persona_inputs(cfg, data.inputs, Path(persona_book_beside(model_dir)), self.log) \
            if mode == "persona" else data.inputs
        backbone = resolve_model(cfg.model)
        chosen, rejected = encode_pairs(ScalarRMEncoder.for_model(backbone, cfg.max_length), inputs, mode,
                                        cfg.top_k_profile)
        self.log(f"{mode}: {len(inputs)} training pairs of {data.users} seen users ({data.cold_start_users_excluded} "
                 f"cold-start users never trained on), {sum(map(len, chosen + rejected)) / (2 * len(chosen)):.0f} "
                 f"tokens per sequence")
        learner = LearnerGroup(cfg.learner.model_copy(update={"model": backbone, "mini_batch_size": None,
                                                               "seed": self.recipe.seed}))
        tracker = make_tracker(self.recipe.tracking, mdir, f"{self.recipe.name}/rm_{mode}",
                               tags={"stage": "train_rm", "input_mode": mode})
        try:
            with tracker:
                tracker.log_params(cfg.model_dump(mode="json"))
                found = read_checkpoint(mdir / "checkpoints", learner)
                first, history = (int(found[1]["step"]), found[1]["history"]) if found else (0, [])
                if found:
                    self.log(f"{mode}: resumed from {found[0]}")
                for step in range(first, cfg.steps):
                    rows = step_pairs(len(chosen), cfg.batch_size, step, self.recipe.seed)
                    metrics = learner.update_reward_model({"chosen_ids": [chosen[i] for i in rows],
                                                           "rejected_ids": [rejected[i] for i in rows],
                                                           "margin": [cfg.margin] * len(rows)}, cfg.lr_at(step))
                    history.append({"step": step, **metrics})
                    tracker.log_metrics(metrics, step=step + 1)
                    self.on_step(mode, step + 1, cfg.steps, metrics)
                    if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
                        write_checkpoint(mdir / "checkpoints", learner, step + 1, step + 1,
                                         {"step": step + 1, "history": history}, keep=cfg.keep_checkpoints)
                learner.export_model(model_dir)
                (mdir / "history.json").write_text(json.dumps(history))
                mark_complete(model_dir)
        finally:
            learner.shutdown()
        return model_dir

    def evaluate(self, mode: str, model_dir: Path) -> dict:
        """`pr-rlhf eval` on ``mode``'s RM as a Ray task (reused when its result is complete)."""
        import ray

        out = self.out / mode / "eval"
        if is_complete(out):
            return json.loads((out / "result.json").read_text())
        task = ray.remote(**rm_eval_task(self.cfg, ray.cluster_resources().get("GPU", 0.0)).options())(_evaluate)
        result = ray.get(task.remote(eval_recipe(self.recipe, mode, model_dir, out)))
        result["model"] = str(model_dir)
        (out / "result.json").write_text(json.dumps(result))
        mark_complete(out)
        return result

    def run(self) -> dict[str, dict]:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "recipe.yaml").write_text(dump_recipe(self.recipe))
        results = {}
        for mode in self.cfg.input_modes:
            results[mode] = self.evaluate(mode, self.train(mode))
            s = results[mode]["summary"]
            self.log(f"{mode}: held-out accuracy {100 * s['accuracy']:.1f} [{100 * s['ci_low']:.1f}, "
                     f"{100 * s['ci_high']:.1f}] on {s['n']} pairs")
        return results


def run_train_rm(recipe: Recipe, address: str | None = None, *, on_step: StepCallback | None = None,
                 log: Callable[[str], None] = print) -> tuple[dict[str, dict], list[dict], Any]:
    """The recipe's world built into its shards when absent, Ray joined at ``address`` (else a local Ray), every
    mode's RM trained and evaluated, then the report. Returns (results per mode, report rows, report files)."""
    from pr_rlhf.eval.runner import shard_references
    from pr_rlhf.rm.report import user_groups, write_rm_report
    from workers.ray_utils import check_resources, start_driver

    cfg = recipe.rm
    if cfg is None:
        raise ValueError("the recipe has no rm: section")
    if "persona" in cfg.input_modes:
        raise ValueError("rm.input_modes: 'persona' is trained and scored by `pr-rlhf leaderboard` "
                         "(leaderboard.bt_rm.input_modes); `pr-rlhf train-rm` evaluates through `pr-rlhf eval`, "
                         "which induces no personas")
    start_driver(address, cpus_needed(rm_groups(cfg, 0.0)), shards=cfg.shards, world=cfg.world, log=log)
    check_resources(recipe, "train-rm", log=log)
    results = RMTrainer(recipe, on_step=on_step, log=log).run()
    groups = user_groups(cfg.shards, next(iter(results.values()))["predictions"]) if results else {}
    rows, files = write_rm_report(cfg.out, results, shard_references(cfg.shards),
                                  title=f"{recipe.name}: Bradley-Terry reward models", seed=recipe.seed,
                                  groups=groups)
    return results, rows, files
