"""Source loaders (PRB, LaMP-QA, PersonalRewardBench) on raw fixtures in the real schemas, good and bad."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

import tests.fixtures_raw as fx
from data_pipelines import lamp_qa, personal_rewardbench, prb, raw_io
from pr_rlhf.records import InvalidRecordError, SourceOutput, to_row

ART, LIFE = "Art_and_Entertainment", "Lifestyle_and_Personal_Development"


def issue_set(out: SourceOutput) -> set[tuple[str, str, str]]:
    return {(i.record_id, i.field, i.kind) for i in out.issues}


def ids(records, key: str) -> list[str]:
    return [getattr(r, key) for r in records]


# ----------------------------------------------------------------------------------------------------------
# PRB
# ----------------------------------------------------------------------------------------------------------

def test_prb_maps_each_row_to_profile_query_pair_rubric(tmp_path):
    fx.write_prb(tmp_path, {ART: [fx.prb_row(f"a{i}") for i in range(3)],
                            LIFE: [fx.prb_row(f"l{i}", category="fitness") for i in range(2)]})
    out = prb.load(str(tmp_path))

    assert out.counts() == {"queries": 5, "pairs": 5, "profiles": 5, "rubrics": 5, "histories": 0}
    assert not out.issues and out.skipped == 0
    raw = fx.prb_row("a1")
    pair = next(p for p in out.tables["pairs"] if p.pair_id == "a1")
    assert (pair.query_id, pair.user_id, pair.subset, pair.split, pair.source) == ("a1", "a1", ART, "test", "prb")
    assert (pair.question, pair.chosen, pair.rejected) == (raw["question"], raw["chosen"], raw["rejected"])
    assert pair.context == [{"role": "user", "content": raw["question"]}] and pair.category == "anime"
    profile = next(p for p in out.tables["profiles"] if p.user_id == "a1")
    assert profile.items == raw["profile"]  # ids stay with their own texts, order kept
    rubric = next(r for r in out.tables["rubrics"] if r.query_id == "a1")
    assert rubric.aspects == raw["rubric_aspects"] and rubric.narrative == raw["narrative"]
    assert {q.subset for q in out.tables["queries"]} == {ART, LIFE}


def test_prb_flip_is_seeded_by_id_and_stable(tmp_path):
    rows = [fx.prb_row(f"q{i}") for i in range(40)]
    fx.write_prb(tmp_path / "a", {ART: rows})
    fx.write_prb(tmp_path / "b", {ART: rows[::-1]})  # another file order must not change any flip
    first = {p.pair_id: p.flip for p in prb.load(str(tmp_path / "a")).tables["pairs"]}
    again = {p.pair_id: p.flip for p in prb.load(str(tmp_path / "b")).tables["pairs"]}
    assert first == again == {pid: prb.flip_for(pid) for pid in first}
    assert 5 < sum(first.values()) < 35  # both orders occur
    reseeded = {p.pair_id: p.flip for p in prb.load(str(tmp_path / "a"), flip_seed=7).tables["pairs"]}
    assert reseeded != first


def test_prb_subsets_option_and_any_parquet_name(tmp_path):
    fx.write_parquet(tmp_path / ART / "my_export.parquet", [fx.prb_row("a0")], fx.PRB_SCHEMA)
    fx.write_prb(tmp_path, {LIFE: [fx.prb_row("l0")]})
    out = prb.load(str(tmp_path), subsets=[ART])
    assert ids(out.tables["pairs"], "pair_id") == ["a0"]


def test_prb_first_invalid_record_raises_naming_file_id_and_field(tmp_path):
    bad = fx.prb_row("a1")
    bad["profile"][3]["text"] = ""
    fx.write_prb(tmp_path, {ART: [fx.prb_row("a0"), bad, fx.prb_row("a2")]})
    with pytest.raises(InvalidRecordError) as err:
        prb.load(str(tmp_path))
    message = str(err.value)
    assert "test-00000-of-00001.parquet" in message and "'a1'" in message and "profile[3].text" in message
    assert [(i.record_id, i.field, i.kind) for i in err.value.issues] == [("a1", "profile[3].text", "empty_text")]


def test_prb_skip_invalid_keeps_exactly_the_valid_rows(tmp_path):
    valid = [fx.prb_row(f"ok{i}") for i in range(6)]
    defects = fx.question_defects(fx.prb_row, "bad")
    empty_chosen = fx.prb_row("bad-chosen")
    empty_chosen["chosen"] = ""
    defects.append((empty_chosen, ("bad-chosen", "chosen", "empty_text")))
    duplicate = fx.prb_row("ok0")
    defects.append((duplicate, ("ok0", "id", "duplicate_id")))
    rows = []
    for i in range(max(len(valid), len(defects))):  # interleave valid and invalid rows
        rows += ([valid[i]] if i < len(valid) else []) + ([defects[i][0]] if i < len(defects) else [])
    no_id = fx.prb_row("x")
    no_id["id"] = None
    rows.insert(5, no_id)
    defects.append((no_id, ("<row 5>", "id", "missing_field")))  # no id: the issue names the row instead
    fx.write_prb(tmp_path, {ART: rows})
    # A second file in the same subset whose `chosen` column has the wrong type: every row of it is invalid.
    wrong_schema = pa.schema([f if f.name != "chosen" else pa.field("chosen", pa.int64()) for f in fx.PRB_SCHEMA])
    typed_rows = [{**fx.prb_row(f"typed{i}"), "chosen": 3} for i in range(2)]
    fx.write_parquet(tmp_path / ART / "test-00001-of-00002.parquet", typed_rows, wrong_schema)
    fx.write_corrupt_parquet(tmp_path / LIFE / "test-00000-of-00001.parquet")

    out = prb.load(str(tmp_path), skip_invalid=True, subsets=[ART, LIFE, "Society_and_Culture"])

    assert sorted(ids(out.tables["pairs"], "pair_id")) == sorted(r["id"] for r in valid)
    assert out.counts() == {"queries": 6, "pairs": 6, "profiles": 6, "rubrics": 6, "histories": 0}
    expected = {issue for _, issue in defects} | {(f"typed{i}", "chosen", "wrong_type") for i in range(2)}
    file_issues = {(i.file, i.kind) for i in out.issues if not i.record_id}
    assert issue_set(out) - {("", "", "unreadable_file")} == expected
    assert out.skipped == len(defects) + 2
    assert file_issues == {(str(tmp_path / LIFE / "test-00000-of-00001.parquet"), "unreadable_file"),
                           (str(tmp_path / "Society_and_Culture"), "unreadable_file")}
    assert all(i.file.endswith(".parquet") for i in out.issues if i.record_id)


def test_prb_corrupt_file_and_missing_directory_raise_without_skip(tmp_path):
    fx.write_corrupt_parquet(tmp_path / ART / "test-00000-of-00001.parquet")
    with pytest.raises(InvalidRecordError, match="unreadable parquet"):
        prb.load(str(tmp_path))
    with pytest.raises(InvalidRecordError, match="does not exist"):
        prb.load(str(tmp_path / "missing"))
    out = prb.load(str(tmp_path / "missing"), skip_invalid=True)
    assert [i.kind for i in out.issues] == ["unreadable_file"] and out.counts()["pairs"] == 0


# ----------------------------------------------------------------------------------------------------------
# LaMP-QA
# ----------------------------------------------------------------------------------------------------------

SPLIT_SIZES = {"train": 3, "validation": 2, "test": 2}


def write_lamp_qa(root: Path, layout: str) -> None:
    for subset in (ART, LIFE):
        for split, n in SPLIT_SIZES.items():
            rows = [fx.question_row(f"{subset[:3]}-{split}-{i}") for i in range(n)]
            if layout == "hub_parquet":
                fx.write_parquet(root / subset / f"{split}-00000-of-00001.parquet", rows, fx.LAMP_QA_SCHEMA)
            elif layout == "plain_parquet":
                fx.write_parquet(root / subset / f"{split}.parquet", rows, fx.LAMP_QA_SCHEMA)
            elif layout == "parquet_conversion":
                fx.write_parquet(root / subset / split / "0000.parquet", rows, fx.LAMP_QA_SCHEMA)
            elif layout == "jsonl":
                fx.write_jsonl(root / subset / f"{split}.jsonl", rows)
            elif layout == "json":
                fx.write_json(root / subset / f"{split}.json", rows)
            elif layout == "download_script":  # LaMP-QA repo: utils/download_datasets.py
                fx.write_json(root / f"{subset}_{split}.json", rows)


@pytest.mark.parametrize("layout", ["hub_parquet", "plain_parquet", "parquet_conversion", "jsonl", "json",
                                    "download_script"])
def test_lamp_qa_reads_every_layout(tmp_path, layout):
    write_lamp_qa(tmp_path, layout)
    out = lamp_qa.load(str(tmp_path))
    assert not out.issues
    assert out.counts() == {"queries": 14, "pairs": 0, "profiles": 14, "rubrics": 14, "histories": 0}
    by_split = {}
    for q in out.tables["queries"]:
        by_split.setdefault((q.subset, q.split), []).append(q.query_id)
    assert {k: len(v) for k, v in by_split.items()} == {
        (s, split): n for s in (ART, LIFE) for split, n in (("train", 3), ("val", 2), ("test", 2))}
    assert by_split[(ART, "val")] == ["Art-validation-0", "Art-validation-1"]
    query = out.tables["queries"][0]
    assert query.source == "lamp_qa" and query.user_id == query.query_id
    assert out.tables["profiles"][0].items == fx.question_row(query.query_id)["profile"]


def test_lamp_qa_splits_and_subsets_options(tmp_path):
    write_lamp_qa(tmp_path, "hub_parquet")
    out = lamp_qa.load(str(tmp_path), subsets=[LIFE], splits=["val"])
    assert {(q.subset, q.split) for q in out.tables["queries"]} == {(LIFE, "val")}
    assert out.counts()["queries"] == 2
    with pytest.raises(InvalidRecordError, match="no files for split 'validation'"):
        lamp_qa.load(str(tmp_path), subsets=["Society_and_Culture"], splits=["validation"])
    with pytest.raises(ValueError, match="unknown LaMP-QA split"):
        lamp_qa.load(str(tmp_path), splits=["dev2"])


def test_lamp_qa_jsonl_bad_lines_never_cost_good_ones(tmp_path):
    train = [fx.question_row(f"t{i}") for i in range(4)]
    lines: list = []
    expected: set = set()
    typed = fx.question_defects(fx.question_row, "bad")
    wrong_question = fx.question_row("bad-type")
    wrong_question["question"] = 42
    wrong_profile = fx.question_row("bad-profile")
    wrong_profile["profile"] = "my posts"
    wrong_item = fx.question_row("bad-item")
    wrong_item["profile"][2] = "a bare string"
    json_only = [(wrong_question, ("bad-type", "question", "wrong_type")),
                 (wrong_profile, ("bad-profile", "profile", "wrong_type")),
                 (wrong_item, ("bad-item", "profile[2]", "wrong_type"))]
    for i, (row, issue) in enumerate(typed + json_only):
        lines.append(train[i % len(train)] if i < len(train) else fx.question_row(f"t{i}"))
        lines.append(row)
        expected.add(issue)
    lines.insert(3, '{"id": "cut", "question": "half a line')
    expected.add(("line 4", "", "unreadable_file"))
    fx.write_jsonl(tmp_path / ART / "train.jsonl", lines)
    test_rows = [fx.question_row("t0"), fx.question_row("fresh")]  # t0 repeats a train id
    fx.write_jsonl(tmp_path / ART / "test.jsonl", test_rows)
    expected.add(("t0", "id", "duplicate_id"))

    out = lamp_qa.load(str(tmp_path), skip_invalid=True)

    valid_ids = [r["id"] for r in lines if isinstance(r, dict) and r["id"].startswith("t")]
    assert ids(out.tables["queries"], "query_id") == valid_ids + ["fresh"]
    assert issue_set(out) == expected
    assert out.skipped == len(expected)
    assert all(i.file.endswith(".jsonl") for i in out.issues)


def test_lamp_qa_raise_names_file_record_and_nested_field(tmp_path):
    bad = fx.question_row("q1")
    bad["rubric_aspects"][1]["aspect"] = ""
    fx.write_json(tmp_path / f"{ART}_validation.json", [fx.question_row("q0"), bad])
    with pytest.raises(InvalidRecordError) as err:
        lamp_qa.load(str(tmp_path))
    assert f"{ART}_validation.json" in str(err.value) and "'q1'" in str(err.value)
    assert "rubric_aspects[1].aspect" in str(err.value)


def test_lamp_qa_unreadable_json_file_is_reported(tmp_path):
    (tmp_path / ART).mkdir()
    (tmp_path / ART / "test.json").write_text("[{\"id\": ", encoding="utf-8")
    fx.write_jsonl(tmp_path / ART / "train.jsonl", [fx.question_row("t0")])
    out = lamp_qa.load(str(tmp_path), skip_invalid=True)
    assert ids(out.tables["queries"], "query_id") == ["t0"]
    assert [(Path(i.file).name, i.kind) for i in out.issues] == [("test.json", "unreadable_file")]


def test_lamp_qa_json_file_holding_json_lines(tmp_path):
    # Hub "json" datasets are often JSON lines under a .json name; a bad line must stay local there too.
    fx.write_jsonl(tmp_path / ART / "test.json", [fx.question_row("a"), "{oops", fx.question_row("b")])
    out = lamp_qa.load(str(tmp_path), skip_invalid=True)
    assert ids(out.tables["queries"], "query_id") == ["a", "b"]
    assert issue_set(out) == {("line 2", "", "unreadable_file")}


# ----------------------------------------------------------------------------------------------------------
# PersonalRewardBench
# ----------------------------------------------------------------------------------------------------------

MULTI_TURN = [{"content": "Plan a dinner.", "role": "user"}, {"content": "Sure, for whom?", "role": "model"},
              {"content": "For two vegans.", "role": "user"}, {"content": "(cut off)", "role": "model"}]


def prb_users_rows() -> list[dict]:
    """u1: 3 train, 1 val, 1 test; u2: test only; u3: 1 train + 1 val (both cold-start)."""
    return [
        fx.pair_row("c1", "u1", "train", chosen_score=80, rejected_score=20),
        fx.pair_row("c2", "u2", "test", flip=True),
        fx.pair_row("c3", "u1", "train", context=MULTI_TURN),
        fx.pair_row("c4", "u3", "val"),
        fx.pair_row("c5", "u1", "val", flip=True),
        fx.pair_row("c6", "u1", "train"),
        fx.pair_row("c7", "u3", "train"),
        fx.pair_row("c8", "u1", "test"),
    ]


def with_scores_schema() -> pa.Schema:
    return fx.PAIR_SCHEMA.append(pa.field("chosen_score", pa.int64())).append(pa.field("rejected_score", pa.int64()))


def test_personal_rewardbench_pairs_histories_profiles(tmp_path):
    fx.write_parquet(tmp_path / "prism" / "data" / "train-00000-of-00001.parquet", prb_users_rows(),
                     with_scores_schema())
    out = personal_rewardbench.load(str(tmp_path / "prism"))

    assert not out.issues
    assert out.counts() == {"queries": 8, "pairs": 8, "profiles": 3, "rubrics": 0, "histories": 3}
    pairs = {p.pair_id: p for p in out.tables["pairs"]}
    assert {pid: p.split for pid, p in pairs.items()} == {
        "c1": "train", "c2": "test", "c3": "train", "c4": "val", "c5": "val", "c6": "train", "c7": "train",
        "c8": "test"}
    assert pairs["c2"].flip and not pairs["c1"].flip and pairs["c1"].subset == "prism"
    assert json.loads(pairs["c1"].meta)["chosen_score"] == 80
    assert pairs["c3"].question == "For two vegans." and pairs["c3"].context == [
        {"role": t["role"], "content": t["content"]} for t in MULTI_TURN[:3]]
    histories = {h.user_id: h for h in out.tables["histories"]}
    assert histories["u1"].pair_ids == ["c1", "c3", "c6"] and not histories["u1"].cold_start
    assert histories["u2"].pair_ids == [] and histories["u2"].cold_start
    assert histories["u3"].pair_ids == ["c7"] and histories["u3"].cold_start
    profiles = {p.user_id: p for p in out.tables["profiles"]}
    assert profiles["u1"].items == [] and not profiles["u1"].cold_start and profiles["u2"].cold_start
    lenient = personal_rewardbench.load(str(tmp_path / "prism"), cold_start_max_train=0)
    assert {h.user_id for h in lenient.tables["histories"] if h.cold_start} == {"u2"}


def test_personal_rewardbench_jsonl_equals_parquet(tmp_path):
    rows = prb_users_rows()
    fx.write_parquet(tmp_path / "a.parquet", rows, with_scores_schema())
    fx.write_jsonl(tmp_path / "b.jsonl", rows)
    from_parquet = personal_rewardbench.load(str(tmp_path / "a.parquet"), variant="chatbot_arena")
    from_jsonl = personal_rewardbench.load(str(tmp_path / "b.jsonl"), variant="chatbot_arena")
    for table in ("queries", "pairs", "profiles", "histories"):
        assert [to_row(r) for r in from_parquet.tables[table]] == [to_row(r) for r in from_jsonl.tables[table]]
    assert {p.subset for p in from_jsonl.tables["pairs"]} == {"chatbot_arena"}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_personal_rewardbench_loads_the_real_prism_example(tmp_path, fmt):
    record = fx.prism_example_record()
    path = tmp_path / f"example.{fmt}"
    if fmt == "parquet":
        fx.write_parquet(path, [record])  # schema inferred from the real record: list<struct>, struct, ...
    else:
        fx.write_jsonl(path, [record])
    out = personal_rewardbench.load(str(path), variant="prism")

    assert out.counts() == {"queries": 1, "pairs": 1, "profiles": 1, "rubrics": 0, "histories": 1}
    pair = out.tables["pairs"][0]
    assert (pair.pair_id, pair.user_id, pair.split, pair.flip) == ("c3156", "user584", "train", False)
    assert pair.question == record["context"][0]["content"]
    assert pair.chosen == record["chosen"]["content"] and pair.rejected == record["rejected"]["content"]
    assert json.loads(pair.meta) == {"type": "values guided", "turns": 1}
    assert out.tables["histories"][0].pair_ids == ["c3156"] and out.tables["histories"][0].cold_start


def test_personal_rewardbench_survey_and_choice_attribute_joins(tmp_path):
    fx.write_parquet(tmp_path / "prism.parquet", prb_users_rows(), with_scores_schema())
    survey = [fx.survey_row("u1"), fx.survey_row("u3", religion={"self_described": "none"}),
              fx.survey_row("u_not_in_pairs"), {**fx.survey_row("x"), "user_id": None}, fx.survey_row("u1")]
    fx.write_jsonl(tmp_path / "survey.jsonl", survey)
    attributes = [{"conversation_id": "c1", "choice_attributes": {"values": 80, "fluency": 55, "safety": None}},
                  {"conversation_id": "c3", "choice_attributes": {"values": 150}},
                  {"conversation_id": "c4", "choice_attributes": None}]
    fx.write_jsonl(tmp_path / "conversations.jsonl", attributes)

    out = personal_rewardbench.load(str(tmp_path / "prism.parquet"), skip_invalid=True,
                                    survey=str(tmp_path / "survey.jsonl"),
                                    choice_attributes=str(tmp_path / "conversations.jsonl"))

    profiles = {p.user_id: p for p in out.tables["profiles"]}
    assert profiles["u1"].stated_preferences == "Be brief and give concrete steps."
    assert profiles["u1"].self_description == "I am u1, a curious cook."
    assert json.loads(profiles["u3"].meta)["survey"]["religion"] == {"self_described": "none"}
    assert json.loads(profiles["u1"].meta)["survey"]["age"] == "25-34 years old"
    assert profiles["u2"].stated_preferences == "" and profiles["u2"].meta == "{}"
    pairs = {p.pair_id: json.loads(p.meta) for p in out.tables["pairs"]}
    assert pairs["c1"]["choice_attributes"] == {"values": 80, "fluency": 55}
    assert "choice_attributes" not in pairs["c3"] and "choice_attributes" not in pairs["c4"]
    assert issue_set(out) == {("<line 4>", "user_id", "missing_field"), ("u1", "user_id", "duplicate_id"),
                              ("c3", "choice_attributes.values", "bad_value")}
    assert out.counts()["pairs"] == 8  # join problems never drop a pair

    mapping = tmp_path / "attributes.json"
    fx.write_json(mapping, {"c1": {"values": 10}, "c6": {"creativity": 99}})
    joined = personal_rewardbench.load(str(tmp_path / "prism.parquet"), choice_attributes=str(mapping))
    metas = {p.pair_id: json.loads(p.meta) for p in joined.tables["pairs"]}
    assert metas["c1"]["choice_attributes"] == {"values": 10} and metas["c6"]["choice_attributes"] == {"creativity": 99}


def test_personal_rewardbench_skip_invalid_parquet_and_jsonl(tmp_path):
    valid = [fx.pair_row(f"ok{i}", f"u{i % 3}", ("train", "val", "test")[i % 3]) for i in range(6)]
    typed = fx.pair_defects_typed("pq")
    typed.append((fx.pair_row("ok1", "u5", "train"), ("ok1", "conversation_id", "duplicate_id")))
    fx.write_parquet(tmp_path / "prism" / "part-0.parquet", valid[:3] + [r for r, _ in typed], fx.PAIR_SCHEMA)
    lines: list = [valid[3]]
    expected = {issue for _, issue in typed}
    for row, (rid, field, kind) in fx.pair_defects_untyped("js"):
        lines.append(row)
        expected.add((f"line {len(lines)}" if rid == "line" else rid, field, kind))
    lines += valid[4:]
    fx.write_jsonl(tmp_path / "prism" / "part-1.jsonl", lines)

    out = personal_rewardbench.load(str(tmp_path / "prism"), skip_invalid=True)

    assert ids(out.tables["pairs"], "pair_id") == [r["conversation_id"] for r in valid]
    assert issue_set(out) == expected and out.skipped == len(expected)
    assert {h.user_id for h in out.tables["histories"]} == {"u0", "u1", "u2"}  # u9/u5 only had bad rows

    with pytest.raises(InvalidRecordError) as err:
        personal_rewardbench.load(str(tmp_path / "prism"))
    assert "part-0.parquet" in str(err.value) and "'pq-nouser'" in str(err.value) and "user_id" in str(err.value)


def test_personal_rewardbench_folder_per_subset(tmp_path):
    fx.write_parquet(tmp_path / "chatbot_arena" / "train.parquet", [fx.pair_row("a1", "ua", "train")],
                     fx.PAIR_SCHEMA)
    fx.write_jsonl(tmp_path / "prism_personalized_0125" / "data" / "train.jsonl", [fx.pair_row("p1", "up", "test")])
    out = personal_rewardbench.load(str(tmp_path))
    assert {(p.pair_id, p.subset) for p in out.tables["pairs"]} == {("a1", "chatbot_arena"), ("p1", "prism")}
    only = personal_rewardbench.load(str(tmp_path), variant="prism")
    assert ids(only.tables["pairs"], "pair_id") == ["p1"]
    fx.write_jsonl(tmp_path / "neutral" / "x.jsonl", [fx.pair_row("n1", "un", "test")])
    with pytest.raises(ValueError, match="variant"):
        personal_rewardbench.load(str(tmp_path / "neutral"))
    with pytest.raises(InvalidRecordError, match="does not exist"):
        personal_rewardbench.load(str(tmp_path / "nothing_here"))


# ----------------------------------------------------------------------------------------------------------
# Hub names
# ----------------------------------------------------------------------------------------------------------

def test_local_paths_win_over_hub_names(tmp_path, monkeypatch):
    assert raw_io.is_hub_name("QiyaoMa/Personalized-RewardBench")
    assert not raw_io.is_hub_name(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "prb").mkdir(parents=True)
    assert not raw_io.is_hub_name("data/prb")


def test_hub_name_fails_clearly_when_unreachable(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(raw_io, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(raw_io.HubUnavailableError, match="unreachable"):
        prb.load(prb.HUB_NAME)
    with pytest.raises(raw_io.HubUnavailableError, match="local directory"):
        personal_rewardbench.load(personal_rewardbench.HUB_NAMES["prism"])


def test_hub_name_fails_clearly_offline_without_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(raw_io.HubUnavailableError, match="offline mode"):
        lamp_qa.load(lamp_qa.HUB_NAME, subsets=[ART], splits=["test"])
