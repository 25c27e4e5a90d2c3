"""Benchmark of scoring speed: pairs per second of each personalized reward model on the same pairs, in one run.

Baseline: the shipped P-GenRM (``models/pgenrm_tiny``, the GenRM scorer of the reward service: one evaluation chain
per pair, the pair's two responses in it, up to 320 tokens on the transformers engine). Ours: the embedding
methods (global BT, PAL, LoRe, VPL, GPO; ``pr_rlhf.embedrm``) through their reward kinds' scorer, each pair's two
responses and the user's history pairs encoded by all-MiniLM-L6-v2 with no embedding cache (encoding counted).
The embedding methods are first trained on the same world's seen users (not timed). Data: seen-user evaluation
pairs of ``recipes/pgenrm_pipeline.yaml``'s world (seed 0, the world the shipped P-GenRM was trained on), each
with the user's first 3 train pairs as history. Every side scores the same pairs and is checked to score all of
them.

    BENCH scorers pairs_per_s_pgenrm=.. pairs_per_s_<method>=.. ... config=.. baseline=.. ours=..
          ratio=<the slowest embedding method's pairs/s over P-GenRM's>

Run: ``.venv/bin/python bench/scorers.py`` (a few minutes on 2 cores: mostly P-GenRM's chains) or ``--quick``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common

METHODS = ("bt_embedding", "pal", "lore", "vpl", "gpo")


def workload(pairs: int):
    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.leaderboard.data import evaluation_items
    from pr_rlhf.world import build_world

    world = build_world(load_recipe(common.PGENRM_RECIPE).pgenrm.world)
    items = [it for it in evaluation_items(world, seen_history=3) if it.group == "seen"]
    return world, items[:pairs]


def rate_of(scorer, requests: list, pairs: int) -> tuple[float, float]:
    """(pairs per second, seconds) of ``scorer`` over ``requests``, every one scored."""
    start = time.perf_counter()
    results = scorer.score(requests)
    seconds = time.perf_counter() - start
    failed = [e for s, e in results if s is None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(results)} requests unscored (first: {failed[0]})")
    return pairs / seconds, seconds


def pgenrm_rate(items: list) -> tuple[float, float]:
    """The GenRM scorer as the service runs it on a pair: one chain, the pair's second response as the reference."""
    from pr_rlhf.configs.reward import reward_config
    from pr_rlhf.scorers import RewardRequest, build_scorer

    cfg = reward_config(kind="genrm", judge={"model": str(common.SHIPPED_GENRM)}, sec_format="sec_compact",
                        generation={"max_tokens": 320})
    scorer = build_scorer(cfg)
    requests = [RewardRequest(it.pair_id, it.user_id, it.question, it.chosen,
                              {"reference": it.rejected, "history": it.history}) for it in items]
    scorer.score(requests[:2])   # warm-up: the model's first forward
    try:
        return rate_of(scorer, requests, len(items))
    finally:
        scorer.close()


def embedding_rates(world, items: list, steps: int, folder: Path,
                    scored_users_only: bool = False) -> dict[str, tuple[float, float]]:
    """Each embedding method's (pairs per second, seconds) on ``items``, trained first (not timed) on the world's
    seen users, or with ``scored_users_only`` on the users of ``items`` alone (--quick: encoding every training pair
    with MiniLM is most of the quick form's time, and the rate does not depend on how many users trained)."""
    from pr_rlhf.configs.reward import reward_config
    from pr_rlhf.embedrm.train import TrainSettings, save_method, train_method
    from pr_rlhf.leaderboard.data import embed_training, training_pairs
    from pr_rlhf.models.embedders import make_embedder
    from pr_rlhf.scorers import EmbeddingScorer, RewardRequest

    users = {it.user_id for it in items}
    data = embed_training([p for p in training_pairs(world) if not scored_users_only or p.user_id in users],
                          make_embedder("minilm"))
    requests = [RewardRequest(f"{it.pair_id}|{side}", it.user_id, it.question, text, {"history": it.history})
                for it in items for side, text in (("c", it.chosen), ("r", it.rejected))]
    out = {}
    for method in METHODS:
        model = save_method(train_method(method, data, TrainSettings(steps=steps)), folder / method)
        fresh = make_embedder("minilm", cache=False)   # no cache: encoding the texts is part of scoring
        fresh.encode(["warm-up"])
        scorer = EmbeddingScorer(reward_config(kind=method, model=str(model)), embedder=fresh)
        out[method] = rate_of(scorer, requests, len(items))
        print(f"{method}: {out[method][0]:.1f} pairs/s", flush=True)
    return out


def measure(args: argparse.Namespace) -> common.Result:
    import torch

    torch.set_num_threads(2)
    pairs_genrm, pairs_embed = (8, 60) if args.quick else (48, 600)
    world, items = workload(max(pairs_genrm, pairs_embed))
    common.header(benchmark="personalized reward models: pairs scored per second",
                  baseline=f"P-GenRM chains ({common.genrm_label(common.SHIPPED_GENRM)}), {pairs_genrm} pairs",
                  ours=f"embedding methods {', '.join(METHODS)} on all-MiniLM-L6-v2, {pairs_embed} pairs",
                  data="seen-user pairs of recipes/pgenrm_pipeline.yaml's world, 3 history pairs each")
    embed = embedding_rates(world, items[:pairs_embed], 100 if args.quick else 1000, common.OUT / "scorers",
                            scored_users_only=args.quick)
    genrm, genrm_s = pgenrm_rate(items[:pairs_genrm])
    print(f"P-GenRM: {genrm:.2f} pairs/s ({genrm_s:.1f} s for {pairs_genrm} pairs)", flush=True)
    slowest = min(embed, key=lambda m: embed[m][0])
    fields = {"pairs_per_s_pgenrm": common.fmt(genrm), **{f"pairs_per_s_{m}": common.fmt(r) for m, (r, _) in
                                                           embed.items()}}
    median = statistics.median(r for r, _ in embed.values())
    return common.Result("scorers", config=f"{pairs_genrm} / {pairs_embed} seen-user pairs of the pipeline world, "
                                           "3 history pairs each; 2 threads",
                         baseline=f"P-GenRM chains: {genrm:.2f} pairs/s",
                         ours=f"embedding methods: {embed[slowest][0]:.0f} ({slowest}) to "
                              f"{max(r for r, _ in embed.values()):.0f} pairs/s, median {median:.0f}",
                         ratio=embed[slowest][0] / genrm, fields=fields)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 / 60 pairs, 100 training steps on their users")
    args = parser.parse_args()
    common.run("scorers", lambda: measure(args))


if __name__ == "__main__":
    main()
