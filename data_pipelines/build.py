"""Build Arrow shards from any source: load + validate -> retrieve top-k profile items -> write shards + manifest."""
from __future__ import annotations

import importlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pr_rlhf.configs.recipe import DataConfig, SyntheticDataConfig, data_config
from pr_rlhf.configs.world import WorldConfig
from pr_rlhf.records import SourceOutput
from pr_rlhf.shards import ShardConfig, write_shards

ISSUES_FILE = "issues.jsonl"


@dataclass
class BuildReport:
    out_dir: Path
    manifest: dict
    skipped: int
    issues: list = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    replaced: int = 0     # records read with undecodable bytes replaced (--encoding-errors replace)

    @property
    def records(self) -> int:
        return sum(self.manifest["totals"].values())


def load_source(data: DataConfig, world: WorldConfig | None = None) -> SourceOutput:
    """Run one source's loader (the config's member says which, with its typed options); the module is imported
    only when asked for (keeps the CLI fast)."""
    module = importlib.import_module(f"data_pipelines.{data.source}")
    if isinstance(data, SyntheticDataConfig):   # generated from the world: nothing to read
        return module.load(world or WorldConfig(), skip_invalid=data.skip_invalid)
    if not data.input:
        raise ValueError(f"source {data.source!r} needs --input (a local directory or a dataset name)")
    return module.load(data.input, skip_invalid=data.skip_invalid, encoding_errors=data.encoding_errors,
                       subsets=data.subsets, **data.options.model_dump())


def attach_retrieval(out: SourceOutput, data: DataConfig, progress: bool = False) -> None:
    """Fill ``retrieved`` on queries (and pairs, by query id) from each user's profile items."""
    profiles = [p for p in out.tables["profiles"] if p.items]
    if not profiles or not out.tables["queries"]:
        return
    from pr_rlhf.models.embedders import make_embedder
    from pr_rlhf.retrieval import copy_retrieved_to_pairs, retrieve_for_queries

    embedder = make_embedder(data.retrieval.embedder, cache_dir=data.retrieval.cache_dir)
    by_user = {(p.user_id, p.subset): p for p in profiles}  # a user may have a profile in several subsets
    retrieve_for_queries(out.tables["queries"], by_user, top_k=data.retrieval.top_k, embedder=embedder,
                         batch_size=data.retrieval.batch_size, progress=progress)
    copy_retrieved_to_pairs(out.tables["queries"], out.tables["pairs"])


def build_shards(data: DataConfig, world: WorldConfig | None = None, *, progress: bool = False,
                 on_stage: Callable[[str], None] | None = None) -> BuildReport:
    """The whole ``pr-rlhf data build``: returns what was written, skipped and how long each stage took."""
    seconds: dict[str, float] = {}
    stage = on_stage or (lambda _s: None)

    t0 = time.perf_counter()
    stage(f"loading {data.source}")
    out = load_source(data, world)
    seconds["load"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    stage(f"retrieving top-{data.retrieval.top_k} profile items ({data.retrieval.embedder})")
    attach_retrieval(out, data, progress=progress)
    seconds["retrieve"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    stage("writing shards")
    out_dir = Path(data.out)
    extra: dict[str, Any] = {"skipped": out.skipped, "issues": len(out.issues)}
    if out.replaced:
        extra["replaced_records"] = out.replaced
    if out.summary:
        extra["summary"] = out.summary
    config = data.model_dump(mode="json")
    config.pop("out", None)  # where it was written is not part of what it is
    if isinstance(data, SyntheticDataConfig):
        config["world"] = (world or WorldConfig()).model_dump(mode="json")
    sc = data.shards
    manifest = write_shards(out_dir, out.tables, source=data.source, config=config, extra=extra,
                            shard_config=ShardConfig(sc.max_rows_per_shard, sc.batch_rows, sc.compression))
    issues_path = out_dir / ISSUES_FILE
    if out.issues:
        with open(issues_path, "w") as fh:
            for issue in out.issues:
                fh.write(json.dumps(issue.__dict__, sort_keys=True) + "\n")
    elif issues_path.exists():
        issues_path.unlink()
    seconds["write"] = time.perf_counter() - t0
    return BuildReport(out_dir, manifest, out.skipped, list(out.issues), seconds, out.replaced)


def ensure_world_shards(out: str | Path, world: WorldConfig, embedder: str = "bm25",
                        log: Callable[[str], None] | None = None) -> bool:
    """Shards of the synthetic ``world`` at ``out``: built when absent (True, and said through ``log``), kept when
    they hold exactly this world (False). Shards of another world (or source) there are an error, never silently
    reused."""
    from pr_rlhf.shards import MANIFEST

    manifest_path = Path(out) / MANIFEST
    if manifest_path.is_file():
        built = json.loads(manifest_path.read_text()).get("config", {})
        try:   # a manifest written before a world field existed holds that field's default
            same = WorldConfig.model_validate(built.get("world") or {}) == world
        except ValueError:
            same = False
        if not same:
            raise ValueError(f"{out}: holds shards of another world than the recipe's; choose another shards "
                             f"directory for it or delete this one")
        return False
    build_shards(data_config(source="synthetic", out=str(out), retrieval={"embedder": embedder}), world)
    if log is not None:
        log(f"built the recipe's synthetic world -> {out}")
    return True
