"""Benchmark of the data pipeline: shard-building throughput, and batched retrieval vs. the bare embedder.

1. Builds Arrow shards for a PRB-shaped set (users with ~100-160 profile posts, several questions per user, posts
   repeated across users) with ``data_pipelines.build.build_shards`` and reports records/s.
2. On the same records, in the same process and with the same loaded MiniLM, measures
   - retrieval throughput: profile items ranked per second by ``retrieve_for_queries`` (cold cache), and
   - encode throughput: sentences per second of the bare ``SentenceTransformer.encode`` on a sample of the very
     texts retrieval ranks (duplicates included, in their order: what a per-query loop would embed).
   Their ratio shows what deduplication + caching + one matrix product per user buy over embedding every
   item of every query (higher is better; about 1 means no reuse).

The set comes from the synthetic persona world (``data_pipelines.synthetic``) when it is installed, else from a
PRB-shaped generator in this file (``--source`` forces either). The LAST line is machine-readable:

    BENCH data_pipeline records_per_s=<x> retrieval_items_per_s=<y> encode_items_per_s=<z> ratio=<y/z>

Run: ``.venv/bin/python bench/data_pipeline.py`` (about a minute on 2 cores) or ``--quick`` (seconds).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pr_rlhf.records import Pair, Profile, Query, Rubric, SourceOutput  # noqa: E402

# --------------------------------------------------------------------------------------------------------------
# A PRB-shaped generator (fallback when the synthetic world is not installed)
# --------------------------------------------------------------------------------------------------------------

TOPICS: dict[str, list[str]] = {
    "anime": "mecha shonen studio season episode arc animation manga opening protagonist villain sequel "
             "soundtrack subtitles dub pacing worldbuilding character finale adaptation".split(),
    "cooking": "sourdough starter pasta garlic sauce oven recipe flour butter knife skillet braise spices "
               "marinade dough simmer roast vegetables broth seasoning".split(),
    "running": "marathon tempo intervals shoes cadence injury stretching recovery pace mileage hills "
               "hydration race training plan knee blisters taper".split(),
    "travel": "itinerary hostel flights budget visa backpack train museum neighbourhood passport luggage "
              "layover guidebook locals currency hiking ferry".split(),
    "finance": "budget savings index fund mortgage interest retirement taxes debt credit invest emergency "
               "expenses salary pension portfolio inflation".split(),
    "parenting": "toddler bedtime school tantrum routine siblings screen time homework daycare teenager "
                 "chores allowance patience discipline".split(),
    "gardening": "tomatoes compost soil seedlings pruning mulch watering pests raised bed perennials "
                 "fertilizer shade harvest roses".split(),
    "games": "board game strategy cooperative dice deck expansion rules campaign puzzle multiplayer "
             "tabletop miniatures co-op party".split(),
}
OPENERS = ["I have been wondering about", "Does anyone have advice on", "Quick question about",
           "Lately I keep thinking about", "Looking for recommendations on", "Here is my experience with",
           "I am struggling with", "What do you all think of"]
FILLERS = ["and honestly it has been harder than I expected", "because my usual approach stopped working",
           "since a friend suggested trying something new", "which I would love some perspective on",
           "after reading a few threads here", "but I do not want to spend too much",
           "and I tried a couple of things already", "for the first time this year"]
COMMON_POSTS = ["Thanks everyone for the helpful answers!", "Any update on this? Still looking for ideas.",
                "Bumping this in case someone knows.", "This worked for me, marking as solved."]


def _post(rng: random.Random, topic: str) -> str:
    words = TOPICS[topic]
    sentences = []
    for _ in range(rng.randint(1, 4)):  # ~30 words: long posts make MiniLM ~60 sentences/s on 2 cores
        picked = " ".join(rng.sample(words, 3))
        sentences.append(f"{rng.choice(OPENERS)} {picked} {rng.choice(FILLERS)}.")
    return " ".join(sentences)


def prb_like(users: int, seed: int = 0) -> SourceOutput:
    """PRB-shaped records: ~100-160 posts per user (heavy tail), 1-3 questions per user sharing its profile,
    ~20% of each profile drawn from a pool of posts that recur across users (cross-posts, boilerplate)."""
    rng = random.Random(seed)
    topics = list(TOPICS)
    shared_pool = [_post(rng, rng.choice(topics)) for _ in range(max(users // 2, 20))] + COMMON_POSTS
    out = SourceOutput()
    for u in range(users):
        user = f"user{u:05d}"
        subset = ("Art_and_Entertainment", "Lifestyle_and_Personal_Development", "Society_and_Culture")[u % 3]
        favourite = rng.sample(topics, 3)
        n_posts = min(100 + int(rng.paretovariate(2.5) * 20) - 20, 400)  # 100..400, median ~110
        items = []
        for i in range(n_posts):
            text = rng.choice(shared_pool) if rng.random() < 0.2 else _post(rng, rng.choice(favourite))
            items.append({"id": f"{user}_{i}", "text": text, "category": rng.choice(favourite)})
        out.add("profiles", Profile(user_id=user, source="prb_like", subset=subset, items=items))
        for q in range(rng.randint(1, 3)):
            topic = rng.choice(favourite)
            qid = f"{u}_{q}"
            question = f"{rng.choice(OPENERS)} {' '.join(rng.sample(TOPICS[topic], 4))}?"
            out.add("queries", Query(query_id=qid, user_id=user, source="prb_like", subset=subset, split="test",
                                     question=question, category=topic))
            out.add("pairs", Pair(pair_id=qid, query_id=qid, user_id=user, source="prb_like", subset=subset,
                                  split="test", question=question, chosen=_post(rng, topic),
                                  rejected=_post(rng, topic), category=topic))
            out.add("rubrics", Rubric(query_id=qid, user_id=user, source="prb_like", subset=subset,
                                      aspects=[{"aspect": w, "evidence": "", "reason": ""}
                                               for w in rng.sample(TOPICS[topic], 3)]))
    return out


# --------------------------------------------------------------------------------------------------------------
# Stages
# --------------------------------------------------------------------------------------------------------------

def have_world() -> bool:
    return importlib.util.find_spec("data_pipelines.synthetic") is not None


def world_config(users: int):
    from pr_rlhf.world.config import WorldConfig

    # PRB-sized profiles; a few cold-start users as in the default world.
    return WorldConfig(users=users, cold_start_users=max(users // 10, 1), profile_posts_min=100,
                       profile_posts_max=160)


def build(source: str, users: int, out_dir: Path) -> tuple[int, float, SourceOutput]:
    """Run the shard build; returns (records written, seconds, the source records for the retrieval bench)."""
    from pr_rlhf.config import DataConfig

    if source == "world":
        from data_pipelines.build import build_shards, load_source

        data = DataConfig(source="synthetic", out=str(out_dir))
        world = world_config(users)
        start = time.perf_counter()
        report = build_shards(data, world)
        seconds = time.perf_counter() - start
        print(f"build_shards (synthetic world, {users} users): {report.records} records in {seconds:.1f}s "
              f"stages {{{', '.join(f'{k}: {v:.1f}s' for k, v in report.seconds.items())}}}", flush=True)
        return report.records, seconds, load_source(data, world)

    # PRB-shaped fallback: the same stages as build_shards (generate -> retrieve -> write shards).
    from data_pipelines.build import attach_retrieval
    from pr_rlhf.shards import write_shards

    data = DataConfig(source="synthetic", out=str(out_dir))
    start = time.perf_counter()
    out = prb_like(users)
    attach_retrieval(out, data)
    manifest = write_shards(out_dir, out.tables, source="prb_like", config={"users": users})
    seconds = time.perf_counter() - start
    records = sum(manifest["totals"].values())
    print(f"build (PRB-shaped generator, {users} users): {records} records in {seconds:.1f}s", flush=True)
    return records, seconds, out  # retrieval below overwrites `retrieved`, so the same records serve


def retrieval_vs_encode(out: SourceOutput, sample: int, batch_size: int = 64) -> tuple[float, float, dict]:
    """Items ranked/s by retrieve_for_queries (cold cache) and sentences/s of the bare encode, same model."""
    from pr_rlhf.models.embedders import CachedEmbedder, SentenceTransformerEmbedder, minilm_path
    from pr_rlhf.retrieval import query_text, retrieve_for_queries

    inner = SentenceTransformerEmbedder(minilm_path(), normalize=True, label="minilm")
    model = inner.model
    model.encode(["warm up the kernels"] * batch_size, batch_size=batch_size, normalize_embeddings=True)

    profiles = {p.user_id: p.items for p in out.tables["profiles"] if p.items}
    queries = [q for q in out.tables["queries"] if q.user_id in profiles]
    # What a per-query loop embeds: every profile item of every query (repeats included), plus the query.
    ranked_texts: list[str] = []
    for q in queries:
        ranked_texts.append(query_text(q))
        ranked_texts.extend(item["text"] for item in profiles[q.user_id])
    stride = max(len(ranked_texts) // sample, 1)
    encode_sample = ranked_texts[::stride][:sample]  # evenly spread, so its length mix matches the whole

    start = time.perf_counter()
    model.encode(encode_sample, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False)
    encode_per_s = len(encode_sample) / (time.perf_counter() - start)

    start = time.perf_counter()
    stats = retrieve_for_queries(queries, profiles, top_k=10, embedder=CachedEmbedder(inner),
                                 batch_size=batch_size)
    retrieval_s = time.perf_counter() - start
    details = {"queries": len(queries), "items_ranked": stats.items_ranked, "unique_texts": stats.unique_texts,
               "encode_s": stats.encode_s, "rank_s": stats.rank_s, "retrieval_s": retrieval_s,
               "encode_sample": len(encode_sample)}
    return stats.items_ranked / retrieval_s, encode_per_s, details


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny run (seconds): checks the benchmark works")
    parser.add_argument("--source", choices=("auto", "world", "prb-like"), default="auto",
                        help="auto: the synthetic world when data_pipelines.synthetic exists, else the generator")
    parser.add_argument("--users", type=int, default=None, help="users in the set (default 30; 4 with --quick)")
    parser.add_argument("--sample", type=int, default=None,
                        help="texts for the bare-encode measurement (default 1000; 100 with --quick)")
    args = parser.parse_args(argv)

    source = args.source
    if source == "auto":
        source = "world" if have_world() else "prb-like"
    elif source == "world" and not have_world():
        parser.error("data_pipelines.synthetic is not installed; use --source prb-like")
    users = args.users or (4 if args.quick else 30)
    sample = args.sample or (100 if args.quick else 1000)

    t0 = time.perf_counter()
    from sentence_transformers import SentenceTransformer  # noqa: F401  (import once, outside every timing)
    print(f"import sentence_transformers: {time.perf_counter() - t0:.1f}s; source={source}; torch threads "
          f"{__import__('torch').get_num_threads()}", flush=True)

    with tempfile.TemporaryDirectory(prefix="bench_data_pipeline_") as tmp:
        records, build_s, out = build(source, users, Path(tmp) / "shards")
    records_per_s = records / build_s
    retrieval_per_s, encode_per_s, details = retrieval_vs_encode(out, sample)
    print(f"records/s (whole shard build incl. MiniLM retrieval): {records_per_s:.1f}")
    print(f"retrieval: {details['items_ranked']} profile items for {details['queries']} queries in "
          f"{details['retrieval_s']:.1f}s (encode {details['encode_s']:.1f}s of {details['unique_texts']} unique "
          f"texts = {details['unique_texts'] / max(details['items_ranked'], 1):.1%} of items, "
          f"rank {details['rank_s']:.2f}s) -> {retrieval_per_s:.0f} items/s")
    print(f"bare SentenceTransformer.encode on {details['encode_sample']} of the same texts: "
          f"{encode_per_s:.0f} sentences/s")
    ratio = retrieval_per_s / encode_per_s
    print(f"BENCH data_pipeline records_per_s={records_per_s:.2f} retrieval_items_per_s={retrieval_per_s:.2f} "
          f"encode_items_per_s={encode_per_s:.2f} ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
