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

from pr_rlhf.configs.recipe import DataConfig, Recipe, RecipeError, SourceName, dump_recipe, load_recipe

app = typer.Typer(help="pr_rlhf: Ray-distributed RLHF for personalized reward models.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
data_app = typer.Typer(help="Build and inspect Arrow shards of profiles, rubrics and preference pairs.",
                       no_args_is_help=True)
app.add_typer(data_app, name="data")
report_app = typer.Typer(help="Reports from finished runs.", no_args_is_help=True)
app.add_typer(report_app, name="report")
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


@data_app.command("build")
def data_build(
    source: Optional[SourceName] = typer.Option(None, help="synthetic | prb | lamp_qa | personal_rewardbench"),
    input: Optional[str] = typer.Option(None, "--input", "-i", help="local directory, or an HF dataset name"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="output shard directory"),
    embedder: Optional[str] = typer.Option(None, help="minilm (shipped) | bm25 | local encoder path"),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="profile items retrieved per query"),
    skip_invalid: bool = typer.Option(False, "--skip-invalid", help="skip, count and report invalid records"),
    recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="recipe YAML (data: and world: sections)"),
    overrides: Optional[List[str]] = OverridesOpt,
) -> None:
    """Load a source, validate every record, retrieve top-k profile items, write Arrow shards + manifest."""
    cli_overrides = list(overrides or [])
    for key, value in (("data.source", source), ("data.input", input), ("data.out", out),
                       ("data.retrieval.embedder", embedder), ("data.retrieval.top_k", top_k)):
        if value is not None:
            cli_overrides.append(f"{key}={json.dumps(str(value)) if isinstance(value, (str, Path)) else value}")
    if skip_invalid:
        cli_overrides.append("data.skip_invalid=true")
    resolved = _recipe(recipe, cli_overrides)
    report = run_data_build(resolved.data, resolved)
    print_build_report(report)


def run_data_build(data: DataConfig, recipe: Recipe):
    """Shared by `data build` and `quickstart`: builds the shards with a status line per stage."""
    from pr_rlhf.records import InvalidRecordError
    from data_pipelines.build import build_shards

    try:
        return build_shards(data, recipe.world, progress=True,
                            on_stage=lambda s: console.print(f"[bold cyan]>[/] {s}", highlight=False))
    except InvalidRecordError as exc:
        _fail(f"{exc}\n(use --skip-invalid to skip invalid records, count them and keep going)")
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))


def print_build_report(report) -> None:
    console.print(f"[green]wrote[/] {report.out_dir} ({report.records} records, "
                  + ", ".join(f"{k} {v:.1f}s" for k, v in report.seconds.items()) + ")")
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
    from workers.controller import RLController, heldout_rise
    from workers.ray_utils import init_ray

    import math
    import os

    cfg = recipe.train
    console.rule(f"[bold]train[/] {cfg.algorithm} -> {cfg.out}")
    if cfg.data.world is not None:
        from data_pipelines.build import ensure_world_shards

        if ensure_world_shards(cfg.data.shards, cfg.data.world):
            console.print(f"built the recipe's synthetic world -> {cfg.data.shards}")
    controller = RLController(recipe, on_step=lambda m: on_step(m))
    # A local Ray offers logical CPUs: enough for every actor of the run, even on a 2-core laptop.
    init_ray(address, num_cpus=max(os.cpu_count() or 1, math.ceil(controller.cpus_needed())))
    table_rows: list[str] = []

    def on_step(m: dict) -> None:
        line = (f"step {m['step'] + 1:>4}/{cfg.steps}  reward {m['reward/mean']:+.3f} +- {m['reward/std']:.3f}  "
                f"kl {m.get('actor/kl_loss', m.get('train/kl', float('nan'))):.4f}  "
                f"{m['rollout/tokens_per_s']:.0f} tok/s")
        if "eval/heldout_reward_mean" in m:
            line += f"  held-out reward {m['eval/heldout_reward_mean']:+.3f}"
        table_rows.append(line)
        console.print(line, highlight=False)

    result = controller.run()
    first, last = result.evals[0], result.evals[-1]
    rise = heldout_rise(first, last)
    console.print(f"[green]done[/] held-out reward {first['eval/heldout_reward_mean']:+.3f} (step {first['step']})"
                  f" -> {last['eval/heldout_reward_mean']:+.3f} (step {last['step']}): rise {rise['rise']:+.3f} "
                  f"[95% CI {rise['ci_low']:+.3f}, {rise['ci_high']:+.3f}], paired over {rise['prompts']} "
                  f"prompts; run dir {result.run_dir}", highlight=False)
    return result


@app.command()
def pgenrm(recipe: Path = typer.Argument(..., help="recipe YAML with a pgenrm: section"),
           stage: Optional[List[str]] = typer.Option(None, "--stage", help="run only this stage (repeatable): base, "
                                                     "psi, cre, curriculum, cre_no_pr, cre_no_or"),
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


def run_pgenrm_stage(recipe: Recipe, stages: Optional[List[str]] = None, address: Optional[str] = None):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from data_pipelines.build import ensure_world_shards
    from pr_rlhf.configs.pgenrm import STAGE_PARENT
    from pr_rlhf.pgenrm.report import write_ablation_report
    from workers.pgenrm import PGenRMPipeline, StageOrderError
    from workers.ray_utils import init_ray

    import os

    cfg = recipe.pgenrm
    for s in stages or []:
        if s not in STAGE_PARENT:
            _fail(f"--stage {s!r}: expected one of {', '.join(STAGE_PARENT)}")
    console.rule(f"[bold]pgenrm[/] {' -> '.join(stages or cfg.stages)} -> {cfg.out}")
    if ensure_world_shards(cfg.shards, cfg.world):
        console.print(f"built the recipe's synthetic world -> {cfg.shards}")
    init_ray(address, num_cpus=max(os.cpu_count() or 1, 3))
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

        pipeline = PGenRMPipeline(recipe, on_step=on_step, on_event=lambda msg: progress.console.print(msg))
        try:
            results = pipeline.run(stages)
        except StageOrderError as exc:
            _fail(str(exc))
            raise
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
    console.print(table)
    report = write_ablation_report(cfg.out, title=f"{recipe.name}: P-GenRM ablation", seed=recipe.seed)
    console.print(f"ablation report: {report.markdown}, {report.figure}", highlight=False)
    return results


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


def _world_shards_and_ray(shards: str, world, address: Optional[str]) -> None:
    """The recipe's synthetic world built into ``shards`` when absent (``world`` None: shards must exist), then
    Ray joined at ``address`` or started locally."""
    import os

    from data_pipelines.build import ensure_world_shards
    from workers.ray_utils import init_ray

    if world is not None and ensure_world_shards(shards, world):
        console.print(f"built the recipe's synthetic world -> {shards}")
    init_ray(address, num_cpus=max(os.cpu_count() or 1, 2))


def run_scaling_stage(recipe: Recipe, address: Optional[str] = None) -> dict:
    from workers.scaling import run_scaling

    cfg = recipe.scaling
    console.rule(f"[bold]scaling[/] {cfg.model} -> {cfg.out}")
    if not Path(cfg.model).is_dir():
        _fail(f"scaling.model {cfg.model!r} is not a model directory: train one with `pr-rlhf pgenrm "
              "recipes/pgenrm_pipeline.yaml`, or point scaling.model at a local GenRM")
    _world_shards_and_ray(cfg.shards, cfg.world, address)
    result = run_scaling(recipe)
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
    from pr_rlhf.tracking import make_tracker
    from workers.bon import BoNSweep

    cfg = recipe.bon
    console.rule(f"[bold]bon[/] n={cfg.n}, {cfg.prompts} prompts -> {cfg.out}")
    _world_shards_and_ray(cfg.shards, cfg.world, address)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    report = BoNSweep(cfg, seed=recipe.seed, log=lambda m: console.print(m, highlight=False)).run()
    with make_tracker(recipe.tracking, cfg.out, f"{recipe.name}/bon", tags={"stage": "bon"}) as tracker:
        tracker.log_params({"n": cfg.n, "prompts": cfg.prompts, "reward_models": ",".join(cfg.reward_models)})
        for metrics in report["metrics"].values():
            tracker.log_metrics(metrics)
    console.print(Path(cfg.out, "bon.md").read_text(), highlight=False)
    if "validity" in report:
        console.print(f"benchmark validity: {report['validity']}", highlight=False)
    return report


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
    import os
    import signal
    import sys
    import time

    rec = _recipe(recipe, [*(overrides or []), *([f"serve.port={port}"] if port is not None else [])])
    cfg = rec.serve
    if cfg is None:
        _fail(f"{recipe}: no serve: section (see recipes/serve_reward.yaml)")
    if cfg.auth_token_env and not os.environ.get(cfg.auth_token_env):
        _fail(f"serve.auth_token_env={cfg.auth_token_env!r}: that environment variable is empty; export the token "
              "first (it is read from the environment only, never from the recipe)")
    from ray import serve

    from workers.ray_utils import init_ray
    from workers.reward_service import deploy

    init_ray(address, num_cpus=max(os.cpu_count() or 1, 2))
    url = deploy(cfg)
    auth = f", bearer token from ${cfg.auth_token_env}" if cfg.auth_token_env else ""
    console.print(f"reward service ({cfg.reward.kind}, {cfg.replicas} replica(s){auth}) at {url}  "
                  f"[POST /score, /score_batch, /get_reward; GET /health]", highlight=False)
    sys.stdout.flush()   # seen at once when the output goes to a file or a pipe
    if detach:
        return
    # Ctrl-C and SIGTERM (`kill`, `docker stop`, `ray job stop`) stop it gracefully, whatever disposition it
    # inherited: a command started from a background job (`cmd &` in a script, CI) starts with SIGINT ignored,
    # and Python then leaves it ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while True:
            # short sleeps: the kernel may hand Ctrl-C to one of Ray's threads, and Python raises it in the main
            # thread only once that thread runs again (a long sleep would hold it for its whole length)
            time.sleep(0.5)
    except KeyboardInterrupt:
        console.print("stopping the reward service")
        sys.stdout.flush()   # before the shutdown, which may take a while on a busy machine
    finally:
        serve.shutdown()


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


def _accuracy_with_misses(summary: dict) -> str:
    """'52.5% (3 ties, 1 unparsed of 40)': an accuracy that says how much of the rest is ties and parse failures."""
    return (f"{100 * summary['accuracy']:.1f}% ({summary.get('ties', 0)} ties, {summary.get('failures', 0)} unparsed"
            f" of {summary.get('n', 0)})")


@app.command()
def quickstart(out: Path = typer.Option(Path("runs/quickstart"), "--out", "-o", help="run directory"),
               recipe: Path = typer.Option(Path("recipes/quickstart.yaml"), "--recipe", "-r"),
               overrides: Optional[List[str]] = OverridesOpt) -> None:
    """The main job on the embedded default (local Ray, CPU, no network): the synthetic world's shards, every
    reward-model evaluation mode, the P-GenRM stages (briefly), test-time scaling and Best-of-N with the shipped
    P-GenRM, GRPO with personalized rewards; a summary table, plots and mlflow runs under --out."""
    import time

    from rich.table import Table

    from pr_rlhf.peak_memory import PeakRSS
    from pr_rlhf.tracking import DB_FILE, ENV_URI, make_tracker

    q = lambda v: json.dumps(str(v))  # noqa: E731 - a YAML-safe override value
    placed = [f"data.out={q(out / 'data')}", f"eval.shards={q(out / 'data')}", f"eval.out={q(out / 'eval')}"]
    source = recipe if recipe.exists() else None
    resolved = _recipe(source, placed + list(overrides or []))
    # place every later stage that the recipe has under --out (placing one it lacks would conjure a default)
    world_shards = out / "pgenrm" / "data"
    later = {"train": [f"train.out={q(out / 'rl')}", f"train.data.shards={q(out / 'rl_world')}"],
             "pgenrm": [f"pgenrm.out={q(out / 'pgenrm')}", f"pgenrm.shards={q(world_shards)}"],
             "scaling": [f"scaling.out={q(out / 'scaling')}", f"scaling.shards={q(world_shards)}"],
             "bon": [f"bon.out={q(out / 'bon')}", f"bon.shards={q(world_shards)}"]}
    placed += [o for section, opts in later.items() if getattr(resolved, section) is not None for o in opts]
    if resolved.tracking.mlflow_uri is None and not os.environ.get(ENV_URI):
        # one store for every stage's run: `mlflow ui --backend-store-uri sqlite:///<out>/mlflow.db` shows them all
        placed.append(f"tracking.mlflow_uri={q('sqlite:///' + str((out / DB_FILE).resolve()))}")
    resolved = _recipe(source, placed + list(overrides or []))
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.yaml").write_text(dump_recipe(resolved))
    summary: list[tuple[str, str, float]] = []
    # the quickstart's own run opens first, so a new experiment keeps its artifacts under <out>/mlartifacts
    tracker = make_tracker(resolved.tracking, out, f"{resolved.name}/summary", tags={"stage": "quickstart"})
    with tracker:
        tracker.log_params(resolved.model_dump(mode="json"))
        with PeakRSS() as memory:
            start = time.perf_counter()

            def done(stage: str, result: str, since: float) -> None:
                summary.append((stage, result, time.perf_counter() - since))

            console.rule(f"[bold]pr-rlhf quickstart[/] -> {out}")
            console.rule("1. data: the synthetic persona world -> Arrow shards")
            t = time.perf_counter()
            report = run_data_build(resolved.data, resolved)
            print_build_report(report)
            done("data", f"{report.out_dir}", t)
            console.rule("2. reward models on held-out pairs (base models: untrained, expect ~50% or parse failures)")
            t = time.perf_counter()
            result = run_eval_stage(resolved)
            done("evaluation (untrained floor)", f"{result.run_dir}/report.md", t)
            if resolved.pgenrm is not None:
                console.rule("3. P-GenRM: PSI -> CRE -> curriculum, briefly (a useful GenRM needs ~30 min of PSI: the "
                             "next stages use the shipped one)")
                t = time.perf_counter()
                stages = run_pgenrm_stage(resolved)
                last = stages[resolved.pgenrm.stages[-1]]
                done("P-GenRM stages (brief)", f"{resolved.pgenrm.stages[-1]} after {resolved.pgenrm.psi.steps} PSI "
                     f"steps: seen {_accuracy_with_misses(last['seen']['summary'])}, "
                     f"cold {_accuracy_with_misses(last['cold']['summary'])}", t)
            if resolved.scaling is not None:
                console.rule(f"4. test-time scaling of the shipped P-GenRM ({resolved.scaling.model})")
                t = time.perf_counter()
                grid = run_scaling_stage(resolved)
                cells = ", ".join(f"{r.group} ({r.m},{r.n}) {100 * r.accuracy:.1f}" for r in grid["rows"])
                done("test-time scaling", cells, t)
            if resolved.bon is not None:
                console.rule(f"5. Best-of-N: {resolved.bon.n} samples per prompt, best-of-k per reward model")
                t = time.perf_counter()
                bon_report = run_bon_stage(resolved)
                validity = bon_report.get("validity", {})
                done("Best-of-N", f"rho {validity.get('spearman_rho', float('nan')):+.2f}, NDCG "
                     f"{validity.get('ndcg', float('nan')):.2f} over {len(validity.get('reward_models', []))} RMs "
                     f"({validity.get('downstream', '-')})", t)
            if resolved.train is not None:
                console.rule("6. GRPO with personalized rewards (tiny policy; held-out = cold-start users)")
                t = time.perf_counter()
                rl = run_train_stage(resolved)
                first, last = rl.evals[0], rl.evals[-1]
                done("GRPO", f"held-out reward {first['eval/heldout_reward_mean']:+.3f} -> "
                     f"{last['eval/heldout_reward_mean']:+.3f}", t)
            total = time.perf_counter() - start
        table = Table(title=f"quickstart summary ({total / 60:.1f} min, peak RSS {memory.peak_gb:.2f} GB over the "
                            f"process tree)")
        for col in ("stage", "result", "minutes"):
            table.add_column(col)
        for stage, text, seconds in summary:
            table.add_row(stage, text, f"{seconds / 60:.1f}")
        console.rule("[bold green]done")
        console.print(table)
        (out / "summary.json").write_text(json.dumps({"minutes": total / 60, "peak_rss_gb": memory.peak_gb,
                                                      "stages": [{"stage": a, "result": b, "minutes": c / 60}
                                                                 for a, b, c in summary]}, indent=1))
        tracker.log_metrics({"quickstart/minutes": total / 60, "quickstart/peak_rss_gb": memory.peak_gb,
                             # 'evaluation (untrained floor)' -> quickstart/minutes/evaluation (the tracker sanitizes)
                             **{f"quickstart/minutes/{stage.split(' (')[0].lower()}": seconds / 60
                                for stage, _, seconds in summary}})
        tracker.log_artifact(out / "summary.json")
    console.print(f"everything under {out}/ (summary.json; reports and plots per stage; every stage's mlflow run "
                  f"in {resolved.tracking.mlflow_uri or '$' + ENV_URI})", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
