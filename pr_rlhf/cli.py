"""`pr-rlhf`: the command line. Imports only typer, rich, pydantic and yaml at start-up (no torch, no Ray),
so `--help` and recipe validation answer fast; heavy modules load inside the command that needs them."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from pr_rlhf.configs.recipe import Recipe, RecipeError, SourceName, dump_recipe, load_recipe

app = typer.Typer(help="pr_rlhf: Ray-distributed RLHF for personalized reward models.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
data_app = typer.Typer(help="Build and inspect Arrow shards of profiles, rubrics and preference pairs.",
                       no_args_is_help=True)
app.add_typer(data_app, name="data")
report_app = typer.Typer(help="Reports from finished runs.", no_args_is_help=True)
app.add_typer(report_app, name="report")
users_app = typer.Typer(help="The reward service's user store (serve.users): export, import, prototypes.",
                        no_args_is_help=True)
app.add_typer(users_app, name="users")
console = Console()
err_console = Console(stderr=True)

OverridesOpt = typer.Option(None, "--set", "-s", help="override a recipe field: a.b.c=value (repeatable)")


def _fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _recipe(path: Optional[Path], overrides: Optional[List[str]]) -> Recipe:
    try:
        return load_recipe(path, overrides or [])
    except RecipeError as exc:
        _fail(str(exc))
        raise  # unreachable: keeps type checkers quiet


@app.command()
def check(recipe: Path = typer.Argument(..., help="recipe YAML"), overrides: Optional[List[str]] = OverridesOpt,
          show: bool = typer.Option(False, help="print the fully resolved recipe")) -> None:
    """Validate a recipe (and overrides) without running anything."""
    resolved = _recipe(recipe, overrides)
    if show:
        console.print(dump_recipe(resolved), highlight=False)
    console.print(f"[green]ok[/] {recipe}")


@app.command()
def plan(recipe: Path = typer.Argument(..., help="recipe YAML (train:, rl_sweep:, pgenrm:, bon: or rm:)"),
         nodes: int = typer.Option(..., "--nodes", help="GPU nodes (the head that runs the driver is extra)"),
         gpus_per_node: int = typer.Option(..., "--gpus-per-node"),
         gpu_mem_gb: float = typer.Option(..., "--gpu-mem-gb", help="memory of one GPU in GiB (an 80 GB H100: 80)"),
         host_mem_gb: float = typer.Option(..., "--host-mem-gb", help="host memory of one node in GiB"),
         model_config: Optional[List[str]] = typer.Option(
             None, "--model-config", help="MODEL=path/config.json (or its folder): the config of a model the recipe "
                                          "names, e.g. one not on this machine (repeatable)"),
         nvlink_gb_s: Optional[float] = typer.Option(None, "--nvlink-gb-s", help="assumed weight-sync bandwidth "
                                                     "inside a node, GB/s (default 100)"),
         network_gb_s: Optional[float] = typer.Option(None, "--network-gb-s", help="assumed weight-sync bandwidth "
                                                      "between nodes, GB/s (default 25)"),
         overrides: Optional[List[str]] = OverridesOpt) -> None:
    """Will the recipe's actors fit NODES x GPUS-PER-NODE GPUs? GPU and host memory of every actor per node, the
    weight sync per step; exit 2 naming the resource and the actor when they do not (pr_rlhf/planning.py)."""
    from pr_rlhf.planning import NETWORK_GB_S, NVLINK_GB_S, PlanError, make_plan, parse_model_configs

    resolved = _recipe(recipe, overrides)
    try:
        result = make_plan(resolved, str(recipe), nodes, gpus_per_node, gpu_mem_gb, host_mem_gb,
                           parse_model_configs(model_config), nvlink_gb_s or NVLINK_GB_S,
                           network_gb_s or NETWORK_GB_S)
    except PlanError as exc:
        _fail(f"{recipe}: {exc}")
        raise
    print_plan(result)
    if not result.fits:
        _fail(f"{recipe} does not fit {nodes} node(s) x {gpus_per_node} GPUs x {gpu_mem_gb:g} GiB, "
              f"{host_mem_gb:g} GiB host:\n  " + "\n  ".join(result.problems))
    console.print(f"[green]fits[/] {nodes} node(s) x {gpus_per_node} GPUs x {gpu_mem_gb:g} GiB, {host_mem_gb:g} GiB "
                  "host per node", highlight=False)


def print_plan(result) -> None:
    """The plan per phase: a table of its GPU nodes (alike actors side by side in one row), the arithmetic behind
    each kind of actor, the weight sync; CPU-only phases one line each."""
    from pr_rlhf.planning import node_rows

    gib = 2 ** 30
    console.print(f"[bold]plan[/] {result.recipe}: {result.nodes} node(s) x {result.gpus_per_node} GPUs of "
                  f"{result.gpu_gib:g} GiB, {result.host_gib:g} GiB host per node", highlight=False)
    for spec, arch in result.models.items():
        size = f"{arch.params() / 1e9:.3f}B parameters ({arch.source})" if arch else "size unknown"
        console.print(f"  model {spec}: {size}", highlight=False, soft_wrap=True)
    for pp in result.phases:
        gpu_total = sum(p.actor.gpus for p in pp.placed if p.actor.gpus)
        if not gpu_total:
            host = max(pp.host_used) / gib
            workers = sum(not p.actor.driver for p in pp.placed)
            console.print(f"[bold]{pp.phase.name}[/]: CPU only, {workers} worker(s) besides the driver, at most "
                          f"{host:.1f} GiB host on a node", highlight=False)
            continue
        table = Table(title=f"{pp.phase.name}: {gpu_total:g} of {result.nodes * result.gpus_per_node} GPUs",
                      title_justify="left")
        for col, justify in (("node", "left"), ("actor", "left"), ("GPUs", "right"), ("GiB/GPU", "right"),
                             ("host GiB", "right")):
            table.add_column(col, justify=justify)
        for row in node_rows(result, pp):
            cells = (row.node, row.actors, row.gpus, row.gpu, row.host)
            table.add_row(*(f"[bold]{c}[/]" for c in cells) if row.total else cells, end_section=row.total)
        console.print(table)
        for group in pp.phase.groups:
            console.print(f"  {group.label}: {group.detail}", highlight=False, soft_wrap=True)
        if pp.sync_line:
            console.print(f"  {pp.sync_line}", highlight=False, soft_wrap=True)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    for assumption in result.assumptions:
        console.print(f"assumed: {assumption}", highlight=False, soft_wrap=True)


@data_app.command("build")
def data_build(
    source: Optional[SourceName] = typer.Option(None, help="synthetic | prb | lamp_qa | personal_rewardbench | dsp"),
    input: Optional[str] = typer.Option(None, "--input", "-i", help="local directory, or an HF dataset name"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="output shard directory"),
    embedder: Optional[str] = typer.Option(None, help="minilm (shipped) | bm25 | local encoder path"),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="profile items retrieved per query"),
    skip_invalid: bool = typer.Option(False, "--skip-invalid", help="skip, count and report invalid records"),
    encoding_errors: Optional[str] = typer.Option(None, "--encoding-errors",
                                                  help="strict (default: bytes that are not UTF-8 make the record "
                                                       "invalid) | replace (read them as U+FFFD, count the records)"),
    recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="recipe YAML (data: and world: sections)"),
    overrides: Optional[List[str]] = OverridesOpt,
) -> None:
    """Load a source, validate every record, retrieve top-k profile items, write Arrow shards + manifest."""
    cli_overrides = list(overrides or [])
    for key, value in (("data.source", source), ("data.input", input), ("data.out", out),
                       ("data.retrieval.embedder", embedder), ("data.retrieval.top_k", top_k),
                       ("data.encoding_errors", encoding_errors)):
        if value is not None:
            cli_overrides.append(f"{key}={json.dumps(str(value)) if isinstance(value, (str, Path)) else value}")
    if skip_invalid:
        cli_overrides.append("data.skip_invalid=true")
    run_data_stage(_recipe(recipe, cli_overrides))


def run_data_stage(recipe: Recipe):
    """`data build` (and the quickstart's first stage): the shards, with a status line per step, then the report."""
    from data_pipelines.build import build_shards
    from pr_rlhf.records import InvalidRecordError

    try:
        report = build_shards(recipe.data, recipe.world, progress=True,
                              on_stage=lambda s: console.print(f"[bold cyan]>[/] {s}", highlight=False))
    except InvalidRecordError as exc:
        _fail(f"{exc}\n(use --skip-invalid to skip invalid records, count them and keep going)")
        raise
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
        raise
    print_build_report(report)
    return report


def print_build_report(report) -> None:
    console.print(f"[green]wrote[/] {report.out_dir} ({report.records} records, "
                  + ", ".join(f"{k} {v:.1f}s" for k, v in report.seconds.items()) + ")")
    if report.replaced:
        console.print(f"[yellow]replaced undecodable bytes with U+FFFD in {report.replaced} records[/] "
                      "(--encoding-errors replace)")
    if report.skipped or report.issues:
        console.print(f"[yellow]skipped {report.skipped} invalid records[/] ({len(report.issues)} issues, "
                      f"listed in {report.out_dir / 'issues.jsonl'}):")
        for issue in report.issues[:10]:
            console.print(f"  {issue}", highlight=False, soft_wrap=True)
        if len(report.issues) > 10:
            console.print(f"  ... and {len(report.issues) - 10} more")
    print_manifest_summary(report.manifest)


def print_manifest_summary(manifest: dict) -> None:
    table = Table(title=f"shards: source={manifest['source']} schema={manifest['schema_version']}")
    table.add_column("table")
    table.add_column("split")
    table.add_column("subset")
    table.add_column("rows", justify="right")
    for name, splits in manifest["counts"].items():
        for split, subsets in splits.items():
            for subset, n in subsets.items():
                table.add_row(name, split, subset or "-", str(n))
    console.print(table)
    files = manifest["files"]
    console.print(f"{len(files)} shard files, {sum(f['bytes'] for f in files) / 1e6:.2f} MB "
                  f"({manifest['shard_config']['compression']})")
    summary = manifest.get("summary") or {}
    for key, who in (("reference", "seen users, history of 3 pairs"),
                     ("reference_cold_start", "cold-start users, history of 1 pair")):
        if summary.get(key):
            print_reference_table(summary[key], f"reference accuracies on held-out pairs: {who}")


def print_reference_table(refs: dict, title: str) -> None:
    table = Table(title=title)
    table.add_column("predictor")
    table.add_column("accuracy", justify="right")
    table.add_column("95% CI", justify="right")
    table.add_column("pairs", justify="right")
    for name, est in refs.items():
        table.add_row(name, f"{100 * est['accuracy']:.1f}%",
                      f"[{100 * est['ci_low']:.1f}, {100 * est['ci_high']:.1f}]", str(est["n"]))
    console.print(table)


@data_app.command("export-verl")
def data_export_verl(shards: Path = typer.Option(..., help="shard directory (`pr-rlhf data build`)"),
                     out: Path = typer.Option(..., "--out", "-o", help="where train.parquet / test.parquet go"),
                     top_k: int = typer.Option(10, help="profile posts in each prompt and in extra_info")) -> None:
    """Shards -> verl's RL parquet (prompt messages; user id, query and profile in extra_info for
    pr_rlhf.integrations.verl.compute_score)."""
    from data_pipelines.verl_export import export_verl

    try:
        counts = export_verl(shards, out, top_k)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
        raise
    console.print(f"wrote {out}/train.parquet ({counts['train']} rows), {out}/test.parquet ({counts['test']} rows)",
                  highlight=False)


@data_app.command("inspect")
def data_inspect(directory: Path = typer.Argument(..., help="shard directory"),
                 verify: bool = typer.Option(True, help="check content hashes"),
                 show: int = typer.Option(1, help="print this many example records per table")) -> None:
    """Summarize a shard directory: counts per table/split/subset, files, hashes, example records."""
    from pr_rlhf.shards import ShardError, ShardReader

    try:
        reader = ShardReader(directory, verify=verify)
    except ShardError as exc:
        _fail(str(exc))
    print_manifest_summary(reader.manifest)
    if verify:
        console.print("[green]content hashes match the manifest[/]")
    for table_name in reader.manifest["counts"]:
        for i, row in enumerate(reader.iter_rows(table_name)):
            if i >= show:
                break
            console.print(f"[bold]{table_name}[/] example:", _abbreviate(row), highlight=False, soft_wrap=True)


def _abbreviate(value, limit: int = 120):
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + "..."
    if isinstance(value, list):
        return [_abbreviate(v, limit) for v in value[:3]] + (["..."] if len(value) > 3 else [])
    if isinstance(value, dict):
        return {k: _abbreviate(v, limit) for k, v in value.items()}
    return value


@app.command("eval")
def eval_cmd(recipe: Path = typer.Argument(..., help="recipe YAML with an eval: section"),
             overrides: Optional[List[str]] = OverridesOpt,
             out: Optional[Path] = typer.Option(None, "--out", "-o", help="run directory (eval.out)")) -> None:
    """Evaluate reward models on benchmark shards: pointwise and pairwise, w/o profile, w/ profile, w/ plan."""
    extra = [f"eval.out={json.dumps(str(out))}"] if out else []
    resolved = _recipe(recipe, list(overrides or []) + extra)
    run_eval_stage(resolved)


def run_eval_stage(recipe: Recipe):
    from pr_rlhf.eval.runner import EvalError, run_eval
    from pr_rlhf.shards import ShardError

    console.rule(f"[bold]eval[/] {recipe.eval.shards} -> {recipe.eval.out}")
    try:
        result = run_eval(recipe, on_stage=lambda s: console.print(f"[bold cyan]>[/] {s}", highlight=False))
    except (EvalError, ShardError) as exc:
        _fail(str(exc))
    print_eval_table(result.report.summaries, title=f"{recipe.name}: {result.n_pairs} pairs")
    if result.model_rows:
        print_models_table(result.model_rows, recipe.eval.label, title=f"{recipe.name}: every model, same pairs")
    console.print(f"[green]wrote[/] {', '.join(str(p) for p in result.report.paths)} (full table: "
                  f"{result.report.markdown})")
    return result


def print_eval_table(summaries: dict, title: str) -> None:
    """The headline columns of the eval report; the markdown file has every column."""
    table = Table(title=title)
    for col, justify in (("mode/inputs", "left"), ("n", "right"), ("accuracy [95% CI]", "right"),
                         ("ties", "right"), ("failures", "right"), ("bias", "right")):
        table.add_column(col, justify=justify)
    for group, s in summaries.items():
        bias = "-" if s.get("position_bias") is None else f"{100 * s['position_bias']:.1f}"
        table.add_row(group, str(s["n"]), f"{100 * s['accuracy']:.1f} [{100 * s['ci_low']:.1f}, "
                      f"{100 * s['ci_high']:.1f}]", str(s["ties"]), str(s["failures"]), bias)
    console.print(table)


def print_models_table(rows: list[dict], floor: str, title: str) -> None:
    """eval.models' cells beside the section's own (pr_rlhf.eval.models.model_rows)."""
    from pr_rlhf.eval.report import fmt_paired_gain

    table = Table(title=title)
    for col, justify in (("model", "left"), ("mode/inputs", "left"), ("n", "right"),
                         ("accuracy [95% CI]", "right"), ("unparsed", "right"), (f"vs {floor}, paired", "right")):
        table.add_column(col, justify=justify, no_wrap=col in ("model", "mode/inputs"))
    for r in rows:
        s = r["summary"]
        table.add_row(r["model"], r["cell"], str(s["n"]), f"{100 * s['accuracy']:.1f} [{100 * s['ci_low']:.1f}, "
                      f"{100 * s['ci_high']:.1f}]", str(s["failures"]), fmt_paired_gain(r.get("vs_floor")))
    console.print(table)


@app.command()
def train(recipe: Path = typer.Argument(..., help="recipe YAML with train: and reward: sections"),
          overrides: Optional[List[str]] = OverridesOpt,
          out: Optional[Path] = typer.Option(None, "--out", "-o", help="run directory (train.out)"),
          address: Optional[str] = typer.Option(None, help="Ray address; default: the cluster this job runs in "
                                                           "(ray job submit), else a private local Ray")) -> None:
    """GRPO or PPO with personalized rewards on Ray (rollout workers, reward pool, FSDP learners)."""
    extra = [f"train.out={json.dumps(str(out))}"] if out else []
    resolved = _recipe(recipe, list(overrides or []) + extra)
    if resolved.train is None:
        _fail(f"{recipe}: no train: section")
    run_train_stage(resolved, address)


def run_train_stage(recipe: Recipe, address: Optional[str] = None):
    from workers.controller import run_rl

    cfg = recipe.train
    console.rule(f"[bold]train[/] {cfg.algorithm} -> {cfg.out}")

    def on_step(m: dict) -> None:
        line = (f"step {m['step'] + 1:>4}/{cfg.steps}  reward {m['reward/mean']:+.3f} +- {m['reward/std']:.3f}  "
                f"kl {m.get('actor/kl_loss', m.get('train/kl', float('nan'))):.4f}  "
                f"{m['rollout/tokens_per_s']:.0f} tok/s")
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


@app.command("rl-sweep")
def rl_sweep(recipe: Path = typer.Argument(..., help="recipe YAML with train: and rl_sweep: sections"),
             overrides: Optional[List[str]] = OverridesOpt,
             out: Optional[Path] = typer.Option(None, "--out", "-o", help="sweep folder (rl_sweep.out)"),
             address: Optional[str] = typer.Option(None, help="Ray address; default: the cluster this job runs "
                                                              "in (ray job submit), else a private local Ray")) -> None:
    """The train: run once per reward arm (same policy, prompts, steps, seed), compared on train.downstream:
    sweep.md/json/png (each arm vs the baseline, per population-agreement group) and correlation.md (benchmark
    accuracy vs downstream)."""
    extra = [f"rl_sweep.out={json.dumps(str(out))}"] if out else []
    resolved = _recipe(recipe, list(overrides or []) + extra)
    if resolved.train is None or resolved.rl_sweep is None:
        _fail(f"{recipe}: rl-sweep needs train: and rl_sweep: sections")
    from workers.rl_sweep import run_rl_sweep

    console.rule(f"[bold]rl-sweep[/] {', '.join(resolved.rl_sweep.arms)} -> {resolved.rl_sweep.out}")

    def on_step(arm: str, m: dict) -> None:
        line = f"{arm:>12} step {m['step'] + 1:>4}/{resolved.train.steps}  reward {m['reward/mean']:+.3f}"
        if "eval/downstream_mean" in m:
            line += f"  held-out downstream {m['eval/downstream_mean']:+.3f}"
        console.print(line, highlight=False)

    result = run_rl_sweep(resolved, address, on_step=on_step, log=console.print)
    console.print(result["files"].markdown.read_text(), highlight=False, soft_wrap=True)


@app.command("train-rm")
def train_rm(recipe: Path = typer.Argument(..., help="recipe YAML with an rm: section"),
             overrides: Optional[List[str]] = OverridesOpt,
             out: Optional[Path] = typer.Option(None, "--out", "-o", help="run directory (rm.out)"),
             address: Optional[str] = typer.Option(None, help="Ray address; default: the cluster this job runs "
                                                              "in (ray job submit), else a private local Ray")) -> None:
    """Train Bradley-Terry scalar reward models on the learner ranks, one per input mode (w/o profile, w/ profile,
    w/ plan), export each as an HF model folder, evaluate it on held-out pairs, and write the per-mode report."""
    extra = [f"rm.out={json.dumps(str(out))}"] if out else []
    resolved = _recipe(recipe, list(overrides or []) + extra)
    if resolved.rm is None:
        _fail(f"{recipe}: no rm: section")
    run_train_rm_stage(resolved, address)


def run_train_rm_stage(recipe: Recipe, address: Optional[str] = None):
    from pr_rlhf.rm.data import TrainingDataError
    from pr_rlhf.shards import ShardError
    from workers.rm_training import run_train_rm

    cfg = recipe.rm
    console.rule(f"[bold]train-rm[/] {', '.join(cfg.input_modes)} -> {cfg.out}")

    def on_step(mode: str, done: int, total: int, m: dict) -> None:
        if done == total or done % max(1, total // 10) == 0:
            console.print(f"{mode} {done}/{total}  bt loss {m['rm/bt_loss']:.3f}  batch accuracy "
                          f"{100 * m['rm/accuracy']:.0f}%  lr {m['rm/lr']:.1e}", highlight=False)

    try:
        results, rows, files = run_train_rm(recipe, address, on_step=on_step, log=console.print)
    except (TrainingDataError, ShardError) as exc:
        _fail(str(exc))
    console.print(files.markdown.read_text(), highlight=False)
    console.print(f"[green]wrote[/] {files.markdown}, {files.json}, {files.figure}")
    return results, rows


@app.command()
def pgenrm(recipe: Path = typer.Argument(..., help="recipe YAML with a pgenrm: section"),
           stage: Optional[List[str]] = typer.Option(None, "--stage", help="run only this stage (repeatable): base, "
                                                     "psi, cre, curriculum, control, cre_no_pr, "
                                                     "cre_no_or, planner"),
           overrides: Optional[List[str]] = OverridesOpt,
           out: Optional[Path] = typer.Option(None, "--out", "-o", help="run directory (pgenrm.out)"),
           address: Optional[str] = typer.Option(None, help="Ray address; default: the cluster this job runs in "
                                                            "(ray job submit), else a private local Ray")) -> None:
    """Train P-GenRM on Ray: PSI (SFT on oracle chains) -> CRE (GRPO, process + outcome reward) -> hard-negative
    curriculum, each stage evaluated by `pr-rlhf eval` on seen and cold-start users; then the ablation report."""
    extra = [f"pgenrm.out={json.dumps(str(out))}"] if out else []
    resolved = _recipe(recipe, list(overrides or []) + extra)
    if resolved.pgenrm is None:
        _fail(f"{recipe}: no pgenrm: section")
    run_pgenrm_stage(resolved, list(stage or []) or None, address)


@app.command()
def headroom(recipe: Path = typer.Argument(..., help="recipe YAML with a pgenrm: section"),
             model: Optional[Path] = typer.Option(None, "--model", help="also measure this trained GenRM (default: "
                                                  "the run's PSI model when that stage is complete)"),
             overrides: Optional[List[str]] = OverridesOpt) -> None:
    """The headroom check before RL on the GenRM: on the evaluation pairs, the teacher's expected accuracy vs the
    best rule available from the student's inputs vs the Bayes oracle, per design, and the gate's verdict; on a
    trained model greedy, maj@k, pass@k, mixed decisions and the entropy at the decision token. Writes
    <pgenrm.out>/headroom.json (and headroom_model.json with a model)."""
    from pr_rlhf.files import atomic_write_text, is_complete
    from pr_rlhf.pgenrm.headroom import headroom_markdown, pipeline_headroom, sampled_model_headroom
    from pr_rlhf.world.generator import build_world

    resolved = _recipe(recipe, list(overrides or []))
    cfg = resolved.pgenrm
    if cfg is None:
        _fail(f"{recipe}: no pgenrm: section")
        return
    world = build_world(cfg.world)
    offline = pipeline_headroom(cfg, resolved.seed, world)
    out = Path(cfg.out)
    atomic_write_text(out / "headroom.json", json.dumps(offline, indent=1))
    psi_model = out / "psi" / "model"
    model_dir = model or (psi_model if is_complete(out / "psi") else None)
    measured = None
    if model_dir is not None:
        if not (Path(model_dir) / "config.json").is_file():
            _fail(f"--model {model_dir}: not a model directory (no config.json)")
        console.print(f"sampling {cfg.headroom.prompts} prompts x {cfg.headroom.k} chains of {model_dir} ...")
        measured = sampled_model_headroom(str(model_dir), world, cfg, resolved.seed)
        atomic_write_text(out / "headroom_model.json", json.dumps({"model": str(model_dir), **measured}, indent=1))
    typer.echo(headroom_markdown(offline, measured))


def run_pgenrm_stage(recipe: Recipe, stages: Optional[List[str]] = None, address: Optional[str] = None):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pr_rlhf.configs.pgenrm import STAGE_PARENT
    from workers.pgenrm import HeadroomGateError, StageOrderError, run_pgenrm

    cfg = recipe.pgenrm
    for s in stages or []:
        if s not in STAGE_PARENT:
            _fail(f"--stage {s!r}: expected one of {', '.join(STAGE_PARENT)}")
    console.rule(f"[bold]pgenrm[/] {' -> '.join(stages or cfg.stages)} -> {cfg.out}")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}"), console=console, transient=False) as progress:
        bars: dict[str, int] = {}

        def on_step(stage: str, done: int, total: int, m: dict) -> None:
            if stage not in bars:
                bars[stage] = progress.add_task(stage, total=total, info="")
            if "reward/mean" in m:
                info = (f"reward {m['reward/mean']:+.3f}  outcome {m['reward/outcome']:.2f}  "
                        f"process {m['reward/process']:.2f}  parsed {m['reward/parse_rate']:.0%}")
            else:
                info = f"nll {m.get('sft/nll', float('nan')):.3f}  lr {m.get('sft/lr', 0):.1e}"
            progress.update(bars[stage], completed=done, info=info)
            if not console.is_terminal and (done % max(1, total // 10) == 0 or done == total):
                progress.console.print(f"{stage} {done}/{total}  {info}", highlight=False)  # logs of ray jobs

        try:
            results, report = run_pgenrm(recipe, stages, address, on_step=on_step,
                                         on_event=lambda msg: progress.console.print(msg), log=console.print)
        except (StageOrderError, HeadroomGateError) as exc:
            _fail(str(exc))
            raise
    print_pgenrm_table(results)
    if report is not None:
        console.print(f"ablation report: {report.markdown}, {report.figure}", highlight=False)
    return results


def print_pgenrm_table(results: dict) -> None:
    """Each stage's accuracies on seen, hard and cold-start pairs (the planner's aspect precision and recall)."""
    table = Table(title="P-GenRM stages (pairwise accuracy %, 95% CI)")
    for col in ("stage", "seen users", "hard pairs", "cold-start users", "unparsed seen / cold", "ties seen / cold",
                "minutes"):
        table.add_column(col)
    for name, r in results.items():
        if "planner" in r:
            for model, m in r["planner"].items():
                console.print(f"planner ({model}): aspect precision {m['precision']['mean']:.2f} "
                              f"[{m['precision']['ci_low']:.2f}, {m['precision']['ci_high']:.2f}], recall "
                              f"{m['recall']['mean']:.2f} [{m['recall']['ci_low']:.2f}, {m['recall']['ci_high']:.2f}] "
                              f"on {m['queries']} held-out queries; {m['parse_failures']} unparsed", highlight=False)
            continue
        seen, cold = r["seen"]["summary"], r["cold"]["summary"]
        hard = r["seen"].get("hardness", {}).get("hard", {})
        table.add_row(name, f"{100 * seen['accuracy']:.1f} [{100 * seen['ci_low']:.1f}, {100 * seen['ci_high']:.1f}]",
                      f"{100 * hard.get('accuracy', float('nan')):.1f}",
                      f"{100 * cold['accuracy']:.1f} [{100 * cold['ci_low']:.1f}, {100 * cold['ci_high']:.1f}]",
                      f"{seen['failures']} / {cold['failures']}", f"{seen.get('ties', 0)} / {cold.get('ties', 0)}",
                      f"{r['seconds'] / 60:.1f}")
    if table.row_count:   # a planner-only run has no GenRM stage rows
        console.print(table)


@app.command()
def scaling(recipe: Path = typer.Argument(..., help="recipe YAML with a scaling: section"),
            overrides: Optional[List[str]] = OverridesOpt,
            address: Optional[str] = typer.Option(None, help="Ray address (default: $RAY_ADDRESS or a local Ray)")):
    """Test-time user-based scaling: accuracy of a trained GenRM at every (m chains, n neighbours) of the grid on
    seen and cold-start users, with the user prototypes built (or loaded) on the way."""
    rec = _recipe(recipe, overrides)
    if rec.scaling is None:
        _fail(f"{recipe}: no scaling: section (see recipes/scaling_grid.yaml)")
    run_scaling_stage(rec, address)


def run_scaling_stage(recipe: Recipe, address: Optional[str] = None) -> dict:
    from workers.scaling import run_scaling

    cfg = recipe.scaling
    console.rule(f"[bold]scaling[/] {cfg.model} -> {cfg.out}")
    if not Path(cfg.model).is_dir():
        _fail(f"scaling.model {cfg.model!r} is not a model directory: train one with `pr-rlhf pgenrm "
              "recipes/pgenrm_pipeline.yaml`, or point scaling.model at a local GenRM")
    result = run_scaling(recipe, address, log=console.print)
    console.print(Path(result["markdown"]).read_text(), highlight=False)
    console.print(f"written: {result['markdown']}, {result['figure']}", highlight=False)
    return result


@app.command()
def bon(recipe: Path = typer.Argument(..., help="recipe YAML with a bon: section"),
        overrides: Optional[List[str]] = OverridesOpt,
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="run directory (default: bon.out)"),
        address: Optional[str] = typer.Option(None, help="Ray address (default: $RAY_ADDRESS or a local Ray)")):
    """Best-of-N sweep: one pool of N samples per prompt, scored once by each reward model and the downstream
    judge; best-of-k curves for every k, the benchmark-validity report (resumes a killed sweep)."""
    rec = _recipe(recipe, [*(overrides or []), *([f"bon.out={out}"] if out is not None else [])])
    if rec.bon is None:
        _fail(f"{recipe}: no bon: section (see recipes/bon_sweep.yaml)")
    run_bon_stage(rec, address)


def run_bon_stage(recipe: Recipe, address: Optional[str] = None) -> dict:
    from workers.bon import run_bon

    cfg = recipe.bon
    console.rule(f"[bold]bon[/] n={cfg.n}, {cfg.prompts} prompts -> {cfg.out}")
    report = run_bon(recipe, address, log=lambda m: console.print(m, highlight=False))
    console.print(Path(cfg.out, "bon.md").read_text(), highlight=False)
    if "validity" in report:
        console.print(f"benchmark validity: {report['validity']}", highlight=False)
    return report


@app.command()
def leaderboard(recipe: Path = typer.Argument(..., help="recipe YAML with a leaderboard: section"),
                overrides: Optional[List[str]] = OverridesOpt,
                out: Optional[Path] = typer.Option(None, "--out", "-o", help="run directory (default: "
                                                                             "leaderboard.out)"),
                address: Optional[str] = typer.Option(None, help="Ray address (default: $RAY_ADDRESS or a local "
                                                                 "Ray)")):
    """The field's personalized reward models (global BT, PAL, LoRe, VPL, GPO on frozen embeddings) trained on the
    same pairs and evaluated on the same pairs as the world's references and reused results (P-GenRM's): accuracy
    with user-resampled CIs, seen and cold-start users, paired differences, per world and pooled (resumes)."""
    import json

    rec = _recipe(recipe, [*(overrides or []), *([f"leaderboard.out={json.dumps(str(out))}"] if out else [])])
    if rec.leaderboard is None:
        _fail(f"{recipe}: no leaderboard: section (see recipes/leaderboard.yaml)")
    from workers.leaderboard import run_leaderboard

    cfg = rec.leaderboard
    console.rule(f"[bold]leaderboard[/] {', '.join(cfg.methods)} on worlds {cfg.worlds} -> {cfg.out}")
    result = run_leaderboard(rec, address, log=lambda m: console.print(m, highlight=False))
    for name in ("leaderboard", "development"):
        if name in result:
            console.print(Path(cfg.out, f"{name}.md").read_text(), highlight=False)


@app.command("serve-reward")
def serve_reward(recipe: Path = typer.Argument(..., help="recipe YAML with a serve: section"),
                 overrides: Optional[List[str]] = OverridesOpt,
                 port: Optional[int] = typer.Option(None, help="HTTP port (default: serve.port)"),
                 address: Optional[str] = typer.Option(None, help="Ray address (default: $RAY_ADDRESS or a local "
                                                                  "Ray)"),
                 detach: bool = typer.Option(False, help="return once deployed (the service stays on the cluster "
                                                         "until `serve shutdown`)")) -> None:
    """The personalized reward as a Ray Serve endpoint (127.0.0.1 by default): /score, /score_batch, OpenRLHF's
    /get_reward, /health. Ctrl-C stops it."""
    import sys

    rec = _recipe(recipe, [*(overrides or []), *([f"serve.port={port}"] if port is not None else [])])
    cfg = rec.serve
    if cfg is None:
        _fail(f"{recipe}: no serve: section (see recipes/serve_reward.yaml)")
    if cfg.auth_token_env and not os.environ.get(cfg.auth_token_env):
        _fail(f"serve.auth_token_env={cfg.auth_token_env!r}: that environment variable is empty; export the token "
              "first (it is read from the environment only, never from the recipe)")
    for tenant, env in cfg.tenant_tokens_env.items():
        if not os.environ.get(env):
            _fail(f"serve.tenant_tokens_env: tenant {tenant!r}'s variable {env!r} is empty; export its token first")
    from workers.reward_service import run_reward_service

    auth = f", bearer token from ${cfg.auth_token_env}" if cfg.auth_token_env else ""

    def ready(url: str) -> None:
        console.print(f"reward service ({cfg.reward.kind}, {cfg.replicas} replica(s){auth}) at {url}  "
                      f"[POST /score, /score_batch, /get_reward; GET /health]"
                      + (" [POST /feedback; GET, DELETE /users/{id}]" if cfg.users is not None else ""),
                      highlight=False)
        sys.stdout.flush()   # seen at once when the output goes to a file or a pipe

    def stopping() -> None:
        console.print("stopping the reward service")
        sys.stdout.flush()   # before the shutdown, which may take a while on a busy machine

    run_reward_service(cfg, address, detach=detach, on_ready=ready, on_stop=stopping)


@report_app.command("correlation")
def report_correlation(
        runs: List[Path] = typer.Argument(..., help="`pr-rlhf bon` output directories (bon.out) or bon.json files"),
        extra: Optional[List[Path]] = typer.Option(None, help="JSON {column: {reward model: downstream value}}, "
                                                              "e.g. each RM's GRPO/PPO final gold reward"),
        out: Optional[Path] = typer.Option(None, help="where correlation.md/.json/.png go (default: the first run)")
) -> None:
    """Benchmark validity: Spearman rho and NDCG between the RMs' benchmark accuracy and their downstream quality
    (best-of-k at every k of each sweep, plus any extra columns)."""
    import json

    from pr_rlhf.bon.correlation import correlation_report, load_bon, write_correlation_report

    try:
        bons = [load_bon(r) for r in runs]
        columns: dict = {}
        for path in extra or []:
            columns.update(json.loads(Path(path).read_text()))
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
        raise
    report = correlation_report(bons, columns, labels=[Path(r).name for r in runs])
    folder = out or (runs[0] if Path(runs[0]).is_dir() else Path(runs[0]).parent)
    md = write_correlation_report(report, folder)
    console.print(md.read_text(), highlight=False)
    console.print(f"written: {md}, {md.with_suffix('.json')}, {md.with_suffix('.png')}", highlight=False)


@report_app.command("ablation")
def report_ablation(run_dir: Path = typer.Argument(..., help="a `pr-rlhf pgenrm` run directory (pgenrm.out)"),
                    seed: int = typer.Option(0, help="bootstrap seed")) -> None:
    """The P-GenRM ablation table (full; w/o curriculum; w/o PR; w/o OR; w/o RL; base) as markdown + PNG."""
    from pr_rlhf.pgenrm.report import write_ablation_report

    try:
        report = write_ablation_report(run_dir, title=f"{run_dir}: P-GenRM ablation", seed=seed)
    except FileNotFoundError as exc:
        _fail(str(exc))
        raise
    console.print(report.markdown.read_text(), highlight=False)
    console.print(f"written: {report.markdown}, {report.figure}, {report.json}", highlight=False)


@report_app.command("compare-rl")
def report_compare_rl(new: Path = typer.Argument(..., help="a finished `pr-rlhf train` run directory"),
                      old: Path = typer.Argument(..., help="the run it is compared with (same held-out prompts)"),
                      seed: int = typer.Option(0, help="bootstrap seed")) -> None:
    """Paired difference of two RL runs' last held-out evaluations over the same prompts (95% bootstrap CI): on
    the downstream scorer (train.downstream) when both have it, else on their own rewards."""
    from pr_rlhf.rl.compare import compare_runs

    try:
        row = compare_runs(new, old, seed)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        _fail(str(exc))
        raise
    console.print(f"{row['measure']} on {row['prompts']} held-out prompts: {row['new_mean']:.4f} (step "
                  f"{row['new_step']}) vs {row['old_mean']:.4f} (step {row['old_step']}): {row['gain']:+.4f} "
                  f"[95% CI {row['ci_low']:+.4f}, {row['ci_high']:+.4f}]", highlight=False)
    console.print(json.dumps(row, indent=1), highlight=False, soft_wrap=True)


@report_app.command("compare")
def report_compare(new: Path = typer.Argument(..., help="a finished stage directory, e.g. runs/pgenrm_b/cre"),
                   old: Path = typer.Argument(..., help="the stage it is compared with, e.g. runs/pgenrm/psi"),
                   contested: Optional[Path] = typer.Option(
                       None, help="contested.json splitting the pairs (default: the one beside OLD, if any)"),
                   seed: int = typer.Option(0, help="bootstrap seed")) -> None:
    """Paired gain of one P-GenRM stage over another on the same held-out pairs (95% bootstrap CI, changed
    verdicts), on all pairs and on contested / other pairs; the stages may come from different runs."""
    import json

    from pr_rlhf.pgenrm.report import compare_stage_dirs, comparisons_markdown, contested_split, type_choice_markdown

    if contested is not None and not contested.is_file():
        _fail(f"{contested}: no such file")
    split = contested_split(contested or old.parent)
    try:
        row = compare_stage_dirs(new, old, split, seed, with_type_choice=True)
    except (FileNotFoundError, KeyError) as exc:
        _fail(str(exc))
        raise
    console.print(comparisons_markdown([row]), highlight=False, soft_wrap=True)
    console.print("How each vote chain chose Type among the latest pair's candidates"
                  + (" (contested pairs):" if split else ":"), highlight=False)
    console.print(type_choice_markdown(row), highlight=False, soft_wrap=True)
    console.print(json.dumps(row, indent=1), highlight=False, soft_wrap=True)


@app.command()
def quickstart(out: Path = typer.Option(Path("runs/quickstart"), "--out", "-o", help="run directory"),
               recipe: Path = typer.Option(Path("recipes/quickstart.yaml"), "--recipe", "-r"),
               overrides: Optional[List[str]] = OverridesOpt) -> None:
    """The main job on the embedded default (local Ray, CPU, no network): the synthetic world's shards, every
    reward-model evaluation mode, the P-GenRM stages (briefly), test-time scaling and Best-of-N with the shipped
    P-GenRM, GRPO with personalized rewards; a summary table, plots and mlflow runs under --out."""
    from pr_rlhf.tracking import ENV_URI
    from workers.quickstart import StageRunners, quickstart_recipe, run_quickstart

    try:
        resolved = quickstart_recipe(recipe, out, list(overrides or []))
    except RecipeError as exc:
        _fail(str(exc))
        raise
    summary = run_quickstart(resolved, out, StageRunners(
        rule=console.rule, data=run_data_stage, eval=run_eval_stage, pgenrm=run_pgenrm_stage,
        scaling=run_scaling_stage, bon=run_bon_stage, train=run_train_stage))
    table = Table(title=f"quickstart summary ({summary.minutes:.1f} min, peak RSS {summary.peak_rss_gb:.2f} GB over "
                        f"the process tree)")
    for col in ("stage", "result", "minutes"):
        table.add_column(col)
    for stage in summary.stages:
        table.add_row(stage.stage, stage.result, f"{stage.seconds / 60:.1f}")
    console.rule("[bold green]done")
    console.print(table)
    console.print(f"everything under {out}/ (summary.json; reports and plots per stage; every stage's mlflow run "
                  f"in {resolved.tracking.mlflow_uri or '$' + ENV_URI})", highlight=False)




def _store_url(url: Optional[str], recipe: Optional[Path]) -> str:
    if (url is None) == (recipe is None):
        _fail("give --url (a SQLAlchemy URL) or --recipe (its serve.users.url), one of them")
    if url is not None:
        return url
    cfg = _recipe(recipe, []).serve
    if cfg is None or cfg.users is None:
        _fail(f"{recipe}: no serve.users section")
    return cfg.users.url


UrlOpt = typer.Option(None, "--url", help="the store's SQLAlchemy URL (sqlite:///path or postgresql+pg8000://...)")
RecipeOpt = typer.Option(None, "--recipe", help="a recipe whose serve.users.url names the store")


@users_app.command("export")
def users_export(out: Path = typer.Argument(..., help="JSONL file to write (one feedback per line)"),
                 url: Optional[str] = UrlOpt, recipe: Optional[Path] = RecipeOpt,
                 tenant: Optional[str] = typer.Option(None, help="one tenant only (default: all)")) -> None:
    """Every stored feedback, in each user's order, with its tenant and idempotency key."""
    from pr_rlhf.files import atomic_write_text
    from pr_rlhf.serve.users import UserStore

    store = UserStore(_store_url(url, recipe))
    rows = [json.dumps(r, ensure_ascii=False) for r in store.export_jsonl(tenant)]
    atomic_write_text(out, "".join(r + "\n" for r in rows))
    console.print(f"exported {len(rows)} feedback rows of {store.count(tenant)[0]} users to {out}", highlight=False)


@users_app.command("import")
def users_import(path: Path = typer.Argument(..., help="a JSONL export"), url: Optional[str] = UrlOpt,
                 recipe: Optional[Path] = RecipeOpt) -> None:
    """Replay an export into a store (safe to repeat: the idempotency keys come along)."""
    from pr_rlhf.serve.users import UserStore, import_jsonl

    try:
        stored, duplicates = import_jsonl(UserStore(_store_url(url, recipe)), path)
    except (OSError, ValueError) as exc:
        _fail(str(exc))
    console.print(f"imported {stored} feedback rows ({duplicates} already stored) from {path}", highlight=False)


@users_app.command("prototypes")
def users_prototypes(out: Path = typer.Argument(..., help="folder for the prototype index"),
                     url: Optional[str] = UrlOpt, recipe: Optional[Path] = RecipeOpt,
                     tenant: str = typer.Option("default", help="whose users"),
                     k: int = typer.Option(8, help="prototypes"), seed: int = typer.Option(0),
                     embedder: str = typer.Option("minilm", help="what embeds each feedback")) -> None:
    """K-means over the stored users' mean feedback vectors: the index serve.users.prototypes places arriving
    users with (one lookup per feedback)."""
    from pr_rlhf.models.embedders import make_embedder
    from pr_rlhf.serve.personalize import build_feedback_prototypes
    from pr_rlhf.serve.users import UserStore

    histories: dict[str, list[tuple[str, str]]] = {}
    for row in UserStore(_store_url(url, recipe)).export_jsonl(tenant):
        histories.setdefault(row["user_id"], []).append((row["chosen"], row["rejected"]))
    try:
        index = build_feedback_prototypes(histories, make_embedder(embedder, cache=False), k, seed=seed)
    except ValueError as exc:
        _fail(str(exc))
    index.save(out)
    console.print(f"{k} prototypes over {len(histories)} users written to {out}", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
