"""Benchmark of test-time scaling cost: m evaluation chains for ONE input, one shared-prefix request vs. m requests.

Scaling a generative reward model at test time means sampling m evaluation chains for the same input and voting.
All m chains read the same prompt (the user's history, the query and both responses), so the prompt's forward
pass can be computed once and its KV cache shared by the m samples. This measures what that saves with the
project's own ``HFEngine``:

- ``shared``: one ``generate([prompt], SamplingParams(n=m))`` call with the engine's shared-prefix path on
  (``HFEngine(share_prefix=True)``, the default): one prefill, the cache repeated m times, m rows decoded together;
- ``separate``: m calls ``generate([prompt], SamplingParams(n=1))`` one after another, what a client that sends m
  independent requests gets (each recomputes the prompt and decodes alone). Request i uses seed ``seed + i``:
  with one seed for all m they would all return the same chain;
- ``copies`` (diagnostic, not in the ratio): one call with n=m and ``share_prefix=False``, the m-copies prefill
  HF ``generate(num_return_sequences=m)`` does; shared vs. copies isolates the prefix sharing itself from the
  batched decoding that both of them have and ``separate`` lacks.

Model: the shipped P-GenRM ``models/pgenrm_tiny`` (trained by ``recipes/pgenrm_pipeline.yaml``); ``--model``
points at another one (a model spec or directory). Data: the prompt the pipeline evaluates (that recipe's world,
the ``sec_compact`` chat prompt): the first seen user's first 3 train pairs as history and their first held-out
(val) pair, the chosen answer in the slot ``chosen_slot(recipe seed, pair id)`` puts it, as ``pr-rlhf eval``
does. Temperature 1.0, top-p 1, the same ``max_tokens`` (320, the pipeline's eval budget; 64 with ``--quick``)
and fixed seeds on every side. The eos token stops a chain early, so the sides generate different numbers of
tokens; the cost compared is seconds per 1,000 generated tokens, and ``ratio = separate_s_per_ktok /
shared_s_per_ktok`` (higher is better; goal >= 3). The ratio of plain wall times is printed as well.

Then (optional part, ``--grid-pairs 0`` skips it) the wall time of gathering each scaling grid point's evidence
(``recipes/scaling_grid.yaml``'s points) for the same seen-user pairs, relative to (0, 0): the world's shards are
built into ``bench/out/scaling_cost/`` by ``data_pipelines.build.ensure_world_shards`` and the n > 0 points' user
prototypes by ``workers.scaling.build_prototypes`` with this model (both kept there for the next run; ``--quick``:
a 24-user world of the same kind, 2 pairs, 3 points). Timing: one warm-up of each side, then ``--repeats`` rounds
(default 3, ``--quick`` 1), the sides interleaved within each round so machine noise falls on all of them alike;
medians are reported. ``torch.set_num_threads(--threads)`` (default 2). With 2 torch threads on 2 cores that
another job keeps busy, every multi-threaded op waits on a preempted thread and the batched (16-row) calls suffer
far more than the 1-row ones: the header prints the load average; on a busy machine compare with --threads 1.
The LAST line is machine-readable (``bench/common.py``):

    BENCH scaling_cost m=<m> shared_s=<> separate_s=<> shared_s_per_ktok=<> separate_s_per_ktok=<> wall_ratio=<>
          copies_over_shared=<> grid=<point:x ...|failed:reason|skipped> config=.. baseline=.. ours=.. ratio=<>

(seconds are per m chains). Run: ``.venv/bin/python bench/scaling_cost.py`` or ``--quick``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common

HISTORY_PAIRS = 3
GRID_RECIPE = common.ROOT / "recipes" / "scaling_grid.yaml"
QUICK_WORLD = {"users": 24, "cold_start_users": 4, "reference_samples": 500}
QUICK_POINTS = [(0, 0), (2, 0), (2, 2)]
QUICK_PROTOTYPES = {"k": 2, "candidate_ks": [2, 4]}
QUICK_REFINE_STEPS = 20


def resolve(spec: str) -> str:
    import pr_rlhf.pgenrm  # noqa: F401 -- registers tiny-genrm's tokenizer corpus with the model sources
    from pr_rlhf.models.sources import resolve_model

    return resolve_model(spec)


def build_prompt() -> tuple[list[dict], str]:
    """The sec_compact prompt of the first seen user's first val pair after their first 3 train pairs."""
    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.reward.inputs import rm_input
    from pr_rlhf.reward.judge import chosen_slot
    from pr_rlhf.reward.sec import sec_compact_prompt
    from pr_rlhf.world import build_world

    recipe = load_recipe(str(common.PGENRM_RECIPE))
    world = build_world(recipe.pgenrm.world)
    user = world.users[0]
    pair = world.pairs_of(user.user_id, "val")[0]
    inp = rm_input(pair, world.history(user.user_id, HISTORY_PAIRS))
    slot = chosen_slot(recipe.seed, pair.pair_id)
    first, second = (inp.chosen, inp.rejected) if slot == "A" else (inp.rejected, inp.chosen)
    return sec_compact_prompt(inp, first, second), pair.pair_id


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(common.SHIPPED_GENRM),
                        help="model spec or directory (default: the shipped P-GenRM models/pgenrm_tiny)")
    parser.add_argument("--m", type=int, default=16, help="chains per input")
    parser.add_argument("--max-tokens", type=int, default=None, help="per chain (default 320, --quick 64)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 3, --quick 1)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-copies", action="store_true", help="skip the share_prefix=False diagnostic")
    parser.add_argument("--quick", action="store_true", help="m 8, max_tokens 64, 1 timed round, a small grid")
    parser.add_argument("--grid-pairs", type=int, default=None,
                        help="seen-user pairs timed at each grid point (default 8, --quick 2; 0: skip the grid)")
    parser.add_argument("--prototypes", default=None,
                        help="user prototypes for the n > 0 grid points: loaded when there, built there when not "
                             "(default: bench/out/scaling_cost/prototypes-<model, world and settings>)")
    args = parser.parse_args(argv)
    if args.quick:
        args.m = min(args.m, 8)
    args.max_tokens = args.max_tokens or (64 if args.quick else 320)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.grid_pairs = (2 if args.quick else 8) if args.grid_pairs is None else args.grid_pairs
    return args


def measure(args: argparse.Namespace) -> common.Result:
    import torch

    from pr_rlhf.models.base import SamplingParams
    from pr_rlhf.models.hf_engine import HFEngine
    from pr_rlhf.models.prompting import encode_prompt
    from pr_rlhf.threads import set_torch_threads

    set_torch_threads(args.threads)
    model_dir = resolve(args.model)
    label = common.genrm_label(model_dir)
    engine = HFEngine(model_dir, max_model_len=2048, seed=args.seed, share_prefix=True)
    prompt, pair_id = build_prompt()
    prompt_len = len(encode_prompt(engine.tokenizer, prompt))
    params = {"temperature": 1.0, "top_p": 1.0, "max_tokens": args.max_tokens}
    common.header(model=f"{label}, {sum(p.numel() for p in engine.model.parameters()) / 1e6:.1f}M params",
                  data=f"{common.PGENRM_RECIPE.relative_to(common.ROOT)}'s world, pair {pair_id} as the sec_compact "
                       f"prompt ({prompt_len} tokens, {HISTORY_PAIRS} history pairs)",
                  settings=f"m={args.m}, max_tokens={args.max_tokens}, temperature 1.0, {args.repeats} timed "
                           f"round(s), {torch.get_num_threads()} torch threads")

    def shared() -> list:
        engine.share_prefix = True
        return engine.generate([prompt], SamplingParams(n=args.m, seed=args.seed, **params))[0].samples

    def copies() -> list:
        engine.share_prefix = False
        try:
            return engine.generate([prompt], SamplingParams(n=args.m, seed=args.seed, **params))[0].samples
        finally:
            engine.share_prefix = True

    def separate() -> list:
        engine.share_prefix = True   # irrelevant at n=1 (nothing to share), set for clarity
        return [engine.generate([prompt], SamplingParams(n=1, seed=args.seed + i, **params))[0].samples[0]
                for i in range(args.m)]

    sides = {"shared": shared, "separate": separate}
    if not args.no_copies:
        sides["copies"] = copies
    for fn in sides.values():   # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in sides}
    tokens: dict[str, list[int]] = {k: [] for k in sides}
    outputs: dict[str, list] = {}
    for r in range(args.repeats):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))   # interleaved, alternating who goes first
        for name in order:
            start = time.perf_counter()
            samples = sides[name]()
            times[name].append(time.perf_counter() - start)
            tokens[name].append(sum(len(s.token_ids) for s in samples))
            outputs[name] = samples
            if any(len(s.token_ids) == 0 for s in samples):
                raise RuntimeError(f"{name}: a sample generated no tokens")

    stats = {}
    for name in sides:
        sec = statistics.median(times[name])
        per_ktok = statistics.median(t / (n / 1000) for t, n in zip(times[name], tokens[name]))
        ntok = statistics.median(tokens[name])
        finished = sum(s.finish_reason == "stop" for s in outputs[name])
        stats[name] = (sec, per_ktok)
        print(f"{name:>8}: {sec:.3f} s per {args.m} chains ({args.m / sec:.2f} chains/s), {ntok:.0f} generated "
              f"tokens ({ntok / args.m:.0f}/chain, {finished}/{args.m} ended by eos), {per_ktok:.3f} s per 1k tokens"
              f"  [runs: {', '.join(f'{t:.3f}' for t in times[name])}]")
    (sh_s, sh_k), (se_s, se_k) = stats["shared"], stats["separate"]
    fields: dict[str, object] = {"model": Path(model_dir).name, "m": args.m, "max_tokens": args.max_tokens,
                                 "shared_s": sh_s, "separate_s": se_s, "shared_s_per_ktok": sh_k,
                                 "separate_s_per_ktok": se_k, "wall_ratio": se_s / sh_s}
    if "copies" in outputs:
        same = sum(a.token_ids == b.token_ids for a, b in zip(outputs["shared"], outputs["copies"]))
        fields["copies_over_shared"] = stats["copies"][1] / sh_k
        print(f"shared vs copies (same seed): {same}/{args.m} chains token-identical; "
              f"copies/shared per-token cost {stats['copies'][1] / sh_k:.2f}x")
    print(f"separate/shared: per-token cost {se_k / sh_k:.2f}x, wall time {se_s / sh_s:.2f}x", flush=True)
    if args.grid_pairs > 0:
        grid = common.optional_part(fields, "grid", lambda: time_grid_points(engine, model_dir, args))
        if grid is not None:
            fields["grid"] = " ".join(f"{m},{n}:{x:.1f}x" for (m, n), x in grid.items())
    else:
        fields["grid"] = "skipped"
    engine.close()
    avg_tokens = statistics.median(tokens["shared"]) / args.m
    return common.Result(
        "scaling_cost", ratio=se_k / sh_k, fields=fields,
        config=f"{label}; 1 prompt of {prompt_len} tokens from the pipeline world; m = {args.m} chains of "
               f"~{avg_tokens:.0f} tokens (max {args.max_tokens}), temperature 1, {args.threads} threads",
        baseline=f"{args.m} separate requests: {se_s:.2f} s, {se_k:.3f} s per 1k tokens",
        ours=f"one shared-prefix request (n = {args.m}): {sh_s:.2f} s, {sh_k:.3f} s per 1k tokens")


def digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]


def grid_config(model_dir: str, args: argparse.Namespace):
    """recipes/scaling_grid.yaml's evaluation with this model, bench-owned shards and prototypes (``--quick``: a
    24-user world of the same kind, 3 points, 2 prototypes)."""
    from pr_rlhf.configs.recipe import load_recipe

    cfg = load_recipe(GRID_RECIPE).scaling
    world = cfg.world.model_copy(update=QUICK_WORLD) if args.quick else cfg.world
    scaling = cfg.scaling.model_dump()   # its max_tokens (320) builds the prototypes: shorter personas do not parse
    if args.quick:
        scaling["prototypes"].update(QUICK_PROTOTYPES)
        scaling["prototypes"]["refine"]["steps"] = QUICK_REFINE_STEPS
    model_file = Path(model_dir, "model.safetensors")
    model_key = [str(Path(model_dir).resolve()), model_file.stat().st_mtime_ns if model_file.is_file() else None]
    out = common.OUT / "scaling_cost"
    world_json = world.model_dump(mode="json")
    scaling["prototypes"]["path"] = args.prototypes or str(out / f"prototypes-{digest(model_key, world_json, scaling)}")
    shards = str(out / f"shards-{digest(world_json)}")
    return cfg.model_copy(update={"model": model_dir, "world": world, "shards": shards, "out": str(out),
                                  "seen_pairs": args.grid_pairs,
                                  "scaling": type(cfg.scaling).model_validate(scaling),
                                  "points": QUICK_POINTS if args.quick else cfg.points})


def time_grid_points(engine, model_dir: str, args: argparse.Namespace) -> dict[tuple[int, int], float]:
    """Wall time of gathering each grid point's evidence for the same pairs (each point on its own, as a
    deployment that serves that point would), relative to (0, 0): one greedy chain per pair."""
    from data_pipelines.build import ensure_world_shards
    from pr_rlhf.models.embedders import make_embedder
    from pr_rlhf.scaling.grid import group_inputs
    from pr_rlhf.scaling.scorer import ScaledJudge
    from workers.scaling import build_prototypes

    cfg = grid_config(model_dir, args)
    ensure_world_shards(cfg.shards, cfg.world, log=print)
    inputs = group_inputs(cfg, "seen", 0)
    index = embedder = None
    histories: dict = {}
    if any(n > 0 for _, n in cfg.points):
        embedder = make_embedder(cfg.scaling.prototypes.embedder, cache=False)
        t0 = time.perf_counter()
        index, histories, info = build_prototypes(cfg, engine, embedder, args.seed, Path(cfg.out), log=print)
        print(f"prototypes ({time.perf_counter() - t0:.0f} s, not timed below): {info}", flush=True)
    seconds = {}
    for m, n in cfg.points:
        point = cfg.scaling.model_copy(update={"m": m, "n": n, "max_tokens": args.max_tokens})
        judge = ScaledJudge(engine, point, index=index, embedder=embedder, histories=histories)
        start = time.perf_counter()
        judge.evidence(inputs)
        seconds[(m, n)] = time.perf_counter() - start
    base = seconds[(0, 0)]
    print(f"grid points ({len(inputs)} seen-user pairs, max_tokens {args.max_tokens}), wall time relative to (0, 0):")
    for (m, n), sec in seconds.items():
        print(f"  ({m:>2}, {n:>2}): {sec:7.2f} s  {sec / base:5.1f}x")
    return {point: sec / base for point, sec in seconds.items()}


def main() -> None:
    args = parse_args()
    common.run("scaling_cost", lambda: measure(args))


if __name__ == "__main__":
    main()
