"""The synthetic persona world as a data source, and as raw PRB / PersonalRewardBench parquet.

``load`` maps the world onto the record types of ``pr_rlhf.records`` (``source="synthetic"``), like every other
source. ``export_prb`` and ``export_personal_rewardbench`` write the world in those benchmarks' raw layouts so the
real loaders can be exercised on data whose ground truth is known.
"""
from __future__ import annotations

from pathlib import Path

from pr_rlhf.configs.world import WorldConfig
from pr_rlhf.records import (
    DuplicateTracker,
    FieldChecker,
    History,
    IssueSink,
    Pair,
    Profile,
    Query,
    Rubric,
    SourceOutput,
    dump_meta,
)
from pr_rlhf.world.generator import World, WorldPair, WorldUser, build_world
from pr_rlhf.world.reference import reference_summary

SOURCE = "synthetic"
PRB_FILE = "test-00000-of-00001.parquet"
# PersonalRewardBench keeps the per-user split as a column; the files follow the HF layout per split.
PRBENCH_SPLIT_FILES = {"train": "train", "val": "validation", "test": "test"}


def _world(world_or_config: World | WorldConfig | None) -> World:
    if isinstance(world_or_config, World):
        return world_or_config
    return build_world(world_or_config or WorldConfig())


def _where(world: World) -> str:
    """A stand-in file name for issues: the world has no file, so name its seed and rendering."""
    return f"<synthetic seed={world.config.seed} rendering={world.config.rendering}>"


# ---------------------------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------------------------

def load(config: WorldConfig | World | None = None, *, skip_invalid: bool = False,
         reference: bool = True) -> SourceOutput:
    """Generate the world (or take a built one) and emit queries, pairs, profiles, rubrics and histories.

    ``out.summary`` carries the world's counts and, with ``reference``, its reference accuracies (oracle, per-user
    logistic regression, no history, true weights) for a history of 3 pairs, for the manifest."""
    world = _world(config)
    summary = world.summary()
    if reference:
        summary.update(reference_summary(world, history_size=3))
    out = SourceOutput(summary=summary)
    sink = IssueSink(skip_invalid, out)
    dupes = DuplicateTracker()
    names = world.attribute_names
    for user in world.users:
        out.add("profiles", _profile(world, user))
        out.add("histories", History(
            user_id=user.user_id, source=SOURCE, subset=user.subset,
            pair_ids=[p.pair_id for p in world.history(user.user_id)], cold_start=user.cold_start,
            meta=dump_meta({"archetype": user.archetype})))
    for p in world.pairs:
        # The world never makes a bad record, but it goes through the same checks as real sources.
        chk = FieldChecker(_where(world), p.pair_id, {"question": p.question, "chosen": p.chosen,
                                                        "rejected": p.rejected})
        for field_name in ("question", "chosen", "rejected"):
            chk.text(field_name)
        dupes.check(chk, "pairs", p.pair_id, "pair_id")
        if not sink.accept(chk):
            continue
        user = world.user(p.user_id)
        context = [{"role": "user", "content": p.question}]
        out.add("queries", Query(
            query_id=p.pair_id, user_id=p.user_id, source=SOURCE, subset=p.subset, split=p.split,
            question=p.question, context=context, category=p.topic,
            meta=dump_meta({"topic": p.topic, "thing": p.thing})))
        out.add("pairs", Pair(
            pair_id=p.pair_id, query_id=p.pair_id, user_id=p.user_id, source=SOURCE, subset=p.subset,
            split=p.split, question=p.question, chosen=p.chosen, rejected=p.rejected, context=context,
            category=p.topic, flip=p.flip, hardness=p.hardness, meta=dump_meta({
                "archetype": user.archetype,
                "chosen_attributes": dict(zip(names, p.x_chosen)),
                "rejected_attributes": dict(zip(names, p.x_rejected)),
                "differing_attributes": [n for n, c, r in zip(names, p.x_chosen, p.x_rejected) if c != r],
                "chosen_utility": p.u_chosen,
                "rejected_utility": p.u_rejected,
            })))
        out.add("rubrics", Rubric(
            query_id=p.pair_id, user_id=p.user_id, source=SOURCE, subset=p.subset, aspects=_aspects(p),
            narrative=p.narrative, meta=dump_meta({"attributes": [
                {"name": r.attribute, "wants": r.wants, "weight": r.weight, "evidence_id": r.evidence_id}
                for r in p.rubric]})))
    return out


def _profile(world: World, user: WorldUser) -> Profile:
    topics = sorted({post.category for post in user.posts})
    return Profile(
        user_id=user.user_id, source=SOURCE, subset=user.subset,
        items=[{"id": post.id, "text": post.text, "category": post.category} for post in user.posts],
        self_description=f"I mostly post about {', '.join(topics)}." if topics else "",
        cold_start=user.cold_start,
        meta=dump_meta({
            "archetype": user.archetype,
            "weights": world.user_weights(user.user_id),
            "revealing_posts": {post.id: {"attribute": post.reveals, "wants": post.wants}
                                for post in user.posts if post.reveals},
        }))


def _aspects(pair: WorldPair) -> list[dict]:
    return [{"aspect": r.aspect, "evidence": r.evidence, "reason": r.reason} for r in pair.rubric]


# ---------------------------------------------------------------------------------------------------------------
# Raw benchmark layouts
# ---------------------------------------------------------------------------------------------------------------

def _prb_schema():
    import pyarrow as pa

    return pa.schema([
        ("id", pa.string()),
        ("question", pa.string()),
        ("profile", pa.list_(pa.struct([("id", pa.string()), ("category", pa.string()), ("text", pa.string())]))),
        ("rubric_aspects", pa.list_(pa.struct([("aspect", pa.string()), ("evidence", pa.string()),
                                               ("reason", pa.string())]))),
        ("narrative", pa.string()),
        ("category", pa.string()),
        ("chosen", pa.string()),
        ("rejected", pa.string()),
    ])


def export_prb(world_or_config: World | WorldConfig | None, out_dir: str | Path, *,
               splits: tuple[str, ...] = ("test",)) -> list[Path]:
    """Write PRB-style parquet: ``{out_dir}/{Subset}/test-00000-of-00001.parquet``, one row per pair.

    PRB is a test-only benchmark, so by default only the world's test pairs are written (pass ``splits`` to
    include others). Each row carries the user's whole profile, as PRB does.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    world = _world(world_or_config)
    rows: dict[str, list[dict]] = {}
    for p in world.pairs:
        if p.split not in splits:
            continue
        user = world.user(p.user_id)
        rows.setdefault(p.subset, []).append({
            "id": p.pair_id, "question": p.question,
            "profile": [{"id": post.id, "category": post.category, "text": post.text} for post in user.posts],
            "rubric_aspects": _aspects(p), "narrative": p.narrative, "category": p.topic,
            "chosen": p.chosen, "rejected": p.rejected,
        })
    paths = []
    for subset, subset_rows in sorted(rows.items()):
        path = Path(out_dir) / subset / PRB_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(subset_rows, schema=_prb_schema()), path)
        paths.append(path)
    return paths


def _personal_rewardbench_schema():
    import pyarrow as pa

    turn = pa.struct([("role", pa.string()), ("content", pa.string())])
    return pa.schema([
        ("conversation_id", pa.string()),
        ("user_id", pa.string()),
        ("context", pa.list_(turn)),
        ("chosen", turn),
        ("rejected", turn),
        ("turns", pa.int64()),
        ("type", pa.string()),
        ("split", pa.string()),
        ("flip", pa.bool_()),
    ])


def export_personal_rewardbench(world_or_config: World | WorldConfig | None, out_dir: str | Path) -> list[Path]:
    """Write PersonalRewardBench-style parquet: ``{out_dir}/data/{train,validation,test}-00000-of-00001.parquet``.

    Every pair of every user is written, the per-user split kept in the ``split`` column ("train"/"val"/"test");
    a user's history is their train rows. ``type`` holds the topic.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    world = _world(world_or_config)
    rows: dict[str, list[dict]] = {s: [] for s in PRBENCH_SPLIT_FILES}
    for p in world.pairs:
        rows[p.split].append({
            "conversation_id": p.pair_id, "user_id": p.user_id,
            "context": [{"role": "user", "content": p.question}],
            "chosen": {"role": "model", "content": p.chosen},
            "rejected": {"role": "model", "content": p.rejected},
            "turns": 1, "type": p.topic, "split": p.split, "flip": p.flip,
        })
    paths = []
    for split, split_rows in rows.items():
        if not split_rows:
            continue
        path = Path(out_dir) / "data" / f"{PRBENCH_SPLIT_FILES[split]}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(split_rows, schema=_personal_rewardbench_schema()), path)
        paths.append(path)
    return paths
