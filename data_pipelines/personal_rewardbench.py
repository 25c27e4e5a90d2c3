"""PersonalRewardBench (SynthesizeMe): per-user preference pairs from Chatbot Arena and PRISM.

Raw row (``MichaelR207/chatbot_arena_personalized_0125``, ``MichaelR207/prism_personalized_0125``)::

    conversation_id: str, user_id: str, context: list<{role, content}> (may be multi-turn),
    chosen: {role: "model", content: str}, rejected: {role: "model", content: str},
    turns: int, type: str, split: "train" | "val" | "test" (a per-user split), flip: bool,
    ... optional extras (chosen_score, rejected_score, model predictions) -> kept in the Pair meta

Emits a Query and a Pair per row (``pair_id = query_id = conversation_id``; question = the last user turn,
context = the turns up to and including it), and per user a History (their train pair ids, in file order) and a
Profile (no posts; PRISM's survey fills stated preferences when joined). Users with at most
``cold_start_max_train`` train pairs are cold-start.

Inputs: a parquet/jsonl file, a dataset folder (searched recursively, e.g. a hub snapshot with ``data/``), or a
folder holding one folder per subset (``chatbot_arena/``, ``prism_personalized_0125/``, ...). The subset is
``variant`` when given, else read from the folder / file / hub name.

Optional PRISM joins (P-GenRM's PRISM variant): ``survey=PATH`` (rows with user_id, self_description,
system_string = stated style, demographics) and ``choice_attributes=PATH`` (rows with conversation_id and
choice_attributes {attribute: 1-100}, or one JSON object conversation_id -> {attribute: score}).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from data_pipelines.raw_io import (
    RawRow,
    hub_rows,
    is_hub_name,
    nested_object,
    nested_text,
    read_rows,
    record_id,
    subfolders,
)
from pr_rlhf.records import (
    SPLITS,
    DuplicateTracker,
    FieldChecker,
    History,
    IssueSink,
    Pair,
    Profile,
    Query,
    SourceOutput,
    dump_meta,
)

SOURCE = "personal_rewardbench"
SUBSETS = ("chatbot_arena", "prism")
HUB_NAMES = {"chatbot_arena": "MichaelR207/chatbot_arena_personalized_0125",
             "prism": "MichaelR207/prism_personalized_0125"}
CORE_FIELDS = ("conversation_id", "user_id", "context", "chosen", "rejected", "turns", "type", "split", "flip")
MAIN_SUFFIXES = (".parquet", ".jsonl")
SURVEY_FIELDS = ("user_id", "self_description", "system_string")


@dataclass
class SurveyEntry:
    self_description: str
    stated_preferences: str
    answers: dict = field(default_factory=dict)  # demographics and every other survey column


def load(input: str, *, skip_invalid: bool = False, encoding_errors: str = "strict",
         subsets: list[str] | None = None, variant: str | None = None, survey: str | None = None,
         choice_attributes: str | None = None,
         cold_start_max_train: int = 1) -> SourceOutput:
    out = SourceOutput()
    sink = IssueSink(skip_invalid, out, encoding_errors)
    surveys = _read_survey(survey, sink) if survey else {}
    attributes = _read_choice_attributes(choice_attributes, sink) if choice_attributes else {}
    for subset, rows in _dataset_sources(input, subsets, variant, sink):
        seen = DuplicateTracker()
        train_pairs: dict[str, list[str]] = {}  # user -> train pair ids in file order (users in first-seen order)
        for row in rows:
            chk = FieldChecker(row.file, record_id(row, "conversation_id"), row.data)
            records = _read_pair(chk, subset, attributes)
            if chk.ok:
                seen.check(chk, "pairs", records[1].pair_id, "conversation_id")
            if not sink.accept(chk):
                continue
            query, pair = records
            out.add("queries", query)
            out.add("pairs", pair)
            user_train = train_pairs.setdefault(pair.user_id, [])
            if pair.split == "train":
                user_train.append(pair.pair_id)
        for user_id, pair_ids in train_pairs.items():
            cold_start = len(pair_ids) <= cold_start_max_train
            out.add("histories", History(user_id=user_id, source=SOURCE, subset=subset, pair_ids=pair_ids,
                                         cold_start=cold_start))
            out.add("profiles", _profile(user_id, subset, cold_start, surveys.get(user_id)))
    return out


def _profile(user_id: str, subset: str, cold_start: bool, survey: SurveyEntry | None) -> Profile:
    if survey is None:
        return Profile(user_id=user_id, source=SOURCE, subset=subset, cold_start=cold_start)
    return Profile(user_id=user_id, source=SOURCE, subset=subset, cold_start=cold_start,
                   stated_preferences=survey.stated_preferences, self_description=survey.self_description,
                   meta=dump_meta({"survey": survey.answers}))


# ----------------------------------------------------------------------------------------------------------
# One pair row
# ----------------------------------------------------------------------------------------------------------

def _read_pair(chk: FieldChecker, subset: str, attributes: dict[str, dict]) -> tuple[Query, Pair]:
    conversation_id = chk.text("conversation_id")
    user_id = chk.text("user_id")
    question, context = _read_context(chk)
    chosen = _read_response(chk, "chosen")
    rejected = _read_response(chk, "rejected")
    turns = chk.integer("turns")
    kind = chk.text("type", allow_empty=True)
    split = chk.choice("split", SPLITS)
    flip = chk.boolean("flip")
    # Null extras carry nothing (a parquet column is null where a jsonl line simply lacks the key).
    extras = {k: v for k, v in chk.raw.items() if k not in CORE_FIELDS and v is not None}
    query_meta = {"type": kind, "turns": turns}
    pair_meta = {**extras, **query_meta}
    if conversation_id in attributes:
        pair_meta["choice_attributes"] = attributes[conversation_id]
    query = Query(query_id=conversation_id, user_id=user_id, source=SOURCE, subset=subset, split=split,
                  question=question, context=context, meta=dump_meta(query_meta))
    pair = Pair(pair_id=conversation_id, query_id=conversation_id, user_id=user_id, source=SOURCE, subset=subset,
                split=split, question=question, chosen=chosen, rejected=rejected,
                context=[dict(turn) for turn in context], flip=flip, meta=dump_meta(pair_meta))
    return query, pair


def _read_context(chk: FieldChecker) -> tuple[str, list[dict]]:
    """(question, context): the question is the last user turn; the context ends with it."""
    turns: list[tuple[int, dict]] = []
    for i, raw_turn in enumerate(chk.items("context", allow_empty=False)):
        turn = nested_object(chk, raw_turn, f"context[{i}]")
        if turn is not None:
            role = nested_text(chk, turn, "role", f"context[{i}].role")
            # Earlier turns may be empty (e.g. a blank model turn); only the question must have text.
            content = nested_text(chk, turn, "content", f"context[{i}].content", allow_empty=True)
            turns.append((i, {"role": role, "content": content}))
    user_positions = [k for k, (_, turn) in enumerate(turns) if turn["role"] == "user"]
    if not user_positions:
        if turns and chk.ok:
            chk.fail("context", "bad_value", "the conversation has no user turn")
        return "", []
    last = user_positions[-1]
    raw_index, question_turn = turns[last]
    if not question_turn["content"].strip():
        chk.fail(f"context[{raw_index}].content", "empty_text", "the question (last user turn) is empty")
    return question_turn["content"], [turn for _, turn in turns[: last + 1]]


def _read_response(chk: FieldChecker, name: str) -> str:
    value = chk.raw.get(name)
    if not isinstance(value, dict):
        chk.mapping(name)  # reports it missing or of the wrong type
        return ""
    nested_text(chk, value, "role", f"{name}.role", required=False, allow_empty=True)
    return nested_text(chk, value, "content", f"{name}.content")


# ----------------------------------------------------------------------------------------------------------
# PRISM joins
# ----------------------------------------------------------------------------------------------------------

def _read_survey(path: str, sink: IssueSink) -> dict[str, SurveyEntry]:
    entries: dict[str, SurveyEntry] = {}
    seen = DuplicateTracker()
    for row in _table_rows(path, sink, (".parquet", ".jsonl", ".json")):
        chk = FieldChecker(row.file, record_id(row, "user_id"), row.data)
        user_id = chk.text("user_id")
        self_description = chk.text("self_description", required=False, allow_empty=True)
        stated = chk.text("system_string", required=False, allow_empty=True)
        if chk.ok:
            seen.check(chk, "survey", user_id, "user_id")
        if sink.accept(chk):
            answers = {k: v for k, v in row.data.items() if k not in SURVEY_FIELDS}
            entries[user_id] = SurveyEntry(self_description, stated, answers)
    return entries


def _read_choice_attributes(path: str, sink: IssueSink) -> dict[str, dict]:
    rows = list(_table_rows(path, sink, (".parquet", ".jsonl", ".json")))
    if len(rows) == 1 and "conversation_id" not in rows[0].data:  # one object: conversation_id -> attributes
        only = rows[0]
        rows = [RawRow(only.file, f"key {key!r}", {"conversation_id": key, "choice_attributes": value})
                for key, value in only.data.items()]
    scores_by_conversation: dict[str, dict] = {}
    seen = DuplicateTracker()
    for row in rows:
        chk = FieldChecker(row.file, record_id(row, "conversation_id"), row.data)
        conversation_id = chk.text("conversation_id")
        scores = {}
        # A conversation without attributes is simply not annotated; PRISM leaves unrated attributes null.
        for name, value in chk.mapping("choice_attributes", required=False).items():
            label = f"choice_attributes.{name}"
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                chk.fail(label, "wrong_type", f"expected a number, got {type(value).__name__}")
            elif not 1 <= value <= 100:
                chk.fail(label, "bad_value", f"expected a score in 1..100, got {value!r}")
            else:
                scores[name] = value
        if chk.ok:
            seen.check(chk, "choice_attributes", conversation_id, "conversation_id")
        if sink.accept(chk) and scores:
            scores_by_conversation[conversation_id] = scores
    return scores_by_conversation


# ----------------------------------------------------------------------------------------------------------
# Where the rows come from
# ----------------------------------------------------------------------------------------------------------

def subset_named(name: str) -> str | None:
    """The subset a folder / file / hub name stands for: ``prism``, ``prism_personalized_0125``, ... ."""
    name = name.rsplit("/", 1)[-1].lower()
    for subset in SUBSETS:
        if name == subset or name.startswith(f"{subset}_"):
            return subset
    return None


def _dataset_sources(input: str, subsets: list[str] | None, variant: str | None,
                     sink: IssueSink) -> Iterator[tuple[str, Iterator[RawRow]]]:
    for name in ([variant] if variant else []) + list(subsets or []):
        if name not in SUBSETS:
            raise ValueError(f"unknown PersonalRewardBench subset {name!r}; expected one of {SUBSETS}")
    wanted = [variant] if variant else subsets
    if is_hub_name(input):
        yield _single_subset(input, wanted), hub_rows(input)
        return
    root = Path(input)
    if not root.exists():
        sink.file_failed(input, "input path does not exist")
        return
    per_subset = {} if root.is_file() else {
        subset: folder for folder in subfolders(root) if (subset := subset_named(folder.name))}
    if not per_subset:
        files = [root] if root.is_file() else _data_files(root, MAIN_SUFFIXES)
        if not files:
            sink.file_failed(input, "no parquet or jsonl files found")
            return
        yield _single_subset(root.stem if root.is_file() else root.name, wanted), _chain(files, sink)
        return
    for subset in wanted or sorted(per_subset):
        files = _data_files(per_subset[subset], MAIN_SUFFIXES) if subset in per_subset else []
        if not files:
            sink.file_failed(str(root / subset), f"no parquet or jsonl files for subset {subset!r}")
            continue
        yield subset, _chain(files, sink)


def _single_subset(name: str, wanted: list[str] | None) -> str:
    if wanted and len(wanted) == 1:
        return wanted[0]
    subset = subset_named(name)
    if subset is None or (wanted and subset not in wanted):
        raise ValueError(f"cannot tell which PersonalRewardBench subset {name!r} holds; pass variant= one of "
                         f"{SUBSETS}")
    return subset


def _table_rows(path: str, sink: IssueSink, suffixes: tuple[str, ...]) -> Iterator[RawRow]:
    """Rows of a join table given as one file or a folder of files."""
    root = Path(path)
    if root.is_dir():
        yield from _chain(_data_files(root, suffixes), sink)
    else:
        yield from read_rows(root, sink)  # a missing file is reported by read_rows


def _data_files(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """Data files anywhere below ``folder`` (hub snapshots keep them in ``data/``), hidden folders excluded."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in suffixes
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def _chain(files: list[Path], sink: IssueSink) -> Iterator[RawRow]:
    for path in files:
        yield from read_rows(path, sink)
