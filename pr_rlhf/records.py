"""The record types every data source emits, and their validation.

Five tables, one schema each. Every source (PRB, LaMP-QA, PersonalRewardBench, the synthetic world) maps its raw
rows onto these, so everything downstream reads one format:

- ``queries``:   one question asked by one user (with its retrieved top-k profile items)
- ``pairs``:     a chosen/rejected answer pair for one query and one user
- ``profiles``:  a user's profile posts and stated preferences
- ``rubrics``:   the gold rubric aspects a user expects for one query (never shown to the RM under test)
- ``histories``: the ordered ids of a user's history pairs (train split)

Validation never raises on the first problem it finds: it returns every :class:`RecordIssue`, each naming the
file, the record id and the field, so a loader can either stop with a clear message or skip the record and
report it (``--skip-invalid``).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Literal

SCHEMA_VERSION = "1.0"

SPLITS = ("train", "val", "test")
TABLES = ("queries", "pairs", "profiles", "rubrics", "histories")

IssueKind = Literal["missing_field", "wrong_type", "empty_text", "duplicate_id", "unreadable_file", "bad_value",
                    "invalid_text"]


@dataclass(frozen=True)
class RecordIssue:
    """One problem with one raw record (or with a whole file, then ``record_id`` is empty)."""

    file: str
    record_id: str
    field: str
    kind: IssueKind
    message: str

    def __str__(self) -> str:
        where = f"{self.file}"
        if self.record_id:
            where += f", record {self.record_id!r}"
        if self.field:
            where += f", field {self.field!r}"
        return f"{where}: {self.kind}: {self.message}"


class InvalidRecordError(ValueError):
    """Raised by loaders (without --skip-invalid) for the first invalid record; carries all its issues."""

    def __init__(self, issues: list[RecordIssue]):
        self.issues = issues
        super().__init__("invalid input: " + "; ".join(str(i) for i in issues))


# --------------------------------------------------------------------------------------------------------------
# Record types. Nested items are plain dicts so that pyarrow maps them to struct columns directly.
# --------------------------------------------------------------------------------------------------------------

@dataclass
class ProfileItem:
    id: str
    text: str
    category: str = ""


@dataclass
class RetrievedItem:
    """A profile item after ranking: its own id travels with its own text (never re-assigned by rank)."""

    id: str
    text: str
    category: str = ""
    score: float = 0.0


@dataclass
class RubricAspect:
    aspect: str
    evidence: str = ""
    reason: str = ""


@dataclass
class Query:
    query_id: str
    user_id: str
    source: str
    subset: str
    split: str
    question: str
    context: list[dict] = field(default_factory=list)      # [{role, content}], conversation before/incl. question
    category: str = ""
    retrieved: list[dict] = field(default_factory=list)    # [RetrievedItem as dict], filled by retrieval
    meta: str = "{}"                                        # JSON string of source-specific extras


@dataclass
class Pair:
    pair_id: str
    query_id: str
    user_id: str
    source: str
    subset: str
    split: str
    question: str
    chosen: str
    rejected: str
    context: list[dict] = field(default_factory=list)
    category: str = ""
    flip: bool = False               # fixed presentation order for evaluation (chosen shown second when True)
    hardness: str = "standard"       # "standard" | "hard" (differs in fit to the user only)
    retrieved: list[dict] = field(default_factory=list)
    meta: str = "{}"


@dataclass
class Profile:
    user_id: str
    source: str
    subset: str
    items: list[dict] = field(default_factory=list)        # [ProfileItem as dict]
    stated_preferences: str = ""                            # e.g. PRISM system_string
    self_description: str = ""
    cold_start: bool = False
    meta: str = "{}"


@dataclass
class Rubric:
    query_id: str
    user_id: str
    source: str
    subset: str
    aspects: list[dict] = field(default_factory=list)      # [RubricAspect as dict]
    narrative: str = ""
    meta: str = "{}"


@dataclass
class History:
    user_id: str
    source: str
    subset: str
    pair_ids: list[str] = field(default_factory=list)      # the user's train pairs, in order
    cold_start: bool = False
    meta: str = "{}"


RECORD_TYPES: dict[str, type] = {
    "queries": Query,
    "pairs": Pair,
    "profiles": Profile,
    "rubrics": Rubric,
    "histories": History,
}

# The field that identifies a record of each table (unique within a table).
ID_FIELDS: dict[str, tuple[str, ...]] = {
    "queries": ("query_id",),
    "pairs": ("pair_id",),
    "profiles": ("user_id", "subset"),
    "rubrics": ("query_id", "user_id"),
    "histories": ("user_id", "subset"),
}


def record_key(table: str, record: Any) -> str:
    return "/".join(str(getattr(record, f)) for f in ID_FIELDS[table])


def to_row(record: Any) -> dict:
    return asdict(record)


def dump_meta(meta: dict) -> str:
    """Source-specific extras are kept as canonical JSON so schemas stay fixed across sources."""
    return json.dumps(meta, sort_keys=True, ensure_ascii=False, default=str)


@dataclass
class SourceOutput:
    """What a source yields: records per table plus every issue it skipped (with --skip-invalid)."""

    tables: dict[str, list] = field(default_factory=lambda: {t: [] for t in TABLES})
    issues: list[RecordIssue] = field(default_factory=list)
    skipped: int = 0
    replaced: int = 0      # records read with undecodable bytes replaced by U+FFFD (--encoding-errors replace)
    summary: dict = field(default_factory=dict)   # source-level facts for the manifest (e.g. world accuracies)

    def add(self, table: str, record: Any) -> None:
        self.tables[table].append(record)

    def counts(self) -> dict[str, int]:
        return {t: len(v) for t, v in self.tables.items()}


# --------------------------------------------------------------------------------------------------------------
# Raw-field validation helpers shared by all loaders.
# --------------------------------------------------------------------------------------------------------------

_UNSET: Any = object()  # "read the top-level field", distinct from a nested value that is None


class FieldChecker:
    """Collects issues while reading fields of one raw record; loaders read through it, never index raw dicts.

    >>> chk = FieldChecker("a.parquet", "r1", {"q": "hi"})
    >>> chk.text("q"), chk.text("missing"), [i.kind for i in chk.issues]
    ('hi', '', ['missing_field'])
    """

    def __init__(self, file: str, record_id: str, raw: dict):
        self.file = file
        self.record_id = record_id
        self.raw = raw
        self.issues: list[RecordIssue] = []

    def fail(self, field_name: str, kind: IssueKind, message: str) -> None:
        self.issues.append(RecordIssue(self.file, self.record_id, field_name, kind, message))

    def _get(self, name: str, required: bool) -> tuple[bool, Any]:
        if name not in self.raw or self.raw[name] is None:
            if required:
                self.fail(name, "missing_field", "required field is missing or null")
            return False, None
        return True, self.raw[name]

    def text(self, name: str, required: bool = True, allow_empty: bool = False, value: Any = _UNSET,
             path: str | None = None) -> str:
        """A non-empty string field. ``value``/``path`` check a nested value already extracted by the caller."""
        label = path or name
        if value is _UNSET:
            present, value = self._get(name, required)
            if not present:
                return ""
        elif value is None:
            if required:
                self.fail(label, "missing_field", "required field is missing or null")
            return ""
        if not isinstance(value, str):
            self.fail(label, "wrong_type", f"expected a string, got {type(value).__name__}")
            return ""
        if not allow_empty and not value.strip():
            self.fail(label, "empty_text", "text is empty")
            return ""
        return value

    def boolean(self, name: str, default: bool | None = None) -> bool:
        present, value = self._get(name, default is None)
        if not present:
            return bool(default)
        if isinstance(value, bool):
            return value
        try:  # numpy bools from parquet
            import numpy as np
            if isinstance(value, np.bool_):
                return bool(value)
        except ImportError:  # pragma: no cover
            pass
        self.fail(name, "wrong_type", f"expected a boolean, got {type(value).__name__}")
        return bool(default)

    def integer(self, name: str, default: int | None = None) -> int:
        present, value = self._get(name, default is None)
        if not present:
            return int(default or 0)
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            self.fail(name, "wrong_type", f"expected an integer, got {type(value).__name__}")
            return int(default or 0)
        return int(value)

    def number(self, name: str, default: float | None = None) -> float:
        present, value = self._get(name, default is None)
        if not present:
            return float(default or 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
            self.fail(name, "wrong_type", f"expected a number, got {type(value).__name__}")
            return float(default or 0.0)
        try:
            return float(value)
        except (TypeError, ValueError):
            self.fail(name, "wrong_type", f"expected a number, got {value!r}")
            return float(default or 0.0)

    def items(self, name: str, required: bool = True, allow_empty: bool = True) -> list:
        """A list field (numpy arrays from parquet are accepted as lists)."""
        present, value = self._get(name, required)
        if not present:
            return []
        if hasattr(value, "tolist") and not isinstance(value, (str, bytes, dict)):
            value = value.tolist()
        if not isinstance(value, (list, tuple)):
            self.fail(name, "wrong_type", f"expected a list, got {type(value).__name__}")
            return []
        if not allow_empty and not value:
            self.fail(name, "empty_text", "list is empty")
        return list(value)

    def mapping(self, name: str, required: bool = True, value: Any = _UNSET, path: str | None = None) -> dict:
        label = path or name
        if value is _UNSET:
            present, value = self._get(name, required)
            if not present:
                return {}
        elif value is None:
            if required:
                self.fail(label, "missing_field", "required field is missing or null")
            return {}
        if not isinstance(value, dict):
            self.fail(label, "wrong_type", f"expected an object, got {type(value).__name__}")
            return {}
        return value

    def choice(self, name: str, allowed: Iterable[str], required: bool = True) -> str:
        value = self.text(name, required=required)
        allowed = tuple(allowed)
        if value and value not in allowed:
            self.fail(name, "bad_value", f"expected one of {allowed}, got {value!r}")
            return ""
        return value

    @property
    def ok(self) -> bool:
        return not self.issues


class DuplicateTracker:
    """Flags a record id seen twice in one table (the first occurrence is kept, the repeat is the issue).

    Call it only for records that are otherwise valid: an invalid record must not claim an id that a later
    valid record then loses."""

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}

    def check(self, chk: FieldChecker, table: str, key: str, field_name: str) -> None:
        prior = self._seen.get(f"{table}:{key}")
        if prior is not None:
            chk.fail(field_name, "duplicate_id", f"id {key!r} already used by an earlier record in {prior}")
        else:
            self._seen[f"{table}:{key}"] = chk.file


class IssueSink:
    """Where a loader sends the issues of each raw record: raise at once, or count and keep going."""

    def __init__(self, skip_invalid: bool, out: SourceOutput, encoding_errors: str = "strict"):
        """``encoding_errors``: 'strict' (undecodable bytes make the record invalid, naming its field) or
        'replace' (they become U+FFFD and the record is counted in ``out.replaced``)."""
        self.skip_invalid = skip_invalid
        self.out = out
        self.encoding_errors = encoding_errors

    def accept(self, chk: FieldChecker) -> bool:
        """True when the record is valid and should be emitted."""
        if chk.ok:
            return True
        if not self.skip_invalid:
            raise InvalidRecordError(chk.issues)
        self.out.issues.extend(chk.issues)
        self.out.skipped += 1
        return False

    def file_failed(self, file: str, message: str) -> None:
        issue = RecordIssue(file, "", "", "unreadable_file", message)
        if not self.skip_invalid:
            raise InvalidRecordError([issue])
        self.out.issues.append(issue)
