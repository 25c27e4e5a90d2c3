"""Benchmark of the data pipeline: shard-building throughput, and batched retrieval vs. the bare embedder.

1. Builds Arrow shards for a PRB-shaped set (users with ~100-160 profile posts, several questions per user, posts
   repeated across users) with ``data_pipelines.build.build_shards`` and reports records/s.
2. On the same records, in the same process and with the same loaded MiniLM, measures
   - retrieval throughput: profile items ranked per second by ``retrieve_for_queries`` (cold cache), and
   - encode throughput: sentences per second of the bare ``SentenceTransformer.encode`` on a sample of the very
     texts retrieval ranks (duplicates included, in their order: what a per-query loop would embed).
   Their ratio shows what deduplication + caching + one matrix product per user buy over embedding every
   item of every query (higher is better; about 1 means no reuse).

Model: the shipped all-MiniLM-L6-v2. Data: PRB-shaped users from a generator in this file (default; ``--source
world``: the synthetic persona world of ``data_pipelines.synthetic``, whose posts repeat across users, so its ratio
is not representative). The LAST line is machine-readable (``bench/common.py``):

    BENCH data_pipeline source=<> users=<> records_per_s=<x> retrieval_items_per_s=<y> encode_items_per_s=<z>
          config=.. baseline=.. ours=.. ratio=<y/z>

Run: ``.venv/bin/python bench/data_pipeline.py`` (about a minute on 2 cores) or ``--quick`` (seconds).
"""
from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common
from pr_rlhf.records import Pair, Profile, Query, Rubric, SourceOutput

# --------------------------------------------------------------------------------------------------------------
# A PRB-shaped generator (fallback when the synthetic world is not installed)
# --------------------------------------------------------------------------------------------------------------

_TOPIC_WORDS: dict[str, str] = {
    "anime": "mecha shonen studio season episode arc animation manga opening protagonist villain sequel "
             "soundtrack subtitles dub pacing worldbuilding character finale adaptation",
    "cooking": "sourdough starter pasta garlic sauce oven recipe flour butter knife skillet braise spices "
               "marinade dough simmer roast vegetables broth seasoning",
    "running": "marathon tempo intervals shoes cadence injury stretching recovery pace mileage hills "
               "hydration race training plan knee blisters taper",
    "travel": "itinerary hostel flights budget visa backpack train museum neighbourhood passport luggage "
              "layover guidebook locals currency hiking ferry",
    "finance": "budget savings index fund mortgage interest retirement taxes debt credit invest emergency "
               "expenses salary pension portfolio inflation",
    "parenting": "toddler bedtime school tantrum routine siblings screen time homework daycare teenager "
                 "chores allowance patience discipline",
    "gardening": "tomatoes compost soil seedlings pruning mulch watering pests raised bed perennials "
                 "fertilizer shade harvest roses",
    "games": "board game strategy cooperative dice deck expansion rules campaign puzzle multiplayer "
             "tabletop miniatures co-op party",
}
TOPICS: dict[str, list[str]] = {topic: words.split() for topic, words in _TOPIC_WORDS.items()}
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
    from pr_rlhf.configs.world import WorldConfig

    # PRB-sized profiles; a few cold-start users as in the default world.
    return WorldConfig(users=users, cold_start_users=max(users // 10, 1), profile_posts_min=100,
                       profile_posts_max=160)


def load_records(source: str, users: int) -> tuple[SourceOutput, object | None]:
    """The records to build and retrieve on, plus the WorldConfig when they come from the world."""
    if source == "world":
        from data_pipelines.build import load_source
        from pr_rlhf.configs.recipe import data_config

        world = world_config(users)
        return load_source(data_config(source="synthetic"), world), world
    return prb_like(users), None


def build(source: str, users: int, world: object | None, out_dir: Path) -> tuple[int, float]:
    """Run the whole shard build (load -> MiniLM retrieval -> shards); returns (records written, seconds)."""
    from data_pipelines.build import attach_retrieval, build_shards
    from pr_rlhf.configs.recipe import data_config
    from pr_rlhf.shards import write_shards

    data = data_config(source="synthetic", out=str(out_dir))
    start = time.perf_counter()
    if source == "world":
        report = build_shards(data, world)
        records = report.records
        stages = ", ".join(f"{k}: {v:.1f}s" for k, v in report.seconds.items())
    else:  # the same stages as build_shards, with the generator as the source
        out = prb_like(users)
        attach_retrieval(out, data)
        records = sum(write_shards(out_dir, out.tables, source="prb_like", config={"users": users})["totals"].values())
        stages = "generate + retrieve + write"
    seconds = time.perf_counter() - start
    print(f"build ({source}, {users} users): {records} records in {seconds:.1f}s ({stages})", flush=True)
    return records, seconds


def texts_ranked(out: SourceOutput) -> list[str]:
    """What a per-query loop would embed: each query, then every item of its user's profile (repeats kept)."""
    from pr_rlhf.retrieval import query_text

    profiles = {p.user_id: p.items for p in out.tables["profiles"] if p.items}
    texts: list[str] = []
    for q in out.tables["queries"]:
        if q.user_id in profiles:
            texts.append(query_text(q))
            texts.extend(item["text"] for item in profiles[q.user_id])
    return texts


def encode_rate(model, texts: list[str], batch_size: int) -> float:
    start = time.perf_counter()
    model.encode(texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False)
    return len(texts) / (time.perf_counter() - start)


def retrieval_vs_encode(out: SourceOutput, inner, sample: list[str], batch_size: int = 64) -> tuple[float, float, dict]:
    """Items ranked/s by retrieve_for_queries (cold cache) and sentences/s of the bare encode, same model.

    The bare encode is timed before and after retrieval and the faster run kept: on a shared machine the load
    drifts, and keeping the better bare rate errs on the side of a lower ratio.
    """
    from pr_rlhf.models.embedders import CachedEmbedder
    from pr_rlhf.retrieval import retrieve_for_queries

    profiles = {p.user_id: p.items for p in out.tables["profiles"] if p.items}
    queries = [q for q in out.tables["queries"] if q.user_id in profiles]
    before = encode_rate(inner.model, sample, batch_size)
    start = time.perf_counter()
    stats = retrieve_for_queries(queries, profiles, top_k=10, embedder=CachedEmbedder(inner), batch_size=batch_size)
    retrieval_s = time.perf_counter() - start
    after = encode_rate(inner.model, sample, batch_size)
    details = {"queries": len(queries), "items_ranked": stats.items_ranked, "unique_texts": stats.unique_texts,
               "encode_s": stats.encode_s, "rank_s": stats.rank_s, "retrieval_s": retrieval_s,
               "encode_runs": (before, after)}
    return stats.items_ranked / retrieval_s, max(before, after), details


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny run (seconds): checks the benchmark works")
    parser.add_argument("--source", choices=("auto", "world", "prb-like"), default="prb-like",
                        help="prb-like (default): PRB-shaped users with ~100-160 mostly distinct posts; world: "
                             "the synthetic persona world (its posts repeat across users, which inflates the "
                             "ratio); auto: world when installed")
    parser.add_argument("--users", type=int, default=None,
                        help="users in the set (default: world 1000, prb-like 20; 5 / 4 with --quick)")
    parser.add_argument("--sample", type=int, default=None,
                        help="texts for the bare-encode measurement (default 1000; 100 with --quick)")
    args = parser.parse_args(argv)
    if args.source == "auto":
        args.source = "world" if have_world() else "prb-like"
    elif args.source == "world" and not have_world():
        parser.error("data_pipelines.synthetic is not installed; use --source prb-like")
    # Sized for about a minute on 2 cores: world posts are short and repeat (few distinct texts to embed), the
    # generator's are longer and mostly distinct.
    args.users = args.users or {("world", False): 1000, ("world", True): 5,
                                ("prb-like", False): 20, ("prb-like", True): 4}[(args.source, args.quick)]
    args.sample = args.sample or (100 if args.quick else 1000)
    return args


def measure(args: argparse.Namespace) -> common.Result:
    source, users = args.source, args.users
    t0 = time.perf_counter()
    import torch

    from pr_rlhf.models.embedders import SentenceTransformerEmbedder, minilm_path

    inner = SentenceTransformerEmbedder(minilm_path(), normalize=True, label="minilm")
    inner.model  # noqa: B018  (import sentence-transformers and load once, outside every timing)
    out, world = load_records(source, users)
    ranked = texts_ranked(out)
    sample = ranked[:: max(len(ranked) // args.sample, 1)][:args.sample]  # evenly spread: the whole's length mix
    encode_rate(inner.model, sample[:64], 64)  # warm-up: the very first forward pass pays one-time setup
    data = (f"{users} users of the synthetic persona world (PRB-sized profiles)" if source == "world" else
            f"{users} PRB-shaped generated users (~100-160 posts each, 1-3 queries per user)")
    common.header(model="the shipped all-MiniLM-L6-v2 (sentence-transformers)", data=data,
                  settings=f"setup {time.perf_counter() - t0:.1f}s; torch threads {torch.get_num_threads()}")

    with tempfile.TemporaryDirectory(prefix="bench_data_pipeline_") as tmp:
        records, build_s = build(source, users, world, Path(tmp) / "shards")
    records_per_s = records / build_s
    retrieval_per_s, encode_per_s, details = retrieval_vs_encode(out, inner, sample)
    distinct = details["unique_texts"] / max(details["items_ranked"], 1)
    print(f"records/s (whole shard build incl. MiniLM retrieval): {records_per_s:.1f}")
    print(f"retrieval: {details['items_ranked']} profile items for {details['queries']} queries in "
          f"{details['retrieval_s']:.1f}s (encode {details['encode_s']:.1f}s of {details['unique_texts']} unique "
          f"texts = {distinct:.1%} of items, rank {details['rank_s']:.2f}s) -> {retrieval_per_s:.0f} items/s")
    print(f"bare SentenceTransformer.encode on {len(sample)} of the same texts: "
          f"{' / '.join(f'{r:.0f}' for r in details['encode_runs'])} sentences/s (before / after; best kept)")
    return common.Result(
        "data_pipeline", ratio=retrieval_per_s / encode_per_s,
        fields={"source": source, "users": users, "records_per_s": records_per_s,
                "retrieval_items_per_s": retrieval_per_s, "encode_items_per_s": encode_per_s},
        config=f"{data}, {distinct:.0%} distinct texts; MiniLM; shard build {records_per_s:.1f} records/s incl. "
               "retrieval",
        baseline=f"bare SentenceTransformer.encode of the same texts: {encode_per_s:.0f} sentences/s",
        ours=f"batched retrieval (dedupe + cache + one matrix product per user): {retrieval_per_s:.0f} items "
             "ranked/s")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    common.run("data_pipeline", lambda: measure(args))


if __name__ == "__main__":
    main()
