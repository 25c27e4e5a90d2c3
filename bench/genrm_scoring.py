"""Benchmark of generative-RM scoring: N candidates sharing one long profile + rubric prefix.

A judge scores candidate answers for a user by the log-probability of each answer after the same ~512-token
prefix (the user's profile posts and rubric). Reusing the prefix is where the time goes:

1. hf: ``HFEngine.score_continuations`` (prefix run once, its KV cache expanded over the candidates) vs.
   ``score_continuations_naive`` (every candidate as one full sequence, all candidates in one batched forward:
   the strongest naive baseline, not a slow Python loop).
2. vllm: the same scoring through ``VLLMEngine`` with prefix caching on vs. off, each engine in its own
   subprocess (two in-process vLLM engines do not share one Python process well). Steady state: after one
   warm-up round, every round scores a *new* candidate set after the same prefix.

Both sides of each comparison return the same scores (checked and printed). Default model: the 2.4M-parameter
``tiny`` test model; ``--model tiny-28m`` (hidden 512, 8 layers) is closer to compute-bound, and shows the
same picture (measured on 2 cores, 529-token prefix, --quick: hf 5.9x, vllm 7.0x; tiny: hf 4.8x, vllm 4.8x).
The LAST line is machine-readable:

    BENCH genrm_scoring hf_shared_s=<> hf_naive_s=<> hf_ratio=<> vllm_cache_on_s=<> vllm_cache_off_s=<>
          vllm_ratio=<> ratio=<hf_ratio>

(one line; times are seconds per round of N candidates). Run: ``.venv/bin/python bench/genrm_scoring.py``
(about a minute on 2 cores; mostly the two vLLM engine starts) or ``--quick``; ``--no-vllm`` skips part 2.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_workload(tokenizer, prefix_tokens: int, n: int, rounds: int) -> tuple[list[dict], list[list[str]]]:
    """A judge prefix of about ``prefix_tokens`` tokens and ``rounds`` fresh sets of ``n`` candidate answers."""
    from pr_rlhf.world import WorldConfig, build_world

    world = build_world(WorldConfig(users=8, cold_start_users=0))
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


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="model spec for resolve_model: tiny (default), tiny-28m, "
                                                         "smollm2, a local directory")
    parser.add_argument("--n", type=int, default=16, help="candidates per round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (after one warm-up)")
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--quick", action="store_true", help="2 timed rounds")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM comparison")
    parser.add_argument("--vllm-worker", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rounds = 2
    if args.vllm_worker:
        run_vllm_worker(args)
        return

    from pr_rlhf.models.hf_engine import HFEngine
    from pr_rlhf.models.prompting import encode_prompt
    from pr_rlhf.models.sources import resolve_model

    model_dir = resolve_model(args.model)
    hf = HFEngine(model_dir, max_model_len=args.max_len)
    prefix, sets = build_workload(hf.tokenizer, args.prefix_tokens, args.n, args.rounds + 1)
    prefix_len = len(encode_prompt(hf.tokenizer, prefix))
    cont_lens = [len(hf.tokenizer(c, add_special_tokens=False).input_ids) for c in sets[1]]
    print(f"model {args.model} ({sum(p.numel() for p in hf.model.parameters()) / 1e6:.1f}M params), "
          f"prefix {prefix_len} tokens, {args.n} candidates of {min(cont_lens)}-{max(cont_lens)} tokens, "
          f"{args.rounds} timed rounds")
    shared_s, shared_scores = timed_rounds(hf.score_continuations, prefix, sets)
    naive_s, naive_scores = timed_rounds(hf.score_continuations_naive, prefix, sets)
    hf_ratio = naive_s / shared_s
    print(f"hf: shared prefix {shared_s:.3f} s/round, naive {naive_s:.3f} s/round, {hf_ratio:.2f}x "
          f"(max |score diff| {max_abs_diff(shared_scores, naive_scores):.2e})")
    hf.close()

    on_s = off_s = vllm_ratio = float("nan")
    if not args.no_vllm:
        on, off = vllm_subprocess(args, "on"), vllm_subprocess(args, "off")
        on_s, off_s = on["seconds"], off["seconds"]
        vllm_ratio = off_s / on_s
        print(f"vllm: prefix cache on {on_s:.3f} s/round, off {off_s:.3f} s/round, {vllm_ratio:.2f}x "
              f"(max |score diff| on/off {max_abs_diff(on['scores'], off['scores']):.2e}, "
              f"vs hf {max_abs_diff(on['scores'], shared_scores):.2e})")
    print(f"BENCH genrm_scoring hf_shared_s={shared_s:.4f} hf_naive_s={naive_s:.4f} hf_ratio={hf_ratio:.2f} "
          f"vllm_cache_on_s={on_s:.4f} vllm_cache_off_s={off_s:.4f} vllm_ratio={vllm_ratio:.2f} "
          f"ratio={hf_ratio:.2f}")


if __name__ == "__main__":
    main()
