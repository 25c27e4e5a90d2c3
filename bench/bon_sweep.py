"""Benchmark of the pooled Best-of-N sweep vs regenerating a fresh pool for every k.

A best-of-k curve for k in {1, 2, 4, ..., N} needs, per prompt, either ONE pool of N samples from which the exact
estimator (``pr_rlhf.bon.estimator``) reads every k (ours: N generations and N scores per prompt), or a fresh pool
of k samples for each k (the baseline: 1 + 2 + ... + N = 2N - 1 generations and scores per prompt; at N = 128,
255 vs 128). Both sides here use the same engine, prompts, sampling settings and scorer (the synthetic world's
gold utility), in the same process; ``ratio = baseline_s / pooled_s`` (higher is better; goal >= 1.8).

Model: the policy SmolLM2-135M-Instruct (``--model``; ``tiny`` with ``--quick``). Data: held-out queries of a
12-user synthetic world (10-post profiles in the prompts), its shards built into a temp dir by
``data_pipelines.build.ensure_world_shards``. One engine request per prompt on both sides (a request mixing
several prompts would measure batch shapes, not the pooling; docs/benchmarks.md has the measurement). On CPU the
default N is 32 (63 vs 32 generations per prompt), not the GPU recipe's 128: say so when quoting it.
The LAST line is machine-readable (``bench/common.py``):

    BENCH bon_sweep model=<> n=<N> prompts=<P> pooled_s=<x> fresh_s=<y> config=.. baseline=.. ours=.. ratio=<y/x>

Run: ``.venv/bin/python bench/bon_sweep.py`` (minutes on 2 cores) or ``--quick`` (tiny model, seconds).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common

WORLD = {"users": 12, "cold_start_users": 6}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="policy model spec or directory")
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny model, N = 8, 2 prompts, 16 tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.n, args.prompts, args.max_tokens = "tiny", 8, 2, 16
    return args


def measure(args: argparse.Namespace) -> common.Result:
    import torch

    from data_pipelines.build import ensure_world_shards
    from pr_rlhf.bon.estimator import best_of_k_curve, powers_of_two
    from pr_rlhf.configs.base import engine_config
    from pr_rlhf.configs.bon import BoNConfig
    from pr_rlhf.configs.world import WorldConfig
    from pr_rlhf.models import make_engine
    from pr_rlhf.models.base import SamplingParams
    from pr_rlhf.threads import set_torch_threads
    from pr_rlhf.world import build_world
    from workers.bon import load_bon_prompts

    set_torch_threads(args.threads)
    world_cfg = WorldConfig(**WORLD)
    with tempfile.TemporaryDirectory(prefix="bon_bench_") as tmp:   # the prompts are read into memory
        shards = Path(tmp) / "data"
        ensure_world_shards(shards, world_cfg)
        prompts = load_bon_prompts(BoNConfig(shards=str(shards), prompts=args.prompts, n=args.n), seed=0)
    world = build_world(world_cfg)
    engine = make_engine(engine_config(backend="hf", model=args.model, seed=0))
    ks = powers_of_two(args.n)
    common.header(model=f"policy {args.model} (hf engine), scorer: the world's gold utility",
                  data=f"{len(prompts)} held-out queries of a {WORLD['users']}-user synthetic world",
                  settings=f"N={args.n}, ks={ks}, max_tokens {args.max_tokens}, temperature 1.0, top-p 0.9, "
                           f"{torch.get_num_threads()} threads")

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
    engine.close()
    print(f"pooled: {pooled_s:.2f} s ({args.n} samples per prompt); fresh pools: {fresh_s:.2f} s "
          f"({2 * args.n - 1} samples per prompt)")
    for k in ks:
        est = sum(c[k] for c in curves) / len(curves)
        print(f"  k={k:>3}: pooled exact expectation {est:.4f}; one fresh draw {sum(fresh_best[k]) / len(prompts):.4f}")
    return common.Result(
        "bon_sweep", ratio=fresh_s / pooled_s,
        fields={"model": args.model, "n": args.n, "prompts": len(prompts), "pooled_s": pooled_s, "fresh_s": fresh_s},
        config=f"policy {args.model}, {len(prompts)} prompts of a {WORLD['users']}-user world, best-of-k for k = "
               f"1..{args.n}, {args.max_tokens} tokens, one request per prompt, {args.threads} threads",
        baseline=f"a fresh pool per k ({2 * args.n - 1} samples per prompt): {fresh_s:.3g} s",
        ours=f"one pool of N = {args.n}: {pooled_s:.3g} s")


def main() -> None:
    args = parse_args()
    common.run("bon_sweep", lambda: measure(args))


if __name__ == "__main__":
    main()
