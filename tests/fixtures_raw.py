"""Small raw fixtures in the exact schemas of PRB, LaMP-QA and PersonalRewardBench, written with pyarrow.

Nested columns are real ``list<struct>`` / ``struct`` columns, as in the hub parquet files. Row builders
return valid rows; the ``*_defects`` helpers return rows broken in exactly one field together with the
issue (record id, field, kind) a loader must report for them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

# One real PRISM record (MIT licence beside it), copied from the project's shared data.
PRISM_EXAMPLE = Path(__file__).parent / "data" / "prism_example" / "prism_personalized_example_record.json"

PROFILE_ITEM = pa.struct([("id", pa.string()), ("category", pa.string()), ("text", pa.string())])
ASPECT = pa.struct([("aspect", pa.string()), ("evidence", pa.string()), ("reason", pa.string())])
TURN = pa.struct([("content", pa.string()), ("role", pa.string())])

LAMP_QA_SCHEMA = pa.schema([
    ("id", pa.string()), ("question", pa.string()), ("profile", pa.list_(PROFILE_ITEM)),
    ("rubric_aspects", pa.list_(ASPECT)), ("narrative", pa.string()), ("category", pa.string()),
])
PRB_SCHEMA = LAMP_QA_SCHEMA.append(pa.field("chosen", pa.string())).append(pa.field("rejected", pa.string()))
PAIR_SCHEMA = pa.schema([
    ("conversation_id", pa.string()), ("user_id", pa.string()), ("context", pa.list_(TURN)), ("chosen", TURN),
    ("rejected", TURN), ("turns", pa.int64()), ("type", pa.string()), ("split", pa.string()), ("flip", pa.bool_()),
])
Issue = tuple[str, str, str]  # (record id, field, kind)


# ----------------------------------------------------------------------------------------------------------
# Writers
# ----------------------------------------------------------------------------------------------------------

def write_parquet(path: Path, rows: list[dict], schema: pa.Schema | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def write_jsonl(path: Path, rows: list[dict | str]) -> Path:
    """Dicts become JSON lines; strings are written verbatim (to plant unparseable lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def write_json(path: Path, payload: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    return path


def write_corrupt_parquet(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PAR1 this is not a parquet file at all PAR1")
    return path


# ----------------------------------------------------------------------------------------------------------
# LaMP-QA and PRB
# ----------------------------------------------------------------------------------------------------------

def question_row(qid: str, *, n_profile: int = 5, n_aspects: int = 3, category: str = "anime") -> dict:
    return {
        "id": qid,
        "question": f"Which {category} should I try next? ({qid})",
        "profile": [{"id": f"{qid}-p{i}", "category": category if i % 2 else "cooking",
                     "text": f"Post {i} of the asker of {qid}: I love long arcs and slow pacing."}
                    for i in range(n_profile)],
        "rubric_aspects": [{"aspect": f"aspect {k} of {qid}", "evidence": f"evidence {k}", "reason": f"reason {k}"}
                           for k in range(n_aspects)],
        "narrative": f"I watched a lot already and want something new. ({qid})",
        "category": category,
    }


def prb_row(qid: str, **kwargs: Any) -> dict:
    return {**question_row(qid, **kwargs),
            "chosen": f"Try a slow-burn series with long arcs ({qid}).",
            "rejected": f"Watch whatever is popular this season ({qid})."}


def question_defects(make_row, prefix: str) -> list[tuple[dict, Issue]]:
    """Rows broken in exactly one field, each fitting the typed parquet schema (nulls, empties, nesting)."""
    def broken(suffix: str, edit) -> tuple[dict, str]:
        row = make_row(f"{prefix}-{suffix}")
        edit(row)
        return row, row["id"] if isinstance(row["id"], str) and row["id"] else ""

    cases = []
    row, rid = broken("noq", lambda r: r.update(question=None))
    cases.append((row, (rid, "question", "missing_field")))
    row, rid = broken("emptyq", lambda r: r.update(question="   "))
    cases.append((row, (rid, "question", "empty_text")))
    row, rid = broken("p3", lambda r: r["profile"][3].update(text=""))
    cases.append((row, (rid, "profile[3].text", "empty_text")))
    row, rid = broken("p1", lambda r: r["profile"][1].update(text=None))
    cases.append((row, (rid, "profile[1].text", "missing_field")))
    row, rid = broken("asp", lambda r: r["rubric_aspects"][0].update(aspect=None))
    cases.append((row, (rid, "rubric_aspects[0].aspect", "missing_field")))
    row, rid = broken("noasp", lambda r: r.update(rubric_aspects=[]))
    cases.append((row, (rid, "rubric_aspects", "empty_text")))
    return cases


def write_prb(root: Path, rows_by_subset: dict[str, list[dict]]) -> Path:
    for subset, rows in rows_by_subset.items():
        write_parquet(root / subset / "test-00000-of-00001.parquet", rows, PRB_SCHEMA)
    return root


# ----------------------------------------------------------------------------------------------------------
# PersonalRewardBench
# ----------------------------------------------------------------------------------------------------------

def pair_row(conversation_id: str, user_id: str, split: str, *, flip: bool = False,
             context: list[dict] | None = None, **extras: Any) -> dict:
    context = context or [{"content": f"What should I cook tonight? ({conversation_id})", "role": "user"}]
    return {
        "conversation_id": conversation_id,
        "user_id": user_id,
        "context": context,
        "chosen": {"content": f"A quick vegetable curry ({conversation_id}).", "role": "model"},
        "rejected": {"content": f"Order a pizza ({conversation_id}).", "role": "model"},
        "turns": sum(1 for t in context if t.get("role") == "user"),
        "type": "values guided",
        "split": split,
        "flip": flip,
        **extras,
    }


def pair_defects_typed(prefix: str) -> list[tuple[dict, Issue]]:
    """One-field defects that fit the parquet schema."""
    cases = []
    row = pair_row(f"{prefix}-nouser", "u9", "train")
    row["user_id"] = None
    cases.append((row, (f"{prefix}-nouser", "user_id", "missing_field")))
    row = pair_row(f"{prefix}-emptychosen", "u9", "train")
    row["chosen"] = {"content": "", "role": "model"}
    cases.append((row, (f"{prefix}-emptychosen", "chosen.content", "empty_text")))
    row = pair_row(f"{prefix}-emptyq", "u9", "train", context=[
        {"content": "hi", "role": "user"}, {"content": "hello", "role": "model"}, {"content": " ", "role": "user"}])
    cases.append((row, (f"{prefix}-emptyq", "context[2].content", "empty_text")))
    row = pair_row(f"{prefix}-split", "u9", "dev")
    cases.append((row, (f"{prefix}-split", "split", "bad_value")))
    row = pair_row(f"{prefix}-nouserturn", "u9", "train", context=[{"content": "system says hi", "role": "system"}])
    cases.append((row, (f"{prefix}-nouserturn", "context", "bad_value")))
    row = pair_row(f"{prefix}-noflip", "u9", "train")
    row["flip"] = None
    cases.append((row, (f"{prefix}-noflip", "flip", "missing_field")))
    return cases


def pair_defects_untyped(prefix: str) -> list[tuple[dict | str, Issue]]:
    """Defects only JSON can carry: wrong types, non-object lines, unparseable lines (ids filled by caller)."""
    cases: list[tuple[dict | str, Issue]] = []
    row = pair_row(f"{prefix}-turns", "u9", "train")
    row["turns"] = "1"
    cases.append((row, (f"{prefix}-turns", "turns", "wrong_type")))
    row = pair_row(f"{prefix}-flip", "u9", "train")
    row["flip"] = "yes"
    cases.append((row, (f"{prefix}-flip", "flip", "wrong_type")))
    row = pair_row(f"{prefix}-chosenstr", "u9", "train")
    row["chosen"] = "just a string"
    cases.append((row, (f"{prefix}-chosenstr", "chosen", "wrong_type")))
    row = pair_row(f"{prefix}-norole", "u9", "train", context=[
        {"content": "hi", "role": "user"}, {"content": "hello"}, {"content": "and?", "role": "user"}])
    cases.append((row, (f"{prefix}-norole", "context[1].role", "missing_field")))
    cases.append(('{"conversation_id": "broken", "user_id": ', ("line", "", "unreadable_file")))
    cases.append(("[1, 2, 3]", ("line", "", "wrong_type")))
    return cases


def prism_example_record() -> dict:
    return json.loads(PRISM_EXAMPLE.read_text(encoding="utf-8"))["record"]


def survey_row(user_id: str, **extra: Any) -> dict:
    return {"user_id": user_id, "self_description": f"I am {user_id}, a curious cook.",
            "system_string": "Be brief and give concrete steps.", "age": "25-34 years old", "gender": "Female",
            "study_locale": "uk", **extra}


PRISM_TOPICS = ("cooking dinner", "planning a trip", "learning a language", "fixing a bike", "saving money",
                "writing a cover letter", "growing tomatoes", "training for a 10k")


def prism_users_fixture(root: Path, *, seen_users: int = 4, train_pairs: int = 6, cold_users: int = 2) -> dict:
    """A small PersonalRewardBench PRISM variant in the hub's schema, with the survey join: each seen user has
    ``train_pairs`` train pairs, one val and one test pair; each cold-start user one train and one test pair.
    Every pair carries PRISM's ratings (``chosen_score`` / ``rejected_score``, 1-100) and every user a distinct
    stated preference (``system_string``: ``STATED-<user>: ...``). Returns the paths and the stated strings."""
    rows, survey, stated = [], [], {}
    users = [(f"su{i}", False) for i in range(seen_users)] + [(f"cu{i}", True) for i in range(cold_users)]
    for u, (user_id, cold) in enumerate(users):
        splits = ["train", "test"] if cold else ["train"] * train_pairs + ["val", "test"]
        for j, split in enumerate(splits):
            topic = PRISM_TOPICS[(u + j) % len(PRISM_TOPICS)]
            cid = f"c-{user_id}-{j}"
            chosen = f"Short plan for {topic}: three concrete steps, each one line ({cid})."
            rejected = f"A long, general essay about {topic} with history and caveats but no steps ({cid})."
            row = pair_row(cid, user_id, split, flip=bool(j % 2),
                           context=[{"content": f"Can you help me with {topic}? ({cid})", "role": "user"}],
                           chosen_score=60 + 7 * ((u + j) % 5), rejected_score=55 + 3 * (j % 4))
            row["chosen"]["content"], row["rejected"]["content"] = chosen, rejected
            rows.append(row)
        stated[user_id] = f"STATED-{user_id}: I want short answers with concrete steps."
        survey.append(survey_row(user_id, system_string=stated[user_id]))
    schema = PAIR_SCHEMA.append(pa.field("chosen_score", pa.int64())).append(pa.field("rejected_score", pa.int64()))
    pairs = write_parquet(root / "prism" / "train-00000-of-00001.parquet", rows, schema)
    survey_path = write_jsonl(root / "survey.jsonl", survey)
    return {"pairs": pairs, "survey": survey_path, "stated": stated, "rows": rows}
