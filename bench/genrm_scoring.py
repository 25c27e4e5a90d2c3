"""Benchmark of generative-RM scoring: N candidates sharing one long profile + rubric prefix.

A judge scores candidate answers for a user by the log-probability of each answer after the same ~512-token
prefix (the user's profile posts and rubric). Reusing the prefix is where the time goes:

1. hf: ``HFEngine.score_continuations`` (prefix run once, its KV cache expanded over the candidates) vs.
   ``score_continuations_naive`` (every candidate as one full sequence, all candidates in one batched forward:
   the strongest naive baseline, not a slow Python loop).
2. vllm: the same scoring through ``VLLMEngine`` with prefix caching on vs. off, each engine in its own
   subprocess (two in-process vLLM engines do not share one Python process well). Steady state: after one
   warm-up round, every round scores a *new* candidate set after the same prefix.

Both sides of each comparison return the same scores (checked and printed). Model: the 2.4M-parameter ``tiny``
test model built locally (``--model``: ``tiny-28m``, hidden 512 and 8 layers, is closer to compute-bound). Data: a
user of an 8-user synthetic world: a prefix of their profile posts and rubric, candidates from the world's answers.
Part 2 is optional: when vLLM is not there or fails, the BENCH line says ``vllm=failed:<reason>``.
The LAST line is machine-readable (``bench/common.py``):

    BENCH genrm_scoring hf_shared_s=<> hf_naive_s=<> hf_ratio=<> vllm_cache_on_s=<> vllm_cache_off_s=<>
          vllm_ratio=<> config=.. baseline=.. ours=.. ratio=<hf_ratio>

(times are seconds per round of N candidates). Run: ``.venv/bin/python bench/genrm_scoring.py`` (about a minute on
2 cores; mostly the two vLLM engine starts) or ``--quick``; ``--no-vllm`` skips part 2.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common

WORLD = {"users": 8, "cold_start_users": 0}


def build_workload(tokenizer, prefix_tokens: int, n: int, rounds: int) -> tuple[list[dict], list[list[str]]]:
    """A judge prefix of about ``prefix_tokens`` tokens and ``rounds`` fresh sets of ``n`` candidate answers."""
    from pr_rlhf.world import WorldConfig, build_world

    world = build_world(WorldConfig(**WORLD))
    user = world.users[0]
    pairs = world.pairs_of(user.user_id)
    rubric = "\n".join(dict.fromkeys(f"- {r.aspect}: {r.reason}" for r in pairs[0].rubric))
    header = "You judge answers for one user. Their profile posts:\n"
    posts = [f"- {post.text}" for u in world.users for post in u.posts]
    footer = f"\nTheir rubric:\n{rubric}\nQuestion: {pairs[0].question}\nRate the answer below.\n"
    body, kept = [], 0
    for post in posts:  # add posts until the rendered prefix reaches the target length
        body.append(post)
        kept = len(tokenizer(header + "\n".join(body) + footer).input_ids)
        if kept >= prefix_tokens:
            break
    prefix = [{"role": "user", "content": header + "\n".join(body) + footer}]
    answers = [t for p in world.pairs for t in (p.chosen, p.rejected)]
    sets = [answers[r * n:(r + 1) * n] for r in range(rounds)]
    return prefix, sets


def timed_rounds(score, prefix, sets: list[list[str]]) -> tuple[float, list[list[float]]]:
    """Median seconds per round after one warm-up round, and the scores of every timed round."""
    score(prefix, sets[0])
    times, scores = [], []
    for cands in sets[1:]:
        start = time.perf_counter()
        scores.append(score(prefix, cands))
        times.append(time.perf_counter() - start)
    return statistics.median(times), scores


def run_vllm_worker(args: argparse.Namespace) -> None:
    """Subprocess mode: one VLLMEngine (cache on or off); prints one JSON line."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from pr_rlhf.models.sources import resolve_model
    from pr_rlhf.models.vllm_engine import VLLMEngine

    model_dir = resolve_model(args.model)
    engine = VLLMEngine(model_dir, dtype="float32", max_model_len=args.max_len,
                        enable_prefix_caching=args.vllm_worker == "on")
    prefix, sets = build_workload(engine.tokenizer, args.prefix_tokens, args.n, args.rounds + 1)
    seconds, scores = timed_rounds(engine.score_continuations, prefix, sets)
    engine.close()
    print("RESULT " + json.dumps({"seconds": seconds, "scores": scores}), flush=True)


def vllm_subprocess(args: argparse.Namespace, mode: str) -> dict:
    cmd = [sys.executable, __file__, "--vllm-worker", mode, "--model", args.model, "--n", str(args.n),
           "--rounds", str(args.rounds), "--prefix-tokens", str(args.prefix_tokens), "--max-len", str(args.max_len)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"vllm worker ({mode}) failed with {done.returncode}:\n{done.stderr[-3000:]}")


def vllm_both(args: argparse.Namespace) -> tuple[dict, dict]:
    """Cache on, then off; ``--quick`` starts both engines at once (its times are a check, not a measurement)."""
    if not args.quick:
        return vllm_subprocess(args, "on"), vllm_subprocess(args, "off")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        on, off = pool.map(lambda mode: vllm_subprocess(args, mode), ("on", "off"))
    return on, off


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="model spec for resolve_model: tiny (default), tiny-28m, "
                                                         "smollm2, a local directory")
    parser.add_argument("--n", type=int, default=16, help="candidates per round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (after one warm-up)")
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--quick", action="store_true", help="2 timed rounds, both vLLM engines started at once")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM comparison")
    parser.add_argument("--vllm-worker", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 2
    return args


def measure(args: argparse.Namespace) -> common.Result:
    from pr_rlhf.models.hf_engine import HFEngine
    from pr_rlhf.models.prompting import encode_prompt
    from pr_rlhf.models.sources import resolve_model

    model_dir = resolve_model(args.model)
    hf = HFEngine(model_dir, max_model_len=args.max_len)
    prefix, sets = build_workload(hf.tokenizer, args.prefix_tokens, args.n, args.rounds + 1)
    prefix_len = len(encode_prompt(hf.tokenizer, prefix))
    cont_lens = [len(hf.tokenizer(c, add_special_tokens=False).input_ids) for c in sets[1]]
    params = sum(p.numel() for p in hf.model.parameters()) / 1e6
    common.header(model=f"{args.model} ({params:.1f}M params, float32)",
                  data=f"a user of a {WORLD['users']}-user synthetic world: {prefix_len}-token prefix (profile posts, "
                       f"rubric, question), {args.n} candidates of {min(cont_lens)}-{max(cont_lens)} tokens per round",
                  settings=f"{args.rounds} timed rounds after one warm-up")
    shared_s, shared_scores = timed_rounds(hf.score_continuations, prefix, sets)
    naive_s, naive_scores = timed_rounds(hf.score_continuations_naive, prefix, sets)
    hf_ratio = naive_s / shared_s
    print(f"hf: shared prefix {shared_s:.3f} s/round, naive {naive_s:.3f} s/round, {hf_ratio:.2f}x "
          f"(max |score diff| {max_abs_diff(shared_scores, naive_scores):.2e})", flush=True)
    hf.close()

    fields: dict[str, object] = {"model": args.model, "prefix_tokens": prefix_len, "n": args.n,
                                 "hf_shared_s": shared_s, "hf_naive_s": naive_s, "hf_ratio": hf_ratio}
    vllm = "vLLM part skipped (--no-vllm)"
    if args.no_vllm:
        fields["vllm"] = "skipped"
    else:
        both = common.optional_part(fields, "vllm", lambda: vllm_both(args))
        if both is None:
            vllm = f"vLLM part {fields['vllm']}"
        else:
            (on_s, on_scores), (off_s, off_scores) = ((r["seconds"], r["scores"]) for r in both)
            fields.update({"vllm_cache_on_s": on_s, "vllm_cache_off_s": off_s, "vllm_ratio": off_s / on_s})
            vllm = f"vLLM prefix cache off vs on: {off_s:.3f} vs {on_s:.3f} s per round, {off_s / on_s:.2f}x" + \
                (" (--quick: both engines at once, not a measurement)" if args.quick else "")
            print(f"vllm: prefix cache on {on_s:.3f} s/round, off {off_s:.3f} s/round, {off_s / on_s:.2f}x (max "
                  f"|score diff| on/off {max_abs_diff(on_scores, off_scores):.2e}, vs hf "
                  f"{max_abs_diff(on_scores, shared_scores):.2e})")
    return common.Result(
        "genrm_scoring", ratio=hf_ratio, fields=fields,
        config=f"{args.model} ({params:.1f}M params), {args.n} candidates after a {prefix_len}-token profile + rubric "
               f"prefix; {vllm}",
        baseline=f"hf naive (every candidate a full sequence, one batched forward): {naive_s:.3f} s per round",
        ours=f"hf shared prefix (KV cache expanded over the candidates): {shared_s:.3f} s per round")


def main() -> None:
    args = parse_args()
    if args.vllm_worker:
        run_vllm_worker(args)
        return
    common.run("genrm_scoring", lambda: measure(args))


if __name__ == "__main__":
    main()
