"""`pr-rlhf data build | export-verl | inspect`: Arrow shards of profiles, rubrics and preference pairs, and the
tables that summarize them."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from pr_rlhf.cli.prologue import OverridesOpt, RecipeCommand, console, fail, open_recipe, out_option
from pr_rlhf.configs.recipe import Recipe, SourceName

DATA_BUILD = RecipeCommand("data build", out_field="data.out")


def data_build(
    source: Optional[SourceName] = typer.Option(None, help="synthetic | prb | lamp_qa | personal_rewardbench | dsp"),
    input: Optional[str] = typer.Option(None, "--input", "-i", help="local directory, or an HF dataset name"),
    out: Optional[Path] = out_option("output shard directory"),
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
    resolved = open_recipe(DATA_BUILD, recipe, overrides, out=out, options={
        "data.source": source, "data.input": input, "data.retrieval.embedder": embedder,
        "data.retrieval.top_k": top_k, "data.encoding_errors": encoding_errors,
        "data.skip_invalid": True if skip_invalid else None})
    run_data_stage(resolved)


def run_data_stage(recipe: Recipe):
    """`data build` (and the quickstart's first stage): the shards, with a status line per step, then the report."""
    from data_pipelines.build import build_shards
    from pr_rlhf.records import InvalidRecordError

    try:
        report = build_shards(recipe.data, recipe.world, progress=True,
                              on_stage=lambda s: console.print(f"[bold cyan]>[/] {s}", highlight=False))
    except InvalidRecordError as exc:
        fail(f"{exc}\n(use --skip-invalid to skip invalid records, count them and keep going)")
        raise
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
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


def data_export_verl(shards: Path = typer.Option(..., help="shard directory (`pr-rlhf data build`)"),
                     out: Path = typer.Option(..., "--out", "-o", help="where train.parquet / test.parquet go"),
                     top_k: int = typer.Option(10, help="profile posts in each prompt and in extra_info")) -> None:
    """Shards -> verl's RL parquet (prompt messages; user id, query and profile in extra_info for
    pr_rlhf.integrations.verl.compute_score)."""
    from data_pipelines.verl_export import export_verl

    try:
        counts = export_verl(shards, out, top_k)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
        raise
    console.print(f"wrote {out}/train.parquet ({counts['train']} rows), {out}/test.parquet ({counts['test']} rows)",
                  highlight=False)


def data_inspect(directory: Path = typer.Argument(..., help="shard directory"),
                 verify: bool = typer.Option(True, help="check content hashes"),
                 show: int = typer.Option(1, help="print this many example records per table")) -> None:
    """Summarize a shard directory: counts per table/split/subset, files, hashes, example records."""
    from pr_rlhf.shards import ShardError, ShardReader

    try:
        reader = ShardReader(directory, verify=verify)
    except ShardError as exc:
        fail(str(exc))
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

