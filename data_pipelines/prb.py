"""Personalized RewardBench (``QiyaoMa/Personalized-RewardBench``): LaMP-QA test questions with a chosen and a
rejected answer written to satisfy / avoid the asker's rubric.

Raw row: the LaMP-QA fields (see :mod:`data_pipelines.lamp_qa`) plus ``chosen: str`` and ``rejected: str``.
Local layout: one folder per subset holding its parquet file(s), ``{Subset}/test-00000-of-00001.parquet``.

Each row becomes a Profile (its own user: ``user_id = id``; the profile posts are the history, so no History
records), a Query, a Pair and a Rubric, all in split ``test``.
"""
from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from pathlib import Path

from data_pipelines.lamp_qa import SUBSETS, check_unique, question_records, read_question
from data_pipelines.raw_io import RawRow, hub_rows, is_hub_name, read_rows, record_id, subfolders
from pr_rlhf.records import DuplicateTracker, FieldChecker, IssueSink, Pair, SourceOutput

SOURCE = "prb"
HUB_NAME = "QiyaoMa/Personalized-RewardBench"
SPLIT = "test"


def flip_for(pair_id: str, seed: int = 0) -> bool:
    """Presentation order from a hash of the id: stable across runs, file orders and machines."""
    return bool(hashlib.sha256(f"{seed}:{pair_id}".encode()).digest()[0] & 1)


def load(input: str, *, skip_invalid: bool = False, encoding_errors: str = "strict", subsets: list[str] | None = None,
         flip_seed: int = 0) -> SourceOutput:
    out = SourceOutput()
    sink = IssueSink(skip_invalid, out, encoding_errors)
    for subset, rows in _subset_sources(input, subsets, sink):
        seen = DuplicateTracker()  # ids are unique within a subset (they are the LaMP-QA test ids)
        for row in rows:
            chk = FieldChecker(row.file, record_id(row, "id"), row.data)
            q = read_question(chk)
            chosen = chk.text("chosen")
            rejected = chk.text("rejected")
            check_unique(chk, seen, q)
            if not sink.accept(chk):
                continue
            query, profile, rubric = question_records(q, source=SOURCE, subset=subset, split=SPLIT)
            pair = Pair(pair_id=q.question_id, query_id=q.question_id, user_id=query.user_id, source=SOURCE,
                        subset=subset, split=SPLIT, question=q.question, chosen=chosen, rejected=rejected,
                        context=[dict(turn) for turn in query.context], category=q.category,
                        flip=flip_for(q.question_id, flip_seed))
            out.add("queries", query)
            out.add("pairs", pair)
            out.add("profiles", profile)
            out.add("rubrics", rubric)
    return out


def _subset_sources(input: str, subsets: list[str] | None, sink: IssueSink) -> Iterator[tuple[str, Iterator[RawRow]]]:
    if is_hub_name(input):
        for subset in subsets or SUBSETS:
            yield subset, hub_rows(input, subset, SPLIT)
        return
    root = Path(input)
    if not root.is_dir():
        sink.file_failed(input, "input directory does not exist")
        return
    folders = {folder.name: folder for folder in subfolders(root) if any(folder.glob("*.parquet"))}
    if not folders and any(root.glob("*.parquet")):
        folders = {root.name: root}  # a single subset folder given directly
    for subset in subsets or sorted(folders) or SUBSETS:
        folder = folders.get(subset, root / subset)
        files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
        if not files:
            sink.file_failed(str(folder), f"no parquet files for subset {subset!r}"
                             + ("" if folder.is_dir() else " (directory does not exist)"))
            continue
        yield subset, itertools.chain.from_iterable(read_rows(path, sink) for path in files)
