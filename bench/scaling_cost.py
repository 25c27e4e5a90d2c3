"""Benchmark of test-time scaling cost: m evaluation chains for ONE input, one shared-prefix request vs. m requests.

Scaling a generative reward model at test time means sampling m evaluation chains for the same input and voting.
All m chains read the same prompt (the user's history, the query and both responses), so the prompt's forward
pass can be computed once and its KV cache shared by the m samples. This measures what that saves with the
project's own ``HFEngine`` and the tiny GenRM the project trains:

- ``shared``: one ``generate([prompt], SamplingParams(n=m))`` call with the engine's shared-prefix path on
  (``HFEngine(share_prefix=True)``, the default): one prefill, the cache repeated m times, m rows decoded together;
- ``separate``: m calls ``generate([prompt], SamplingParams(n=1))`` one after another, what a client that sends m
  independent requests gets (each recomputes the prompt and decodes alone). Request i uses seed ``seed + i``:
  with one seed for all m they would all return the same chain;
- ``copies`` (diagnostic, not in the ratio): one call with n=m and ``share_prefix=False``, the m-copies prefill
  HF ``generate(num_return_sequences=m)`` does; shared vs. copies isolates the prefix sharing itself from the
  batched decoding that both of them have and ``separate`` lacks.

Workload: the prompt the pipeline evaluates (``recipes/pgenrm_pipeline.yaml``'s world, the ``sec_compact`` chat
prompt): the first seen user's first 3 train pairs as history and their first held-out (val) pair, the chosen
answer in the slot ``chosen_slot(recipe seed, pair id)`` puts it, as ``pr-rlhf eval`` does. Temperature 1.0,
top-p 1, the same ``max_tokens`` (320, the pipeline's eval budget; 64 with ``--quick``) and fixed seeds on every
side. The eos token stops a chain early, so the sides generate different numbers of tokens; the cost compared is
seconds per 1,000 generated tokens, and ``ratio = separate_s_per_ktok / shared_s_per_ktok`` (higher is better;
goal >= 3). The ratio of plain wall times is printed as well.

Model: the trained GenRM at ``runs/pgenrm/curriculum/model`` when it exists, else ``resolve_model("tiny-genrm")``
(untrained: its chains are garbage, but what they cost is the same); ``--model`` overrides. Timing: one warm-up
of each side, then ``--repeats`` rounds (default 3, ``--quick`` 1), the sides interleaved within each round so
machine noise falls on all of them alike; medians are reported. ``torch.set_num_threads(--threads)`` (default 2).
Mind the load: with 2 torch threads on 2 cores that another job keeps busy, every multi-threaded op waits on a
preempted thread; the batched (16-row) calls are hit far harder than the 1-row ones and the numbers are noise
(measured next to a training job, --quick: 2 threads shared 16.6 s, separate 42.3 s, 2.5x; 1 thread shared
0.77 s, separate 4.59 s, 6.0x). The header prints the load average; on a busy machine compare with --threads 1.
The LAST line is machine-readable:

    BENCH scaling_cost m=<m> shared_s=<> separate_s=<> shared_s_per_ktok=<> separate_s_per_ktok=<> ratio=<>

(one line; seconds are per m chains). Run: ``.venv/bin/python bench/scaling_cost.py`` or ``--quick``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPE = ROOT / "recipes" / "pgenrm_pipeline.yaml"
TRAINED_MODEL = ROOT / "runs" / "pgenrm" / "curriculum" / "model"
HISTORY_PAIRS = 3


def bench_line(m: int, shared_s: float, separate_s: float, shared_s_per_ktok: float,
               separate_s_per_ktok: float) -> str:
    """The machine-readable last line; ``ratio`` is the per-token cost of separate requests over shared."""
    ratio = separate_s_per_ktok / shared_s_per_ktok if shared_s_per_ktok > 0 else float("nan")
    return (f"BENCH scaling_cost m={m} shared_s={shared_s:.4f} separate_s={separate_s:.4f} "
            f"shared_s_per_ktok={shared_s_per_ktok:.4f} separate_s_per_ktok={separate_s_per_ktok:.4f} "
            f"ratio={ratio:.2f}")


def pick_model(spec: str | None) -> tuple[str, str]:
    """(local model directory, how it was chosen)."""
    import pr_rlhf.pgenrm  # noqa: F401 -- registers tiny-genrm's tokenizer corpus with the model sources
    from pr_rlhf.models.sources import resolve_model

    if spec:
        return resolve_model(spec), f"--model {spec}"
    if (TRAINED_MODEL / "config.json").is_file():
        return str(TRAINED_MODEL), "trained GenRM (runs/pgenrm/curriculum/model)"
    return resolve_model("tiny-genrm"), "UNTRAINED tiny-genrm (runs/pgenrm/curriculum/model not found)"


def build_prompt() -> tuple[list[dict], str]:
    """The sec_compact prompt of the first seen user's first val pair after their first 3 train pairs."""
    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.reward.inputs import rm_input
    from pr_rlhf.reward.judge import chosen_slot
    from pr_rlhf.reward.sec import sec_compact_prompt
    from pr_rlhf.world import build_world

    recipe = load_recipe(str(RECIPE))
    world = build_world(recipe.pgenrm.world)
    user = world.users[0]
    pair = world.pairs_of(user.user_id, "val")[0]
    inp = rm_input(pair, world.history(user.user_id, HISTORY_PAIRS))
    slot = chosen_slot(recipe.seed, pair.pair_id)
    first, second = (inp.chosen, inp.rejected) if slot == "A" else (inp.rejected, inp.chosen)
    return sec_compact_prompt(inp, first, second), pair.pair_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model spec or directory (default: the trained GenRM at "
                                                      "runs/pgenrm/curriculum/model, else tiny-genrm)")
    parser.add_argument("--m", type=int, default=16, help="chains per input")
    parser.add_argument("--max-tokens", type=int, default=None, help="per chain (default 320, --quick 64)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 3, --quick 1)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-copies", action="store_true", help="skip the share_prefix=False diagnostic")
    parser.add_argument("--quick", action="store_true", help="max_tokens 64, 1 timed round")
    parser.add_argument("--grid-pairs", type=int, default=8, help="pairs timed at each grid point (0: skip); "
                        "n > 0 points need the prototypes `pr-rlhf scaling recipes/scaling_grid.yaml` saves")
    parser.add_argument("--prototypes", default=str(ROOT / "runs" / "scaling" / "prototypes"))
    args = parser.parse_args()
    args.max_tokens = args.max_tokens or (64 if args.quick else 320)
    args.repeats = args.repeats or (1 if args.quick else 3)

    import torch

    from pr_rlhf.models.base import SamplingParams
    from pr_rlhf.models.hf_engine import HFEngine
    from pr_rlhf.models.prompting import encode_prompt

    torch.set_num_threads(args.threads)
    model_dir, chosen = pick_model(args.model)
    engine = HFEngine(model_dir, max_model_len=2048, seed=args.seed, share_prefix=True)
    prompt, pair_id = build_prompt()
    prompt_len = len(encode_prompt(engine.tokenizer, prompt))
    params = {"temperature": 1.0, "top_p": 1.0, "max_tokens": args.max_tokens}
    print(f"model {model_dir}: {chosen}, {sum(p.numel() for p in engine.model.parameters()) / 1e6:.1f}M params; "
          f"prompt {pair_id} ({prompt_len} tokens, {HISTORY_PAIRS} history pairs); m={args.m}, "
          f"max_tokens={args.max_tokens}, temperature 1.0, {args.repeats} timed round(s), "
          f"{torch.get_num_threads()} torch threads (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
          f"CPUs); share_prefix default on: {engine.share_prefix}")

    def shared() -> list:
        engine.share_prefix = True
        gen = engine.generate([prompt], SamplingParams(n=args.m, seed=args.seed, **params))[0]
        return gen.samples

    def copies() -> list:
        engine.share_prefix = False
        try:
            gen = engine.generate([prompt], SamplingParams(n=args.m, seed=args.seed, **params))[0]
        finally:
            engine.share_prefix = True
        return gen.samples

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
            for s in samples:
                if len(s.token_ids) == 0:
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
    if "copies" in outputs:
        same = sum(a.token_ids == b.token_ids for a, b in zip(outputs["shared"], outputs["copies"]))
        print(f"shared vs copies (same seed): {same}/{args.m} chains token-identical; "
              f"copies/shared per-token cost {stats['copies'][1] / stats['shared'][1]:.2f}x")
    (sh_s, sh_k), (se_s, se_k) = stats["shared"], stats["separate"]
    print(f"separate/shared: per-token cost {se_k / sh_k:.2f}x, wall time {se_s / sh_s:.2f}x")
    if args.grid_pairs > 0:
        time_grid_points(engine, args)
    print(bench_line(args.m, sh_s, se_s, sh_k, se_k))
    engine.close()


def time_grid_points(engine, args) -> None:
    """Wall time of gathering each grid point's evidence for the same pairs (each point on its own, as a
    deployment that serves that point would), relative to (0, 0): one greedy chain per pair."""
    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.configs.scaling import DEFAULT_GRID
    from pr_rlhf.models.embedders import make_embedder
    from pr_rlhf.scaling.embedding import embedder_name
    from pr_rlhf.scaling.grid import group_inputs, member_histories
    from pr_rlhf.scaling.index import PrototypeIndex
    from pr_rlhf.scaling.scorer import ScaledJudge

    cfg = load_recipe(ROOT / "recipes" / "scaling_grid.yaml").scaling
    cfg = cfg.model_copy(update={"seen_pairs": args.grid_pairs})
    inputs = group_inputs(cfg, "seen", 0)
    index = embedder = None
    histories: dict = {}
    points = list(DEFAULT_GRID)
    if Path(args.prototypes, "prototypes.json").is_file():
        embedder = make_embedder(cfg.scaling.prototypes.embedder, cache=False)
        index = PrototypeIndex.load(args.prototypes, expected_embedder=embedder_name(embedder))
        histories, _ = member_histories(cfg.shards, cfg.seen_history_pairs)
    else:
        points = [p for p in points if p[1] == 0]
        print(f"no prototypes at {args.prototypes}: timing the n = 0 points only")
    seconds = {}
    for m, n in points:
        judge = ScaledJudge(engine, cfg.scaling.model_copy(update={"m": m, "n": n,
                                                                  "max_tokens": args.max_tokens}),
                            index=index, embedder=embedder, histories=histories)
        start = time.perf_counter()
        judge.evidence(inputs)
        seconds[(m, n)] = time.perf_counter() - start
    base = seconds[(0, 0)]
    print(f"grid points ({len(inputs)} seen-user pairs, max_tokens {args.max_tokens}), wall time relative to (0, 0):")
    for (m, n), sec in seconds.items():
        print(f"  ({m:>2}, {n:>2}): {sec:7.2f} s  {sec / base:5.1f}x")


if __name__ == "__main__":
    main()
