"""Strict text decoding: bytes that are not UTF-8 text are found and named, never silently replaced.

Used by every text loader (``data_pipelines/raw_io.py``: JSONL, JSON, parquet string columns), the generation
cache and the reward service's request bodies. Undecodable bytes are decoded with ``surrogateescape`` (each
becomes a lone surrogate U+DC80-U+DCFF), so the text still parses and the value holding them can be found by its
JSON path; :func:`first_bad_text` then names it. A NUL character is bad text too (no user writes one; it is the
mark of UTF-16 read as UTF-8 or of a binary field), as is a lone surrogate that came in as a JSON escape.

``replace`` (an explicit ``--encoding-errors replace``) keeps the old behaviour, undecodable bytes become U+FFFD,
and the caller counts the records that had any.
"""
from __future__ import annotations

from typing import Any, Literal

EncodingErrors = Literal["strict", "replace"]
ENCODING_ERRORS: tuple[str, ...] = ("strict", "replace")

UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = {b"\xff\xfe": "UTF-16 little-endian", b"\xfe\xff": "UTF-16 big-endian"}


def foreign_encoding(data: bytes) -> str | None:
    """The name of the encoding a byte-order mark says the data is in, when it is not UTF-8 (None otherwise,
    and for no mark). UTF-16 text of ASCII letters otherwise decodes as UTF-8 full of NULs."""
    for mark, name in _UTF16_BOMS.items():
        if data.startswith(mark):
            return name
    return None


def strip_bom(data: bytes) -> tuple[bytes, int]:
    """The data without a leading UTF-8 byte-order mark (a harmless marker, not text) and how many bytes went."""
    return (data[len(UTF8_BOM):], len(UTF8_BOM)) if data.startswith(UTF8_BOM) else (data, 0)


def decode(data: bytes, errors: EncodingErrors = "strict") -> tuple[str, int]:
    """(text, undecodable bytes). Strict: each undecodable byte becomes a lone surrogate (found later by
    :func:`first_bad_text`); replace: U+FFFD."""
    if errors not in ENCODING_ERRORS:
        raise ValueError(f"encoding errors {errors!r}: expected one of {ENCODING_ERRORS}")
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        pass
    # one more pass each, on failure only: each undecodable byte becomes one surrogate, which counts them
    escaped = data.decode("utf-8", "surrogateescape")
    bad = sum("\udc80" <= ch <= "\udcff" for ch in escaped)
    return (escaped if errors == "strict" else data.decode("utf-8", "replace")), bad


def is_bad_char(ch: str) -> bool:
    return ch == "\x00" or "\ud800" <= ch <= "\udfff"


def bad_char_kind(ch: str) -> str:
    if ch == "\x00":
        return "a NUL character"
    if "\udc80" <= ch <= "\udcff":
        return "invalid UTF-8"
    return "a lone surrogate"


def first_bad_text(value: Any, path: str = "") -> tuple[str, int, str] | None:
    """(JSON path, character index, what is wrong) of the first string under ``value`` (dicts, lists, in order;
    keys too) holding bad text; None when all of it is text."""
    if isinstance(value, str):
        for i, ch in enumerate(value):
            if is_bad_char(ch):
                return path, i, bad_char_kind(ch)
        return None
    if isinstance(value, dict):
        for key, inner in value.items():
            where = f"{path}.{key}" if path else str(key)
            found = first_bad_text(key, where) or first_bad_text(inner, where)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, inner in enumerate(value):
            found = first_bad_text(inner, f"{path}[{i}]")
            if found:
                return found
    return None


def byte_offset(text: str, char_index: int) -> int:
    """The byte offset in the original data of ``text[char_index]`` (text decoded with surrogateescape)."""
    return len(text[:char_index].encode("utf-8", "surrogateescape"))


def first_bad_offset(text: str) -> int | None:
    """The byte offset of the first undecodable byte or NUL in ``text`` (None: only an escaped one, or none)."""
    for i, ch in enumerate(text):
        if is_bad_char(ch):
            return byte_offset(text, i)
    return None


def find_bad_text(value: Any, text: str | None, start: int = 0, unit: str = "of the file") -> tuple[str, str] | None:
    """(field path, what is wrong and where) for the first bad text in ``value``, parsed from ``text`` that begins
    at byte ``start`` of its source (``unit`` names the source; None ``text``: a value read without source text,
    located by its character); None when all of it is text."""
    bad = first_bad_text(value)
    if bad is None:
        return None
    path, index, what = bad
    if text is None:
        return path, f"{what} at character {index} of the value"
    offset = first_bad_offset(text)
    if offset is None:
        return path, f"{what} at an escape in the JSON text"
    return path, f"{what} at byte {start + offset}" + (f" {unit}" if unit else "")


def bytes_to_text(value: Any, errors: EncodingErrors, path: str = "") -> tuple[Any, tuple[str, int, str] | None,
                                                                            int]:
    """``value`` with every ``bytes`` inside decoded (what a parquet string column read as binary holds):
    (value, the first bad text as (path, byte offset in its value, what), undecodable sequences replaced)."""
    if isinstance(value, bytes):
        text, bad = decode(value, errors)
        if errors == "strict":
            for i, ch in enumerate(text):
                if is_bad_char(ch):
                    return text, (path, byte_offset(text, i), bad_char_kind(ch)), 0
            return text, None, 0
        nul = text.find("\x00")
        return text, ((path, byte_offset(text, nul), "a NUL character") if nul >= 0 else None), bad
    if isinstance(value, dict):
        out, first, replaced = {}, None, 0
        for key, inner in value.items():
            out[key], found, n = bytes_to_text(inner, errors, f"{path}.{key}" if path else str(key))
            first, replaced = first or found, replaced + n
        return out, first, replaced
    if isinstance(value, list):
        items, first, replaced = [], None, 0
        for i, inner in enumerate(value):
            item, found, n = bytes_to_text(inner, errors, f"{path}[{i}]")
            items.append(item)
            first, replaced = first or found, replaced + n
        return items, first, replaced
    return value, None, 0
