"""Benchmark of the pooled Best-of-N sweep vs regenerating a fresh pool for every k.

A best-of-k curve for k in {1, 2, 4, ..., N} needs, per prompt, either ONE pool of N samples from which the exact
estimator (``pr_rlhf.bon.estimator``) reads every k (ours: N generations and N scores per prompt), or a fresh pool
of k samples for each k (the baseline: 1 + 2 + ... + N = 2N - 1 generations and scores per prompt; at N = 128,
255 vs 128). Both sides here use the same engine, prompts, sampling settings and scorer (the synthetic world's
gold utility), in the same process; ``ratio = baseline_s / pooled_s`` (higher is better; goal >= 1.8).

Policy: SmolLM2-135M (``--model``; ``tiny`` for a quick check). One engine request per prompt on both sides: on
CPU one request of 4 prompts x 32 samples (10-post profiles in the prompts) cost 1.45 s per sample against 0.55 s
for 4 requests of 32 (measured): a mixed batch would measure batch shapes, not the pooling. On CPU the default N
is 32 (63 vs 32 generations per prompt), not the GPU recipe's 128: say so when quoting it.
The LAST line is machine-readable:

    BENCH bon_sweep n=<N> prompts=<P> pooled_s=<x> fresh_s=<y> ratio=<y/x>

Run: ``.venv/bin/python bench/bon_sweep.py`` (minutes on 2 cores) or ``--quick`` (tiny model, seconds).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny model, N = 8, 2 prompts, 16 tokens")
    args = parser.parse_args()
    if args.quick:
        args.model, args.n, args.prompts, args.max_tokens = "tiny", 8, 2, 16

    import torch

    from data_pipelines.build import ensure_world_shards
    from pr_rlhf.bon.estimator import best_of_k_curve, powers_of_two
    from pr_rlhf.configs.base import engine_config
    from pr_rlhf.configs.bon import BoNConfig
    from pr_rlhf.configs.world import WorldConfig
    from pr_rlhf.models import make_engine
    from pr_rlhf.models.base import SamplingParams
    from pr_rlhf.world import build_world
    from workers.bon import load_bon_prompts

    torch.set_num_threads(args.threads)
    world_cfg = WorldConfig(users=12, cold_start_users=6)
    shards = Path(tempfile.mkdtemp(prefix="bon_bench_")) / "data"
    ensure_world_shards(shards, world_cfg)
    world = build_world(world_cfg)
    prompts = load_bon_prompts(BoNConfig(shards=str(shards), prompts=args.prompts, n=args.n), seed=0)
    engine = make_engine(engine_config(backend="hf", model=args.model, seed=0))
    ks = powers_of_two(args.n)

    def pool(n: int, seed: int) -> list[list[float]]:
        """n samples for each prompt: one engine request per prompt (its n samples share the prompt's forward
        pass), as a sweep with prompts_per_call = 1 does; both sides call it the same way."""
        out = []
        for i, (item, _) in enumerate(prompts):
            (gen,) = engine.generate([item.messages], SamplingParams(n=n, temperature=1.0, top_p=0.9,
                                                                     max_tokens=args.max_tokens, seed=seed + 1000 * i))
            out.append([world.gold_utility(s.text, item.user_id) for s in gen.samples])
        return out

    pool(1, 99)   # warm-up
    start = time.perf_counter()
    pooled = pool(args.n, 0)
    curves = [best_of_k_curve(u, u, ks) for u in pooled]   # the gold judge as the RM: the curve's upper envelope
    pooled_s = time.perf_counter() - start
    start = time.perf_counter()
    fresh = {k: pool(k, k) for k in ks}                     # a fresh pool per k: 2N - 1 samples per prompt
    fresh_best = {k: [max(u) for u in fresh[k]] for k in ks}
    fresh_s = time.perf_counter() - start
    print(f"model {args.model}, {len(prompts)} prompts, N={args.n}, ks={ks}, max_tokens {args.max_tokens}, "
          f"{torch.get_num_threads()} threads")
    print(f"pooled: {pooled_s:.2f} s ({args.n} samples per prompt); fresh pools: {fresh_s:.2f} s "
          f"({2 * args.n - 1} samples per prompt)")
    for k in ks:
        est = sum(c[k] for c in curves) / len(curves)
        print(f"  k={k:>3}: pooled exact expectation {est:.4f}; one fresh draw {sum(fresh_best[k]) / len(prompts):.4f}")
    print(f"BENCH bon_sweep n={args.n} prompts={len(prompts)} pooled_s={pooled_s:.3f} fresh_s={fresh_s:.3f} "
          f"ratio={fresh_s / pooled_s:.2f}")
    engine.close()


if __name__ == "__main__":
    main()
