"""Bad bytes are named, not silently replaced (pr_rlhf.decoding): every text loader, on a byte-level fixture per
kind (invalid UTF-8, a NUL byte, a UTF-8 byte-order mark, UTF-16 by mistake), names the record, the field and the
byte offset, keeps every valid record, and reads the bytes as U+FFFD only under an explicit
``--encoding-errors replace`` (counted); the generation cache and `pr-rlhf data build` likewise."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tests.fixtures_raw as fx
from data_pipelines import lamp_qa, personal_rewardbench, prb
from pr_rlhf.records import InvalidRecordError

ROOT = Path(__file__).resolve().parents[2]
MARK = b"MARKMARK"                      # planted in one record's text; replaced in place by the bad bytes
BAD = {"invalid_utf8": b"MA\xff\xfeRKMA", "nul": b"MA\x00\x00RKMA"}   # same length: a parquet page stays valid


def plant(path: Path, bad: bytes) -> int:
    """Replace the mark by ``bad`` in the file's bytes; the byte offset of the first bad byte."""
    data = path.read_bytes()
    at = data.index(MARK)
    path.write_bytes(data.replace(MARK, bad))
    return at + 2


def write_parquet_raw(path: Path, rows: list[dict], schema: pa.Schema) -> Path:
    """Uncompressed, no dictionary or statistics: a text's bytes stand in the file as they are."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, compression="NONE", use_dictionary=False,
                   write_statistics=False)
    return path


def prism_rows() -> list[dict]:
    rows = [fx.pair_row(f"c{i}", f"u{i % 2}", ("train", "train", "test")[i % 3]) for i in range(6)]
    rows[1]["chosen"]["content"] = "A sh" + MARK.decode() + " answer."
    return rows


def lamp_rows() -> list[dict]:
    rows = [fx.question_row(f"q{i}") for i in range(4)]
    rows[1]["profile"][2]["text"] = "my post " + MARK.decode()
    return rows


def prb_rows() -> list[dict]:
    rows = [fx.prb_row(f"q{i}") for i in range(4)]
    rows[1]["chosen"] = "An answer " + MARK.decode()
    return rows


# (loader, writes the fixture -> (input path, file), records in all, the bad record's name, the bad field)
LOADERS = {
    "personal_rewardbench jsonl": (personal_rewardbench.load,
                                   lambda d: fx.write_jsonl(d / "prism" / "part.jsonl", prism_rows()),
                                   6, "line 2", "chosen.content"),
    "personal_rewardbench parquet": (personal_rewardbench.load,
                                     lambda d: write_parquet_raw(d / "prism" / "part.parquet", prism_rows(),
                                                                 fx.PAIR_SCHEMA),
                                     6, "row 1", "chosen.content"),
    "lamp_qa json": (lamp_qa.load, lambda d: fx.write_json(d / fx_art() / "train.json", lamp_rows()),
                     4, "item 1", "profile[2].text"),
    "lamp_qa jsonl": (lamp_qa.load, lambda d: fx.write_jsonl(d / fx_art() / "train.jsonl", lamp_rows()),
                      4, "line 2", "profile[2].text"),
    "prb parquet": (prb.load, lambda d: write_parquet_raw(d / fx_art() / "test.parquet", prb_rows(),
                                                          fx.PRB_SCHEMA), 4, "row 1", "chosen"),
}


def fx_art() -> str:
    from tests.unit.test_loaders import ART

    return ART


def records(out) -> int:
    return max(len(out.tables["pairs"]), len(out.tables["queries"]))


def input_of(path: Path, tmp_path: Path) -> str:
    return str(tmp_path / "prism") if "prism" in path.parts else str(tmp_path)


@pytest.mark.parametrize("kind", sorted(BAD))
@pytest.mark.parametrize("name", sorted(LOADERS))
def test_bad_bytes_name_record_field_and_offset_and_the_rest_survive(tmp_path, name, kind):
    load, write, total, record, field = LOADERS[name]
    path = write(tmp_path)
    offset = plant(path, BAD[kind])
    with pytest.raises(InvalidRecordError) as err:
        load(input_of(path, tmp_path))
    message = str(err.value)
    assert path.name in message and record in message and field in message, message
    what = "invalid UTF-8" if kind == "invalid_utf8" else "a NUL character"
    assert what in message, message
    if path.suffix != ".parquet":   # a text file: the byte of the file; parquet: the character / byte in the value
        assert f"byte {offset} of the file" in message, message
    else:
        assert "of the value" in message, message

    out = load(input_of(path, tmp_path), skip_invalid=True)
    assert out.skipped == 1 and records(out) == total - 1
    (issue,) = out.issues
    assert (issue.kind, issue.field) == ("invalid_text", field)

    replaced = load(input_of(path, tmp_path), skip_invalid=True, encoding_errors="replace")
    if kind == "invalid_utf8":      # read as U+FFFD when asked for, and counted
        assert replaced.skipped == 0 and records(replaced) == total and replaced.replaced == 1
        texts = json.dumps([vars(r) for t in replaced.tables.values() for r in t], ensure_ascii=False)
        assert "MA\ufffd\ufffdRKMA" in texts
    else:                           # a NUL is not a decoding choice: still invalid
        assert replaced.skipped == 1 and replaced.replaced == 0


@pytest.mark.parametrize("name", [n for n in sorted(LOADERS) if "parquet" not in n])
def test_utf8_byte_order_mark_is_skipped_and_utf16_is_named(tmp_path, name):
    load, write, total, _, _ = LOADERS[name]
    path = write(tmp_path)
    text = path.read_bytes()
    path.write_bytes(b"\xef\xbb\xbf" + text)
    out = load(input_of(path, tmp_path))
    assert not out.issues and records(out) == total
    path.write_bytes(text.decode("utf-8").encode("utf-16"))      # with its byte-order mark, as editors write it
    with pytest.raises(InvalidRecordError, match="UTF-16 little-endian"):
        load(input_of(path, tmp_path))
    out = load(input_of(path, tmp_path), skip_invalid=True)
    assert [i.kind for i in out.issues] == ["unreadable_file"] and path.name in out.issues[0].file


def test_generation_cache_names_and_skips_a_bad_line():
    from pr_rlhf.models.generation_cache import CachedEngine

    class Engine:
        name = "stub"

    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cache.jsonl"
        entries = [{"key": f"k{i}", "prompt_token_ids": [1], "samples": [{"text": f"chain {i} {MARK.decode()}",
                                                                        "token_ids": [2], "finish_reason": "stop"}]}
                   for i in range(3)]
        path.write_text("".join(json.dumps(e) + "\n" for e in entries))
        data = path.read_bytes()
        first = data.index(MARK)
        path.write_bytes(data[:first] + MARK + data[first + len(MARK):].replace(MARK, BAD["invalid_utf8"], 1))
        offset = data.index(MARK, first + 1) + 2
        cache = CachedEngine(Engine(), path, identity={})
        assert len(cache) == 2 and cache.stats.unreadable_lines == 1
        assert cache.unreadable == [f"{path}: line 2: field 'samples[0].text': invalid UTF-8 at byte {offset}"]


def test_data_build_command_fails_naming_record_and_field_then_skips_or_replaces(tmp_path):
    """The issue's own check: a PRISM JSONL file whose one record's `chosen` text holds two invalid bytes."""
    path = fx.write_jsonl(tmp_path / "prism" / "part.jsonl", prism_rows())
    plant(path, BAD["invalid_utf8"])
    cli = [sys.executable, "-m", "pr_rlhf.cli", "data", "build", "--source", "personal_rewardbench", "--input",
           str(tmp_path / "prism"), "--embedder", "bm25"]
    run = subprocess.run([*cli, "--out", str(tmp_path / "a")], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode != 0 and "line 2" in run.stderr and "chosen.content" in run.stderr, run.stderr[-2000:]
    run = subprocess.run([*cli, "--out", str(tmp_path / "b"), "--skip-invalid"], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 0 and "skipped 1 invalid records" in run.stdout, run.stdout[-2000:] + run.stderr
    def pairs(folder: str) -> int:
        return json.loads((tmp_path / folder / "manifest.json").read_text())["totals"]["pairs"]

    assert pairs("b") == 5
    run = subprocess.run([*cli, "--out", str(tmp_path / "c"), "--encoding-errors", "replace"], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0 and "replaced undecodable bytes with U+FFFD in 1 records" in run.stdout, run.stdout
    assert pairs("c") == 6


def test_the_profile_file_of_stated_preferences_is_decoded_strictly_too(tmp_path):
    """PRISM's survey (each user's stated preferences: the profile a personalized RM reads) goes through the same
    reader: one user's bad bytes name that line and field; the other users keep theirs."""
    paths = fx.prism_users_fixture(tmp_path)
    data = paths["survey"].read_bytes()
    at = data.index(b"STATED-su1")
    paths["survey"].write_bytes(data[:at] + b"STA\xc3(ED" + data[at + 6:])
    load = personal_rewardbench.load
    with pytest.raises(InvalidRecordError) as err:
        load(str(tmp_path / "prism"), survey=str(paths["survey"]))
    assert "survey.jsonl" in str(err.value) and "line 2" in str(err.value) and "system_string" in str(err.value)
    assert f"byte {at + 3} of the file" in str(err.value)
    out = load(str(tmp_path / "prism"), survey=str(paths["survey"]), skip_invalid=True)
    stated = {p.user_id: p.stated_preferences for p in out.tables["profiles"]}
    assert out.skipped == 1 and stated["su0"] == paths["stated"]["su0"] and stated["su1"] == ""
