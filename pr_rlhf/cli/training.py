"""Policies and reward models trained on Ray: `pr-rlhf train` (GRPO / PPO with personalized rewards), `rl-sweep`
(that run once per reward arm) and `train-rm` (Bradley-Terry reward models, one per input mode)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from pr_rlhf.cli.prologue import AddressOpt, OverridesOpt, RecipeCommand, console, fail, open_recipe, out_option
from pr_rlhf.configs.recipe import Recipe

TRAIN = RecipeCommand("train", ("train",), out_field="train.out",
                      headline=lambda r: f"{r.train.algorithm} -> {r.train.out}")
RL_SWEEP = RecipeCommand("rl-sweep", ("train", "rl_sweep"), out_field="rl_sweep.out",
                         headline=lambda r: f"{', '.join(r.rl_sweep.arms)} -> {r.rl_sweep.out}")
TRAIN_RM = RecipeCommand("train-rm", ("rm",), out_field="rm.out",
                         headline=lambda r: f"{', '.join(r.rm.input_modes)} -> {r.rm.out}")


def train(recipe: Path = typer.Argument(..., help="recipe YAML with train: and reward: sections"),
          overrides: Optional[List[str]] = OverridesOpt,
          out: Optional[Path] = out_option("run directory (train.out)"),
          address: Optional[str] = AddressOpt) -> None:
    """GRPO or PPO with personalized rewards on Ray (rollout workers, reward pool, FSDP learners)."""
    run_train_stage(open_recipe(TRAIN, recipe, overrides, out=out), address)


def run_train_stage(recipe: Recipe, address: Optional[str] = None):
    from workers.controller import run_rl

    cfg = recipe.train

    def on_step(m: dict) -> None:
        line = (f"step {m['step'] + 1:>4}/{cfg.steps}  reward {m['reward/mean']:+.3f} +- {m['reward/std']:.3f}  "
                f"kl {m.get('actor/kl_loss', m.get('train/kl', float('nan'))):.4f}  "
                + (f"{m['rollout/tokens_per_s']:.0f} tok/s" if "rollout/tokens_per_s" in m else
                   f"staleness {m['rollout/staleness']:.0f}, is-weight {m['actor/is_weight_mean']:.3f}"))
        if "eval/heldout_reward_mean" in m:
            line += f"  held-out reward {m['eval/heldout_reward_mean']:+.3f}"
        console.print(line, highlight=False)

    result, rise = run_rl(recipe, address, on_step=on_step, log=console.print)
    first, last = result.evals[0], result.evals[-1]
    console.print(f"[green]done[/] held-out reward {first['eval/heldout_reward_mean']:+.3f} (step {first['step']})"
                  f" -> {last['eval/heldout_reward_mean']:+.3f} (step {last['step']}): rise {rise['rise']:+.3f} "
                  f"[95% CI {rise['ci_low']:+.3f}, {rise['ci_high']:+.3f}], paired over {rise['prompts']} "
                  f"prompts; run dir {result.run_dir}", highlight=False)
    return result, rise


def rl_sweep(recipe: Path = typer.Argument(..., help="recipe YAML with train: and rl_sweep: sections"),
             overrides: Optional[List[str]] = OverridesOpt,
             out: Optional[Path] = out_option("sweep folder (rl_sweep.out)"),
             address: Optional[str] = AddressOpt) -> None:
    """The train: run once per reward arm (same policy, prompts, steps, seed), compared on train.downstream:
    sweep.md/json/png (each arm vs the baseline, per population-agreement group) and correlation.md (benchmark
    accuracy vs downstream)."""
    resolved = open_recipe(RL_SWEEP, recipe, overrides, out=out)
    from workers.rl_sweep import run_rl_sweep

    def on_step(arm: str, m: dict) -> None:
        line = f"{arm:>12} step {m['step'] + 1:>4}/{resolved.train.steps}  reward {m['reward/mean']:+.3f}"
        if "eval/downstream_mean" in m:
            line += f"  held-out downstream {m['eval/downstream_mean']:+.3f}"
        console.print(line, highlight=False)

    result = run_rl_sweep(resolved, address, on_step=on_step, log=console.print)
    console.print(result["files"].markdown.read_text(), highlight=False, soft_wrap=True)


def train_rm(recipe: Path = typer.Argument(..., help="recipe YAML with an rm: section"),
             overrides: Optional[List[str]] = OverridesOpt,
             out: Optional[Path] = out_option("run directory (rm.out)"),
             address: Optional[str] = AddressOpt) -> None:
    """Train Bradley-Terry scalar reward models on the learner ranks, one per input mode (w/o profile, w/ profile,
    w/ plan), export each as an HF model folder, evaluate it on held-out pairs, and write the per-mode report."""
    run_train_rm_stage(open_recipe(TRAIN_RM, recipe, overrides, out=out), address)


def run_train_rm_stage(recipe: Recipe, address: Optional[str] = None):
    from pr_rlhf.rm.data import TrainingDataError
    from pr_rlhf.shards import ShardError
    from workers.rm_training import run_train_rm

    def on_step(mode: str, done: int, total: int, m: dict) -> None:
        if done == total or done % max(1, total // 10) == 0:
            console.print(f"{mode} {done}/{total}  bt loss {m['rm/bt_loss']:.3f}  batch accuracy "
                          f"{100 * m['rm/accuracy']:.0f}%  lr {m['rm/lr']:.1e}", highlight=False)

    try:
        results, rows, files = run_train_rm(recipe, address, on_step=on_step, log=console.print)
    except (TrainingDataError, ShardError) as exc:
        fail(str(exc))
    console.print(files.markdown.read_text(), highlight=False)
    console.print(f"[green]wrote[/] {files.markdown}, {files.json}, {files.figure}")
    return results, rows

