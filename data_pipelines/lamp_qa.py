"""LaMP-QA (``alireza7/LaMP-QA``): personalized long-form questions with the asker's profile and gold rubric.

Raw row (one per question; each question comes from its own user, so ``user_id = id``)::

    id: str, question: str, narrative: str, category: str,
    profile: list<{id: str, category: str, text: str}>,
    rubric_aspects: list<{aspect: str, evidence: str, reason: str}>

Configs are the three subsets, splits train / validation / test (``validation`` becomes ``val``). Emits
Profiles, Queries and Rubrics (no pairs). PRB reuses :func:`read_question`, its rows being LaMP-QA test
rows plus a chosen/rejected answer.

Local layouts accepted (``input`` a directory)::

    {subset}/{split}-00000-of-00001.parquet   {subset}/{split}.parquet|jsonl|json   (hub / hand-made)
    {subset}/{split}/0000.parquet                                                   (hub parquet conversion)
    {subset}_{split}.json                                                           (LaMP-QA repo download script)
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from data_pipelines.raw_io import (
    RawRow,
    data_files,
    hub_rows,
    is_hub_name,
    nested_object,
    nested_text,
    read_rows,
    record_id,
    subfolders,
)
from pr_rlhf.records import DuplicateTracker, FieldChecker, IssueSink, Profile, Query, Rubric, SourceOutput, dump_meta

SOURCE = "lamp_qa"
HUB_NAME = "alireza7/LaMP-QA"
SUBSETS = ("Art_and_Entertainment", "Lifestyle_and_Personal_Development", "Society_and_Culture")
# raw split name -> our split name, and the file stems each raw split may be stored under
SPLIT_NAMES = {"train": "train", "validation": "val", "test": "test"}
SPLIT_STEMS = {"train": ("train",), "validation": ("validation", "val", "dev"), "test": ("test",)}


@dataclass
class QuestionFields:
    """The validated fields of one LaMP-QA-style row."""

    question_id: str
    question: str
    category: str
    narrative: str
    profile: list[dict] = field(default_factory=list)
    aspects: list[dict] = field(default_factory=list)


def read_question(chk: FieldChecker) -> QuestionFields:
    """Read (and report problems in) the fields LaMP-QA and PRB rows share."""
    fields = QuestionFields(
        question_id=chk.text("id"),
        question=chk.text("question"),
        category=chk.text("category", required=False, allow_empty=True),
        # The post body may legitimately be empty (a question asked in its title only).
        narrative=chk.text("narrative", allow_empty=True),
    )
    for i, raw_item in enumerate(chk.items("profile")):
        item = nested_object(chk, raw_item, f"profile[{i}]")
        if item is not None:
            fields.profile.append({
                "id": nested_text(chk, item, "id", f"profile[{i}].id"),
                "text": nested_text(chk, item, "text", f"profile[{i}].text"),
                "category": nested_text(chk, item, "category", f"profile[{i}].category", required=False,
                                        allow_empty=True),
            })
    for i, raw_aspect in enumerate(chk.items("rubric_aspects", allow_empty=False)):
        aspect = nested_object(chk, raw_aspect, f"rubric_aspects[{i}]")
        if aspect is not None:
            fields.aspects.append({
                "aspect": nested_text(chk, aspect, "aspect", f"rubric_aspects[{i}].aspect"),
                "evidence": nested_text(chk, aspect, "evidence", f"rubric_aspects[{i}].evidence", required=False,
                                        allow_empty=True),
                "reason": nested_text(chk, aspect, "reason", f"rubric_aspects[{i}].reason", required=False,
                                      allow_empty=True),
            })
    return fields


def question_records(q: QuestionFields, *, source: str, subset: str, split: str) -> tuple[Query, Profile, Rubric]:
    """Query, Profile and Rubric of one question; its asker is a user of their own (user_id = question id)."""
    user_id = q.question_id
    query = Query(query_id=q.question_id, user_id=user_id, source=source, subset=subset, split=split,
                  question=q.question, context=[{"role": "user", "content": q.question}], category=q.category)
    profile = Profile(user_id=user_id, source=source, subset=subset, items=q.profile)
    rubric = Rubric(query_id=q.question_id, user_id=user_id, source=source, subset=subset, aspects=q.aspects,
                    narrative=q.narrative, meta=dump_meta({"split": split}))
    return query, profile, rubric


def check_unique(chk: FieldChecker, seen: DuplicateTracker, q: QuestionFields) -> None:
    """Only a record valid so far claims its id, so an invalid row never makes a later valid one a duplicate."""
    if chk.ok:
        seen.check(chk, "queries", q.question_id, "id")


def load(input: str, *, skip_invalid: bool = False, encoding_errors: str = "strict", subsets: list[str] | None = None,
         splits: list[str] | None = None) -> SourceOutput:
    """Load LaMP-QA from a local directory or the hub; ``splits`` takes train / validation (or val) / test."""
    out = SourceOutput()
    sink = IssueSink(skip_invalid, out, encoding_errors)
    raw_splits = _raw_splits(splits)
    seen_by_subset: dict[str, DuplicateTracker] = {}
    for subset, raw_split, rows in _split_sources(input, subsets, raw_splits, splits is not None, sink):
        seen = seen_by_subset.setdefault(subset, DuplicateTracker())  # ids are unique within a subset
        for row in rows:
            chk = FieldChecker(row.file, record_id(row, "id"), row.data)
            q = read_question(chk)
            check_unique(chk, seen, q)
            if sink.accept(chk):
                query, profile, rubric = question_records(q, source=SOURCE, subset=subset,
                                                          split=SPLIT_NAMES[raw_split])
                out.add("queries", query)
                out.add("profiles", profile)
                out.add("rubrics", rubric)
    return out


def _raw_splits(splits: list[str] | None) -> list[str]:
    if splits is None:
        return list(SPLIT_NAMES)
    by_any_name = {stem: raw for raw, stems in SPLIT_STEMS.items() for stem in stems}
    unknown = [s for s in splits if s not in by_any_name]
    if unknown:
        raise ValueError(f"unknown LaMP-QA split(s) {unknown}; expected train, validation (or val), test")
    return [by_any_name[s] for s in splits]


def _split_sources(input: str, subsets: list[str] | None, raw_splits: list[str], splits_requested: bool,
                   sink: IssueSink) -> Iterator[tuple[str, str, Iterator[RawRow]]]:
    """(subset, raw split, rows) for every split found; what was asked for but is missing goes to ``sink``."""
    if is_hub_name(input):
        for subset in subsets or SUBSETS:
            for raw_split in raw_splits:
                yield subset, raw_split, hub_rows(input, subset, raw_split)
        return
    root = Path(input)
    if not root.is_dir():
        sink.file_failed(input, "input directory does not exist")
        return
    for subset in subsets or _local_subsets(root):
        found_any = False
        for raw_split in raw_splits:
            files = _local_split_files(root, subset, raw_split)
            if not files and splits_requested:
                sink.file_failed(str(root / subset), f"no files for split {raw_split!r} of subset {subset!r}")
            for path in files:
                found_any = True
                yield subset, raw_split, read_rows(path, sink)
        if not found_any and not splits_requested:
            sink.file_failed(str(root / subset), f"no LaMP-QA files for subset {subset!r}")


def _local_subsets(root: Path) -> list[str]:
    names = {folder.name for folder in subfolders(root)
             if any(_local_split_files(root, folder.name, raw_split) for raw_split in SPLIT_NAMES)}
    for path in data_files(root):
        for stems in SPLIT_STEMS.values():
            for stem in stems:
                if path.stem.endswith(f"_{stem}"):
                    names.add(path.stem[: -len(stem) - 1])
    if not names:
        return list(SUBSETS)  # nothing recognisable: report the canonical subsets as missing
    return sorted(names)


def _local_split_files(root: Path, subset: str, raw_split: str) -> list[Path]:
    stems = SPLIT_STEMS[raw_split]
    files = []
    folder = root / subset
    if folder.is_dir():
        files += data_files(folder, stems)
        for stem in stems:
            if (folder / stem).is_dir():
                files += data_files(folder / stem)
    files += data_files(root, [f"{subset}_{stem}" for stem in stems])
    return files
