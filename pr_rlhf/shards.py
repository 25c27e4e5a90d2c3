"""Arrow shards: the on-disk format of every table, its manifest, a writer and a streaming reader.

Layout::

    DIR/manifest.json
    DIR/<table>/<split>/<table>-<split>-00000.arrow     # Arrow IPC stream, zstd-compressed record batches

Tables without a split (profiles, rubrics, histories) use the split ``all``. Shards are bounded in rows, written
in input order with no timestamps, so the same input and seed give byte-identical files. The files are plain
Arrow streams: ``datasets.load_dataset("arrow", data_files=hf_data_files(DIR, "pairs"))`` reads them too.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.ipc as ipc

from pr_rlhf.records import RECORD_TYPES, SCHEMA_VERSION, TABLES, to_row

MANIFEST = "manifest.json"
NO_SPLIT = "all"

_TURN = pa.struct([("role", pa.string()), ("content", pa.string())])
_ITEM = pa.struct([("id", pa.string()), ("text", pa.string()), ("category", pa.string())])
_RETRIEVED = pa.struct([("id", pa.string()), ("text", pa.string()), ("category", pa.string()),
                        ("score", pa.float64())])
_ASPECT = pa.struct([("aspect", pa.string()), ("evidence", pa.string()), ("reason", pa.string())])

# Nested columns by field name; every other field maps from its Python annotation.
_NESTED = {
    "context": pa.list_(_TURN),
    "retrieved": pa.list_(_RETRIEVED),
    "items": pa.list_(_ITEM),
    "aspects": pa.list_(_ASPECT),
    "pair_ids": pa.list_(pa.string()),
}
_SCALAR = {"str": pa.string(), "bool": pa.bool_(), "int": pa.int64(), "float": pa.float64()}


def arrow_schema(table: str) -> pa.Schema:
    cls = RECORD_TYPES[table]
    cols = []
    for f in fields(cls):
        typ = _NESTED.get(f.name) or _SCALAR[str(f.type)]
        cols.append(pa.field(f.name, typ, nullable=False))
    return pa.schema(cols, metadata={"pr_rlhf.table": table, "pr_rlhf.schema_version": SCHEMA_VERSION})


def table_has_split(table: str) -> bool:
    return any(f.name == "split" for f in fields(RECORD_TYPES[table]))


@dataclass(frozen=True)
class ShardConfig:
    max_rows_per_shard: int = 20_000   # bounds a shard's size (and a reader's memory per file)
    batch_rows: int = 1_000            # rows per record batch inside a shard
    compression: str = "zstd"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (shard manifests, the shipped checkpoint's manifest)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _rows_by_split(table: str, records: list) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for rec in records:
        row = rec if isinstance(rec, dict) else to_row(rec)
        split = row["split"] if table_has_split(table) else NO_SPLIT
        out.setdefault(split, []).append(row)
    return out


def write_table(out_dir: Path, table: str, records: list, cfg: ShardConfig) -> list[dict]:
    """Write one table's records as shards; returns the manifest entries of the files written."""
    schema = arrow_schema(table)
    entries = []
    options = ipc.IpcWriteOptions(compression=cfg.compression)
    for split, rows in sorted(_rows_by_split(table, records).items()):
        split_dir = out_dir / table / split
        split_dir.mkdir(parents=True, exist_ok=True)
        for shard_idx, start in enumerate(range(0, len(rows), cfg.max_rows_per_shard)):
            shard_rows = rows[start:start + cfg.max_rows_per_shard]
            path = split_dir / f"{table}-{split}-{shard_idx:05d}.arrow"
            with pa.OSFile(str(path), "wb") as sink, ipc.new_stream(sink, schema, options=options) as writer:
                for b in range(0, len(shard_rows), cfg.batch_rows):
                    writer.write_batch(pa.RecordBatch.from_pylist(shard_rows[b:b + cfg.batch_rows], schema=schema))
            entries.append({
                "path": str(path.relative_to(out_dir)),
                "table": table,
                "split": split,
                "rows": len(shard_rows),
                "bytes": path.stat().st_size,
                "sha256": sha256_file(path),
            })
    return entries


def _counts(table: str, records: list) -> dict[str, dict[str, int]]:
    """Row counts per split and per subset (``{split: {subset: n}}``)."""
    out: dict[str, dict[str, int]] = {}
    for split, rows in _rows_by_split(table, records).items():
        per_subset: dict[str, int] = {}
        for row in rows:
            per_subset[row.get("subset", "")] = per_subset.get(row.get("subset", ""), 0) + 1
        out[split] = dict(sorted(per_subset.items()))
    return dict(sorted(out.items()))


def write_shards(out_dir: str | Path, tables: dict[str, list], *, source: str, config: dict[str, Any],
                 extra: dict[str, Any] | None = None, shard_config: ShardConfig | None = None) -> dict:
    """Write every table and ``manifest.json``; returns the manifest. Existing shards in ``out_dir`` are replaced."""
    out_dir = Path(out_dir)
    cfg = shard_config or ShardConfig()
    out_dir.mkdir(parents=True, exist_ok=True)
    for table in TABLES:  # stale shards from an earlier build would otherwise be read back
        for old in (out_dir / table).glob("*/*.arrow") if (out_dir / table).exists() else []:
            old.unlink()
    files: list[dict] = []
    counts: dict[str, dict] = {}
    for table in TABLES:
        records = tables.get(table, [])
        files += write_table(out_dir, table, records, cfg)
        counts[table] = _counts(table, records)
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "source": source,
        "config": config,
        "counts": counts,
        "totals": {t: sum(sum(s.values()) for s in counts[t].values()) for t in TABLES},
        "shard_config": {"max_rows_per_shard": cfg.max_rows_per_shard, "batch_rows": cfg.batch_rows,
                         "compression": cfg.compression},
        "files": files,
        **(extra or {}),
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
    return manifest


class ShardError(ValueError):
    """A shard directory that cannot be read: names the file and what is wrong."""


class ShardReader:
    """Streams records from a shard directory written by :func:`write_shards`."""

    def __init__(self, root: str | Path, verify: bool = False):
        self.root = Path(root)
        manifest_path = self.root / MANIFEST
        try:
            self.manifest = json.loads(manifest_path.read_text())
        except FileNotFoundError:
            raise ShardError(f"{manifest_path}: no manifest; is this a directory built by `pr-rlhf data build`?")
        except json.JSONDecodeError as exc:
            raise ShardError(f"{manifest_path}: unreadable manifest: {exc}")
        version = self.manifest.get("schema_version")
        if str(version).split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise ShardError(f"{manifest_path}: schema version {version} is not readable by {SCHEMA_VERSION}")
        if verify:
            self.verify()

    def files(self, table: str, split: str | None = None) -> list[Path]:
        if table not in TABLES:
            raise ShardError(f"unknown table {table!r}; tables are {TABLES}")
        return [self.root / f["path"] for f in self.manifest["files"]
                if f["table"] == table and (split is None or f["split"] == split)]

    def splits(self, table: str) -> list[str]:
        return sorted(self.manifest["counts"].get(table, {}))

    def verify(self) -> None:
        """Check every shard's content hash against the manifest."""
        for f in self.manifest["files"]:
            path = self.root / f["path"]
            if not path.exists():
                raise ShardError(f"{path}: listed in the manifest but missing")
            if sha256_file(path) != f["sha256"]:
                raise ShardError(f"{path}: content hash differs from the manifest (file changed after build)")

    def iter_batches(self, table: str, split: str | None = None) -> Iterator[pa.RecordBatch]:
        for path in self.files(table, split):
            try:
                with pa.OSFile(str(path), "rb") as src:
                    reader = ipc.open_stream(src)
                    for batch in reader:
                        yield batch
            except (OSError, pa.ArrowInvalid) as exc:
                raise ShardError(f"{path}: unreadable shard: {exc}") from exc

    def iter_rows(self, table: str, split: str | None = None) -> Iterator[dict]:
        for batch in self.iter_batches(table, split):
            yield from batch.to_pylist()

    def read(self, table: str, split: str | None = None) -> pa.Table:
        batches = list(self.iter_batches(table, split))
        return pa.Table.from_batches(batches, schema=arrow_schema(table))

    def cold_start_users(self) -> set[tuple[str, str]]:
        """(user_id, subset) of the users the profiles table flags as cold-start (held out of every training)."""
        return {(r["user_id"], r["subset"]) for r in self.iter_rows("profiles") if r.get("cold_start")}

    def count(self, table: str, split: str | None = None) -> int:
        return sum(f["rows"] for f in self.manifest["files"]
                   if f["table"] == table and (split is None or f["split"] == split))


def hf_data_files(root: str | Path, table: str) -> dict[str, list[str]]:
    """``data_files`` for ``datasets.load_dataset("arrow", data_files=...)``: one HF split per shard split."""
    reader = ShardReader(root)
    return {split: [str(p) for p in reader.files(table, split)] for split in reader.splits(table)
            if reader.files(table, split)}
