"""The synthetic persona world: detectors, renderings, generator invariants, records, exports, determinism."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from data_pipelines import synthetic
from pr_rlhf.configs.world import CATALOG_ORDER, NOT_COMPACT
from pr_rlhf.records import History, Pair, Profile, Query, Rubric, record_key, to_row
from pr_rlhf.world import WorldConfig, build_world
from pr_rlhf.world.attributes import (
    CATALOG,
    LENGTH_THRESHOLD_WORDS,
    count_words,
    detect,
    draw_plan,
    gold_utility,
    render_compact,
    render_varied,
)
from pr_rlhf.world.topics import GENERIC_ADVICE, SUBSETS, TOPICS

ALL_VARIED = CATALOG_ORDER
ALL_COMPACT = tuple(n for n in CATALOG_ORDER if n not in NOT_COMPACT)


@pytest.fixture(scope="module")
def world():
    return build_world(WorldConfig())


@pytest.fixture(scope="module")
def small_config():
    return WorldConfig(users=24, cold_start_users=6, seed=3)


@pytest.fixture(scope="module")
def records(small_config):
    return synthetic.load(small_config)


# ---------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------

def test_config_imports_without_numpy():
    code = ("import sys; import pr_rlhf.world; from pr_rlhf.world import WorldConfig; WorldConfig(); "
            "bad = [m for m in ('numpy', 'torch') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_config_field_is_documented():
    for name, info in WorldConfig.model_fields.items():
        assert info.description and len(info.description) > 10, name


@pytest.mark.parametrize("kwargs", [
    {"rendering": "compact", "attributes": ("structure", "length")},      # length has no compact form
    {"rendering": "compact", "n_attributes": 10},
    {"rendering": "compact", "attributes": ("structure",)},               # a list needs >= 2 token lines
    {"attributes": ("structure", "sarcasm")},
    {"attributes": ("examples", "examples")},
    {"min_differing_attributes": 3, "max_differing_attributes": 2},
    {"n_attributes": 2, "max_differing_attributes": 3},
    {"profile_posts_min": 5, "profile_posts_max": 4},
    {"hard_negative_share": 1.5},
    {"unknown_knob": 1},
])
def test_config_rejects_invalid(kwargs):
    with pytest.raises(ValidationError):
        WorldConfig(**kwargs)


def test_length_is_fine_when_varied():
    assert WorldConfig(rendering="varied", n_attributes=10).attribute_names[-1] == "length"


# ---------------------------------------------------------------------------------------------------------------
# Detectors on ordinary English
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,text,expected", [
    ("structure", "Steps:\n- preheat the oven\n- bake for 20 minutes", 1),
    ("structure", "1. Preheat the oven.\n2) Bake it.", 1),
    ("structure", "* one\n* two", 1),
    ("structure", "\u2022 one\n\u2022 two", 1),
    ("structure", "- only one dash line\nand then prose.", 0),
    ("structure", "Temperatures were\n-5 and\n-6 degrees.", 0),              # negative numbers are not bullets
    ("structure", "In 1990 we moved. 2. was the number.", 0),
    ("examples", "Try a root vegetable, FOR EXAMPLE a carrot.", 1),
    ("examples", "Fruits such as apples keep well.", 1),
    ("examples", "Use hard cheese, e.g. parmesan.", 1),
    ("examples", "For instance, the French do it.", 1),
    ("examples", "This example is not a cue, and neither is suchas.", 0),
    ("enthusiasm", "What a great idea!", 1),
    ("enthusiasm", "A calm sentence.", 0),
    ("second_person", "You should try it.", 1),
    ("second_person", "Check YOUR settings.", 1),
    ("second_person", "Treat yourself.", 1),
    ("second_person", "The young man and the youth club.", 0),
    ("hedging", "It might rain.", 1),
    ("hedging", "PERHAPS later.", 1),
    ("hedging", "A mighty river, probable cause.", 0),
    ("detail", "Stir it because it burns.", 1),
    ("detail", "The reason is simple.", 1),
    ("detail", "Cause and effect.", 0),
    ("summary", "In short, practice daily.", 1),
    ("summary", "To sum up: rest.", 1),
    ("summary", "A short story.", 0),
    ("casual", "Yeah, that's cool.", 1),
    ("casual", "That is acceptable.", 0),
    ("question", "Does that help?", 1),
    ("question", "That helps.", 0),
])
def test_detectors_on_english(name, text, expected):
    assert detect(text, (name,))[name] == expected


def test_length_detector_counts_words():
    assert detect("word " * LENGTH_THRESHOLD_WORDS, ("length",))["length"] == 1
    assert detect("word " * (LENGTH_THRESHOLD_WORDS - 1), ("length",))["length"] == 0
    assert count_words("Don't stop - it's 2 words e.g. here") == 8


def test_gold_utility_on_free_text():
    text = "You could, for example, roast it!"
    weights = {"examples": 1.5, "second_person": -0.5, "enthusiasm": 0.25, "hedging": 3.0}
    assert gold_utility(text, weights) == pytest.approx(1.5 - 0.5 + 0.25)


# ---------------------------------------------------------------------------------------------------------------
# Rendering: detectors recover every rendered value
# ---------------------------------------------------------------------------------------------------------------

def test_topic_content_triggers_no_detector():
    """Plain content must stay neutral, else rendered ground truth would be wrong."""
    pieces = [s.format(thing="the thing") for s in GENERIC_ADVICE]
    for t in TOPICS:
        pieces += list(t.advice) + [f"Try {e}." for e in t.examples] + [f"It works as {r}." for r in t.reasons]
        pieces += [thing for _, thing in t.questions]
    for text in pieces:
        assert not any(detect(text, ALL_VARIED).values()), text


def test_each_attribute_phrase_triggers_only_itself():
    fill = {"thing": "bread dough", "example": "a basic loaf", "reason": "yeast likes warmth"}
    for name, attr in CATALOG.items():
        for phrase in attr.phrases:
            found = detect(phrase.format(**fill), ALL_VARIED)
            assert {n for n, v in found.items() if v} == {name}, phrase
        if attr.compact_on:
            cue = {n for n, v in detect(attr.compact_on, ALL_COMPACT).items() if v}
            assert cue == (set() if name == "structure" else {name})    # structure is realized by layout
            assert not any(detect(attr.compact_off, ALL_COMPACT).values())


def test_every_attribute_combination_renders_exactly():
    rng = np.random.default_rng(0)
    for topic in TOPICS[::3]:
        plan = draw_plan(topic, topic.questions[0][1], ALL_VARIED, rng)
        for bits in itertools.product((0, 1), repeat=len(ALL_VARIED)):
            values = dict(zip(ALL_VARIED, bits))
            assert detect(render_varied(values, plan), ALL_VARIED) == values
    for bits in itertools.product((0, 1), repeat=len(ALL_COMPACT)):
        values = dict(zip(ALL_COMPACT, bits))
        assert detect(render_compact(values), ALL_COMPACT) == values


@pytest.mark.parametrize("rendering,names", [("compact", ALL_COMPACT), ("varied", ALL_VARIED),
                                             ("compact", None), ("varied", None)])
def test_detectors_recover_world_texts(rendering, names):
    cfg = WorldConfig(users=30, cold_start_users=5, rendering=rendering, attributes=names, seed=11)
    w = build_world(cfg)
    for p in w.pairs:
        assert tuple(w.detect(p.chosen).values()) == p.x_chosen, p.chosen
        assert tuple(w.detect(p.rejected).values()) == p.x_rejected, p.rejected


def test_compact_is_one_token_per_attribute():
    w = build_world(WorldConfig(users=5, cold_start_users=0, rendering="compact"))
    k = len(w.attribute_names)
    for p in w.pairs:
        for text in (p.chosen, p.rejected):
            assert len(text.replace("- ", " ").split()) == k


def test_varied_answers_are_about_the_topic():
    w = build_world(WorldConfig(users=10, cold_start_users=0))
    topic_of = {t.name: t for t in TOPICS}
    for p in w.pairs:
        advice = topic_of[p.topic].advice
        assert p.thing in p.question or any(a in p.chosen for a in advice) or p.thing in p.chosen
        assert p.chosen != p.rejected


# ---------------------------------------------------------------------------------------------------------------
# Generator invariants
# ---------------------------------------------------------------------------------------------------------------

def test_chosen_has_higher_utility(world):
    for p in world.pairs:
        assert p.u_chosen > p.u_rejected
        w = world.user(p.user_id).weights
        noise = (p.u_chosen - w @ np.array(p.x_chosen), p.u_rejected - w @ np.array(p.x_rejected))
        assert max(abs(n) for n in noise) < 6 * world.config.utility_noise


def test_utility_noise_zero_means_true_preference():
    w = build_world(WorldConfig(users=20, cold_start_users=0, utility_noise=0.0))
    for p in w.pairs:
        assert w.user(p.user_id).weights @ p.differing > 0


def test_pairs_differ_in_allowed_number_of_attributes(world):
    cfg = world.config
    for p in world.pairs:
        differ = sum(a != b for a, b in zip(world.detect(p.chosen).values(), world.detect(p.rejected).values()))
        if p.hardness == "hard":
            assert differ == 1
        else:
            assert p.hardness == "standard"
            assert cfg.min_differing_attributes <= differ <= cfg.max_differing_attributes
    share = np.mean([p.hardness == "hard" for p in world.pairs])
    assert abs(share - cfg.hard_negative_share) < 0.04


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_hard_negative_share_extremes(share):
    w = build_world(WorldConfig(users=10, cold_start_users=2, hard_negative_share=share))
    assert {p.hardness for p in w.pairs} == {"hard" if share else "standard"}


def test_users_come_from_archetypes(world):
    cfg = world.config
    assert world.archetypes.shape == (cfg.n_archetypes, len(cfg.attribute_names))
    assert np.allclose(world.archetypes.mean(axis=0), 0.0)     # centred: no consensus preference
    residual = np.array([u.weights - world.archetypes[u.archetype] for u in world.users])
    assert residual.std() == pytest.approx(cfg.user_noise, rel=0.1)
    assert len({u.archetype for u in world.users}) == cfg.n_archetypes
    assert {u.subset for u in world.users} == set(SUBSETS)


def test_splits_by_user(world):
    cfg = world.config
    seen = [u for u in world.users if not u.cold_start]
    cold = [u for u in world.users if u.cold_start]
    assert len(seen) == cfg.users and len(cold) == cfg.cold_start_users
    for u in seen:
        splits = [p.split for p in world.pairs_of(u.user_id)]
        assert splits.count("train") == cfg.history_size
        assert splits.count("val") == cfg.val_pairs_per_user
        assert splits.count("test") == cfg.test_pairs_per_user
    for u in cold:
        splits = [p.split for p in world.pairs_of(u.user_id)]
        assert splits == ["train"] + ["test"] * cfg.cold_start_test_pairs
    for p in world.pairs:
        assert p.subset == world.user(p.user_id).subset
        assert any(t.name == p.topic and t.subset == p.subset for t in TOPICS)
    for u in world.users:   # 20 questions per subset: a user's 14 never repeat
        questions = [p.question for p in world.pairs_of(u.user_id)]
        assert len(set(questions)) == len(questions)


def test_profiles_reveal_preferences(world):
    cfg = world.config
    revealed_mag, all_mag = [], []
    for u in world.users:
        assert cfg.profile_posts_min <= len(u.posts) <= cfg.profile_posts_max
        ids = [p.id for p in u.posts]
        assert ids == [f"{u.user_id}_p{i:02d}" for i in range(len(ids))]
        assert len({p.text for p in u.posts}) == len(u.posts)
        topics = {t.name: t for t in TOPICS}
        for post in u.posts:
            assert post.category in topics
            if post.reveals:
                j = world.attribute_names.index(post.reveals)
                assert post.wants == bool(u.weights[j] > 0)
                assert topics[post.category].label.lower() in post.text.lower()
                revealed_mag.append(abs(u.weights[j]))
        all_mag.extend(np.abs(u.weights))
    share = len(revealed_mag) / sum(len(u.posts) for u in world.users)
    assert abs(share - cfg.reveal_share) < 0.05
    assert np.mean(revealed_mag) > np.mean(all_mag) + 0.2     # stronger preferences are revealed more


def test_rubrics_name_strongest_attributes(world):
    for p in world.pairs[:300]:
        u = world.user(p.user_id)
        strongest = np.argsort(-np.abs(u.weights), kind="stable")[: world.config.rubric_aspects]
        assert [r.attribute for r in p.rubric] == [world.attribute_names[j] for j in strongest]
        posts = {post.id: post for post in u.posts}
        for r in p.rubric:
            assert r.aspect == CATALOG[r.attribute].aspect(r.wants)
            assert r.wants == (r.weight > 0)
            if r.evidence_id:
                assert posts[r.evidence_id].text == r.evidence and posts[r.evidence_id].reveals == r.attribute
            else:
                assert not any(post.reveals == r.attribute for post in u.posts)
        assert p.narrative and p.narrative[0].isupper()
    assert any(r.evidence for p in world.pairs for r in p.rubric)


def test_gold_utility_matches_world_ground_truth(world):
    for p in world.pairs[:200]:
        w = world.user(p.user_id).weights
        assert world.gold_utility(p.chosen, p.user_id) == pytest.approx(float(w @ np.array(p.x_chosen)))
        assert world.gold_utility(p.rejected, w) == pytest.approx(float(w @ np.array(p.x_rejected)))


# ---------------------------------------------------------------------------------------------------------------
# Records, determinism
# ---------------------------------------------------------------------------------------------------------------

def test_load_emits_valid_records(records, small_config):
    cfg = small_config
    t = records.tables
    n_pairs = cfg.users * (cfg.history_size + cfg.val_pairs_per_user + cfg.test_pairs_per_user) \
        + cfg.cold_start_users * (1 + cfg.cold_start_test_pairs)
    assert records.counts() == {"queries": n_pairs, "pairs": n_pairs, "rubrics": n_pairs,
                                "profiles": cfg.users + cfg.cold_start_users,
                                "histories": cfg.users + cfg.cold_start_users}
    assert not records.issues and records.skipped == 0
    for table, cls in (("queries", Query), ("pairs", Pair), ("profiles", Profile), ("rubrics", Rubric),
                       ("histories", History)):
        assert all(isinstance(r, cls) and r.source == "synthetic" for r in t[table])
        keys = [record_key(table, r) for r in t[table]]
        assert len(set(keys)) == len(keys)
    pair_ids = {p.pair_id for p in t["pairs"]}
    for p in t["pairs"]:
        assert p.pair_id == f"syn_{p.user_id}_q{int(p.pair_id.rsplit('_q', 1)[1]):04d}"
        assert p.split in ("train", "val", "test") and p.hardness in ("standard", "hard")
        meta = json.loads(p.meta)
        assert meta["chosen_utility"] > meta["rejected_utility"]
        assert meta["chosen_attributes"] == detect(p.chosen, cfg.attribute_names)
        assert meta["rejected_attributes"] == detect(p.rejected, cfg.attribute_names)
        assert isinstance(meta["archetype"], int)
    for h in t["histories"]:
        assert set(h.pair_ids) <= pair_ids
        assert len(h.pair_ids) == (1 if h.cold_start else cfg.history_size)
    assert sum(p.cold_start for p in t["profiles"]) == cfg.cold_start_users
    for r in t["rubrics"]:
        assert len(r.aspects) == cfg.rubric_aspects and r.narrative
        assert all(set(a) == {"aspect", "evidence", "reason"} for a in r.aspects)
    flips = [p.flip for p in t["pairs"]]
    assert 0.35 < np.mean(flips) < 0.65


def test_same_config_same_records_and_different_seed_differs(records, small_config):
    def rows(out):
        return {table: [to_row(r) for r in recs] for table, recs in out.tables.items()}

    assert rows(synthetic.load(small_config)) == rows(records)
    other = synthetic.load(small_config.model_copy(update={"seed": small_config.seed + 1}))
    assert [p.chosen for p in other.tables["pairs"]] != [p.chosen for p in records.tables["pairs"]]
    assert [p.flip for p in other.tables["pairs"]] != [p.flip for p in records.tables["pairs"]]


def test_rendering_changes_text_not_ground_truth(small_config):
    varied = build_world(small_config)
    compact = build_world(small_config.model_copy(update={"rendering": "compact"}))
    for a, b in zip(varied.pairs, compact.pairs):
        assert (a.pair_id, a.x_chosen, a.x_rejected, a.u_chosen, a.flip) == \
               (b.pair_id, b.x_chosen, b.x_rejected, b.u_chosen, b.flip)
        assert a.chosen != b.chosen


def test_summary(world):
    s = world.summary()
    assert "reference" not in s   # the synthetic source adds those (pr_rlhf.world.reference.reference_summary)
    assert s["pairs"] == len(world.pairs) == sum(s["pairs_per_split"].values()) == sum(
        s["pairs_per_subset"].values())
    assert set(s["pairs_per_subset"]) == set(SUBSETS)
    assert s["cold_start_users"] == world.config.cold_start_users
    assert 0 < s["hard_share"] < 1


# ---------------------------------------------------------------------------------------------------------------
# Raw exports
# ---------------------------------------------------------------------------------------------------------------

def test_export_prb(tmp_path, small_config):
    w = build_world(small_config)
    paths = synthetic.export_prb(w, tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in paths) == sorted(
        f"{s}/test-00000-of-00001.parquet" for s in {p.subset for p in w.pairs if p.split == "test"})
    struct = pa.struct
    expected = pa.schema([
        ("id", pa.string()), ("question", pa.string()),
        ("profile", pa.list_(struct([("id", pa.string()), ("category", pa.string()), ("text", pa.string())]))),
        ("rubric_aspects", pa.list_(struct([("aspect", pa.string()), ("evidence", pa.string()),
                                            ("reason", pa.string())]))),
        ("narrative", pa.string()), ("category", pa.string()), ("chosen", pa.string()), ("rejected", pa.string()),
    ])
    rows = []
    for path in paths:
        table = pq.read_table(path)
        assert table.schema.remove_metadata().equals(expected)
        rows += table.to_pylist()
    test_pairs = {p.pair_id: p for p in w.pairs if p.split == "test"}
    assert {r["id"] for r in rows} == set(test_pairs)
    for r in rows[:20]:
        p = test_pairs[r["id"]]
        assert (r["chosen"], r["rejected"], r["category"]) == (p.chosen, p.rejected, p.topic)
        assert [i["id"] for i in r["profile"]] == [post.id for post in w.user(p.user_id).posts]


def test_export_personal_rewardbench(tmp_path, small_config):
    w = build_world(small_config)
    paths = synthetic.export_personal_rewardbench(w, tmp_path)
    assert sorted(p.name for p in paths) == ["test-00000-of-00001.parquet", "train-00000-of-00001.parquet",
                                             "validation-00000-of-00001.parquet"]
    turn = pa.struct([("role", pa.string()), ("content", pa.string())])
    expected = pa.schema([
        ("conversation_id", pa.string()), ("user_id", pa.string()), ("context", pa.list_(turn)),
        ("chosen", turn), ("rejected", turn), ("turns", pa.int64()), ("type", pa.string()),
        ("split", pa.string()), ("flip", pa.bool_()),
    ])
    rows = []
    for path in paths:
        table = pq.read_table(path)
        assert table.schema.remove_metadata().equals(expected)
        rows += table.to_pylist()
    assert len(rows) == len(w.pairs)
    by_id = {p.pair_id: p for p in w.pairs}
    for r in rows:
        p = by_id[r["conversation_id"]]
        assert r["split"] == p.split and r["flip"] == p.flip and r["user_id"] == p.user_id
        assert r["chosen"] == {"role": "model", "content": p.chosen}
        assert r["context"] == [{"role": "user", "content": p.question}] and r["turns"] == 1


def test_more_cold_start_users_leave_every_earlier_user_unchanged():
    """Each user's weights, pairs and profile come from streams of the world seed and the user's index: adding
    cold-start users (after the seen ones) changes nobody else. The P-GenRM worlds grow from 40 to 200 cold-start
    users this way (docs/results/pgenrm_worlds)."""
    from pathlib import Path

    from pr_rlhf.configs.recipe import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "pgenrm_pipeline.yaml")
    base = recipe.pgenrm.world.model_copy(update={"seed": 3})
    small, large = (build_world(base.model_copy(update={"cold_start_users": n})) for n in (40, 200))
    assert len(small.users) == 240 and len(large.users) == 400
    assert sum(u.cold_start for u in large.users) == 200
    for a, b in zip(small.users, large.users):
        assert (a.user_id, a.archetype, a.subset, a.cold_start) == (b.user_id, b.archetype, b.subset, b.cold_start)
        assert np.array_equal(a.weights, b.weights) and a.posts == b.posts
        assert small.pairs_of(a.user_id) == large.pairs_of(b.user_id)
    assert np.array_equal(small.archetypes, large.archetypes)
