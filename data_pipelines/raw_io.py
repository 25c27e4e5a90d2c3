"""Reading raw source files (parquet / jsonl / json, or a Hugging Face dataset) into plain dicts.

Shared by every source loader. Files that cannot be read at all are reported through the loader's
:class:`IssueSink` (``unreadable_file``); a JSON line that cannot be parsed is its own skippable record, so
one bad line never costs the other lines of the file.

Text is decoded strictly (:mod:`pr_rlhf.decoding`): a record holding bytes that are not UTF-8 text (or a NUL) is
an invalid record (``invalid_text``) named by file, line / item / row, the field's JSON path and the byte offset,
and every other record of the file is kept. With the sink's ``encoding_errors = "replace"`` such bytes become
U+FFFD and the record is counted (``SourceOutput.replaced``). A leading UTF-8 byte-order mark is skipped; a
UTF-16 byte-order mark makes the file unreadable, saying so.
"""
from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pr_rlhf.decoding import bytes_to_text, decode, find_bad_text, foreign_encoding, strip_bom
from pr_rlhf.records import FieldChecker, IssueSink

DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclass(frozen=True)
class RawRow:
    """One raw record and where it came from; ``where`` ("row 3", "line 4") stands in for a missing id."""

    file: str
    where: str
    data: dict


class HubUnavailableError(RuntimeError):
    """A Hugging Face dataset name was given but the hub (or its local cache) cannot serve it."""


# ----------------------------------------------------------------------------------------------------------
# Local files
# ----------------------------------------------------------------------------------------------------------

def read_rows(path: str | Path, sink: IssueSink) -> Iterator[RawRow]:
    """Yield every record of one parquet / jsonl / json file; unreadable parts go to ``sink``."""
    path = Path(path)
    if not path.is_file():
        sink.file_failed(str(path), "file does not exist")
        return
    if path.suffix == ".parquet":
        yield from _parquet_rows(path, sink)
    elif path.suffix == ".jsonl":
        data = _file_bytes(path, sink)
        if data is not None:
            yield from _jsonl_rows(path, data[0], data[1], sink)
    elif path.suffix == ".json":
        yield from _json_rows(path, sink)
    else:
        sink.file_failed(str(path), f"unsupported file type {path.suffix!r} (expected one of {DATA_SUFFIXES})")


def _file_bytes(path: Path, sink: IssueSink) -> tuple[bytes, int] | None:
    """The file's bytes without a UTF-8 byte-order mark, and how many bytes that mark took; None (reported) for a
    file in another encoding."""
    data = path.read_bytes()
    other = foreign_encoding(data)
    if other is not None:
        sink.file_failed(str(path), f"the file is {other} (byte-order mark at byte 0); re-encode it as UTF-8")
        return None
    return strip_bom(data)


def _checked(path: Path, where: str, data: Any, sink: IssueSink, replaced: int = 0, text: str | None = None,
             start: int = 0) -> bool:
    """False (the record reported) when ``data`` holds bad text. ``text``: the record's source text, starting at
    byte ``start`` of the file (None: a parquet row, located within the value). A record read with replacements
    is counted."""
    found = find_bad_text(data, text, start)
    if found is not None:
        field_path, what = found
        chk = FieldChecker(str(path), where, {})
        chk.fail(field_path, "invalid_text", f"not valid text: {what} (use --encoding-errors replace to read "
                                             "undecodable bytes as U+FFFD)")
        sink.accept(chk)
        return False
    if replaced:
        sink.out.replaced += 1
    return True


def _parquet_rows(path: Path, sink: IssueSink) -> Iterator[RawRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    index = 0
    try:
        # Batches keep memory flat on the ~50 MB PRB files; to_pylist gives nested structs as plain dicts.
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            try:
                rows = batch.to_pylist()
            except UnicodeDecodeError:   # a string column holds bytes that are not UTF-8: row by row
                rows = None
            if rows is not None:
                for data in rows:
                    if _checked(path, f"row {index}", data, sink):
                        yield RawRow(str(path), f"row {index}", data)
                    index += 1
                continue
            for data in _rows_as_bytes(batch):
                value, bad, replaced = bytes_to_text(data, sink.encoding_errors)  # type: ignore[arg-type]
                where = f"row {index}"
                index += 1
                if bad is not None:
                    field_path, offset, what = bad
                    chk = FieldChecker(str(path), where, {})
                    chk.fail(field_path, "invalid_text", f"not valid text: {what} at byte {offset} of the value "
                                                         "(use --encoding-errors replace to read undecodable bytes "
                                                         "as U+FFFD)")
                    sink.accept(chk)
                    continue
                if replaced:
                    sink.out.replaced += 1
                yield RawRow(str(path), where, value)
    except (pa.ArrowException, OSError, ValueError) as exc:
        where = f" after {index} rows" if index else ""
        sink.file_failed(str(path), f"unreadable parquet{where}: {type(exc).__name__}: {exc}")


def _rows_as_bytes(batch: Any) -> list[dict]:
    """The batch's rows with every string (nested ones too) read as bytes, undecoded."""
    import pyarrow as pa

    def binary(t: Any) -> Any:
        if pa.types.is_string(t):
            return pa.binary()
        if pa.types.is_large_string(t):
            return pa.large_binary()
        if pa.types.is_list(t):
            return pa.list_(pa.field(t.value_field.name, binary(t.value_type), t.value_field.nullable))
        if pa.types.is_large_list(t):
            return pa.large_list(pa.field(t.value_field.name, binary(t.value_type), t.value_field.nullable))
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, binary(f.type), f.nullable) for f in t])
        return t

    columns = [col.cast(binary(col.type)) for col in batch.columns]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names).to_pylist()


def _jsonl_rows(path: Path, data: bytes, start: int, sink: IssueSink) -> Iterator[RawRow]:
    """Every line of JSON-lines ``data`` (``start``: the byte of the file where it begins)."""
    for number, raw in enumerate(data.split(b"\n"), start=1):
        line_start, start = start, start + len(raw) + 1
        if not raw.strip():
            continue
        where = f"line {number}"
        line, replaced = decode(raw.rstrip(b"\r"), sink.encoding_errors)  # type: ignore[arg-type]
        try:
            # strict=False: a raw control character inside a string is judged below, with its field and offset
            value = json.loads(line, strict=False)
        except json.JSONDecodeError as exc:
            _reject_line(sink, path, where, "unreadable_file", f"invalid JSON: {exc}")
            continue
        if not isinstance(value, dict):
            _reject_line(sink, path, where, "wrong_type", f"expected a JSON object, got {type(value).__name__}")
            continue
        if _checked(path, where, value, sink, replaced, line, line_start):
            yield RawRow(str(path), where, value)


def _json_items(text: str) -> list[tuple[Any, int, int]] | None:
    """(item, start, end) character spans of a top-level JSON array's items; None when ``text`` is not an array
    (then it is parsed whole)."""
    decoder = json.JSONDecoder(strict=False)
    i = len(text) - len(text.lstrip())
    if not text.startswith("[", i):
        return None
    items, i = [], i + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return items
        item, end = decoder.raw_decode(text, i)
        items.append((item, i, end))
        i = end


def _json_rows(path: Path, sink: IssueSink) -> Iterator[RawRow]:
    read = _file_bytes(path, sink)
    if read is None:
        return
    data, bom = read
    text, replaced = decode(data, sink.encoding_errors)  # type: ignore[arg-type]
    try:
        items = _json_items(text)
        payload = json.loads(text, strict=False) if items is None else [item for item, _, _ in items]
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and text.lstrip().startswith("{"):
            # Many hub "json" files are really JSON lines; read them line by line so one bad line stays local.
            yield from _jsonl_rows(path, data, bom, sink)
        else:
            sink.file_failed(str(path), f"invalid JSON: {exc}")
        return
    if isinstance(payload, dict):
        # {"record": {...}} is how single example records are stored (e.g. the PRISM example); any other object
        # is one record (or a mapping the caller interprets, e.g. conversation_id -> attributes).
        payload = [payload["record"]] if isinstance(payload.get("record"), dict) else [payload]
        items = [(payload[0], 0, len(text))]
    if not isinstance(payload, list):
        sink.file_failed(str(path), f"expected a JSON array of objects, got {type(payload).__name__}")
        return
    done_chars, done_bytes = 0, bom   # bytes of the file before character ``done_chars`` of the text
    for index, (data_item, lo, hi) in enumerate(items or []):
        where = f"item {index}"
        if not isinstance(data_item, dict):
            _reject_line(sink, path, where, "wrong_type", f"expected a JSON object, got {type(data_item).__name__}")
            continue
        done_bytes += len(text[done_chars:lo].encode("utf-8", "surrogateescape"))
        done_chars = lo
        own = text[lo:hi]   # the item's own text: its bad bytes are its own
        if _checked(path, where, data_item, sink, int(replaced > 0 and "\ufffd" in own), own, done_bytes):
            yield RawRow(str(path), where, data_item)


def _reject_line(sink: IssueSink, path: Path, where: str, kind: str, message: str) -> None:
    """A line that is not a record at all is still counted as one skipped record."""
    chk = FieldChecker(str(path), where, {})
    chk.fail("", kind, message)  # type: ignore[arg-type]
    sink.accept(chk)


def data_files(folder: Path, stems: Iterable[str] | None = None) -> list[Path]:
    """Data files directly in ``folder`` (optionally only those whose stem starts with one of ``stems``)."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in DATA_SUFFIXES)
    if stems is None:
        return files
    stems = tuple(stems)
    return [p for p in files if any(p.stem == s or p.stem.startswith(f"{s}-") for s in stems)]


def subfolders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


# ----------------------------------------------------------------------------------------------------------
# Hugging Face hub
# ----------------------------------------------------------------------------------------------------------

def is_hub_name(value: str) -> bool:
    """True for ``owner/name`` strings that are not an existing local path (local paths always win)."""
    return not os.path.exists(value) and bool(_HUB_NAME.fullmatch(value)) and not value.startswith(".")


def hub_rows(name: str, config: str | None = None, split: str | None = None) -> Iterator[RawRow]:
    """Rows of a hub dataset via ``datasets.load_dataset``; every split in order when ``split`` is None."""
    offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
                  for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    # Without this probe an offline machine waits on connection retries; offline mode may still hit the cache.
    if not offline and not _hub_reachable():
        raise HubUnavailableError(
            f"{name!r} is not a local path, so it was taken as a Hugging Face dataset name, but the hub is "
            "unreachable (no network?). Download the dataset on a networked machine and pass its local "
            "directory instead.")
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a runtime dependency
        raise HubUnavailableError(f"cannot load {name!r}: the `datasets` package is not installed") from exc
    try:
        loaded = datasets.load_dataset(name, config, split=split)
    except Exception as exc:
        mode = "offline mode (HF_HUB_OFFLINE) and no cached copy" if offline else "the hub refused the request"
        raise HubUnavailableError(
            f"{name!r} is not a local path, and loading it (config {config!r}, split {split!r}) from the "
            f"Hugging Face hub failed: {mode}: "
            f"{type(exc).__name__}: {exc}. Pass a local directory instead.") from exc
    parts = [(split, loaded)] if split is not None else list(loaded.items())
    for part_split, part in parts:
        label = f"hf://{name}" + (f"/{config}" if config else "") + f"/{part_split}"
        for index, data in enumerate(part):
            yield RawRow(label, f"row {index}", dict(data))


def _hub_reachable(timeout: float = 3.0) -> bool:
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((endpoint.hostname or "huggingface.co", endpoint.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


# ----------------------------------------------------------------------------------------------------------
# Field helpers
# ----------------------------------------------------------------------------------------------------------

def record_id(row: RawRow, key: str) -> str:
    """The record's own id when it has one, else its position in the file."""
    value = row.data.get(key)
    if isinstance(value, str) and value.strip():
        return value
    return str(value) if value is not None and not isinstance(value, str) else f"<{row.where}>"


def nested_text(chk: FieldChecker, container: dict, key: str, path: str, *, required: bool = True,
                allow_empty: bool = False) -> str:
    """A string inside a nested object, reported under its full path (e.g. ``profile[3].text``)."""
    return chk.text(key, value=container.get(key), path=path, required=required, allow_empty=allow_empty)


def nested_object(chk: FieldChecker, value: Any, path: str) -> dict | None:
    """An object inside a list (e.g. ``profile[3]``); None (after reporting) when it is missing or not an object."""
    if value is None:
        chk.fail(path, "missing_field", "list element is null")
        return None
    if not isinstance(value, dict):
        chk.fail(path, "wrong_type", f"expected an object, got {type(value).__name__}")
        return None
    return value
