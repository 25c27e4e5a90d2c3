"""Benchmark of one-step-off asynchronous rollout against the sequential step: completions per second of our
``RLController`` with ``train.rollout_mode: sync`` (baseline) and ``one_step_off`` (ours), in one run.

The workload is ``bench/grpo_throughput.py``'s, measured the same way (its "ours" side, run here twice in its own
subprocesses): a random-init tiny Qwen2 (~1M parameters, and ~25M unless ``--quick``), 8 prompts of 64 tokens x 8
completions of <= 64 new tokens per step, the gold reward, one optimizer step per step, the hf rollout backend and
one learner rank, setup excluded; each mode at its best use of 2 cores: sync with 2 torch threads per actor (its
phases run one at a time), one_step_off with 1 (the rollout and the learner run at once; 2 each oversubscribe the
cores and spin-wait), one warm-up step then N measured steps. In
``one_step_off`` the engines generate step t+1 while the learner updates on step t (the rollout and the update then
share the machine's cores); its steps also compute the proximal log-probs the behaviour correction needs (an extra
forward pass that the sequential single update skips). Generated tokens per completion are printed beside each
figure: the two modes sample the same seeds from weights one update apart, so their lengths may differ slightly.

The LAST line is machine-readable (``bench/common.py``):

    BENCH async_rollout completions_per_s_sync_tiny=<> completions_per_s_async_tiny=<> ratio_tiny=<> [.._25m=<>]
          config=.. baseline=.. ours=.. ratio=<async/sync at the largest size measured>

Run: ``.venv/bin/python bench/async_rollout.py`` (N=6, both sizes; a few minutes on 2 cores) or ``--quick`` (N=1,
~1M only).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common
from bench import grpo_throughput as workload

# (rollout mode, torch threads per actor): each mode at its best on the machine's 2 cores: the sequential step gives
# each phase both cores; one step off, the rollout and the learner run at once, one core each
MODES = {"sync": 2, "one_step_off": 1}


def measure(args: argparse.Namespace) -> common.Result:
    sizes = ["tiny"] if args.quick else ["tiny", "25m"]
    steps = 1 if args.quick else args.steps
    t_start = time.perf_counter()
    fields: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="async-bench-") as tmp:
        info = workload.prepare(Path(tmp), steps + 1, sizes)
        common.header(model=", ".join(f"{s}: random-init Qwen2 of {info['params'][s] / 1e6:.2f}M params"
                                      for s in sizes),
                      data=f"bench/grpo_throughput.py's workload: {workload.PROMPTS_PER_STEP} prompts x "
                           f"{workload.GROUP} completions per step, <= {workload.MAX_NEW_TOKENS} new tokens, gold "
                           "reward",
                      settings=f"{steps} measured steps after 1 warm-up, torch threads per actor: "
                               + ", ".join(f"{m} {n}" for m, n in MODES.items()) + "; hf rollout, one learner rank")

        def size_results(size: str) -> dict[str, dict]:
            print(f"\n[{size}] {info['params'][size] / 1e6:.2f}M parameters", flush=True)
            out = {}
            for mode in MODES:
                side_args = workload.parse_args(["--steps", str(steps), "--rollout-mode", mode,
                                                 "--actor-threads", str(MODES[mode])])
                side_args.workdir = tmp
                r = out[mode] = workload.run_side(side_args, "ours", size)
                print(f"  {mode:>12} ({MODES[mode]} thread(s) per actor): {r['completions_per_s']:7.2f} completions/s, "
                      f"{r['step_s']:.2f} s/step "
                      f"({r['completion_tokens_mean']:.1f} tokens/completion)", flush=True)
                print(f"        per step (s): {workload.fmt_phases(r['phases'])}", flush=True)
            print(f"  ratio one_step_off/sync: "
                  f"{out['one_step_off']['completions_per_s'] / out['sync']['completions_per_s']:.2f}x", flush=True)
            return out

        results = common.by_size(fields, sizes, size_results)

    def cps(size: str, mode: str) -> float:
        return results[size][mode]["completions_per_s"]

    print(f"\ntotal wall time {time.perf_counter() - t_start:.0f} s")
    largest = list(results)[-1]
    fields = {**{f"completions_per_s_{'async' if m == 'one_step_off' else m}_{size}": cps(size, m)
                 for size in results for m in MODES},
              **{f"ratio_{size}": cps(size, "one_step_off") / cps(size, "sync") for size in results}, **fields}
    return common.Result(
        "async_rollout", ratio=cps(largest, "one_step_off") / cps(largest, "sync"), fields=fields,
        config=f"GRPO step on CPU (grpo_throughput's workload), random-init Qwen2 of "
               f"{info['params'][largest] / 1e6:.1f}M params, hf rollout, one learner rank, setup excluded, "
               "threads per actor " + ", ".join(f"{m} {n}" for m, n in MODES.items()),
        baseline=f"train.rollout_mode sync: {cps(largest, 'sync'):.2f} completions/s",
        ours=f"one_step_off: {cps(largest, 'one_step_off'):.2f} completions/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="measured steps per mode (after 1 warm-up step)")
    parser.add_argument("--quick", action="store_true", help="1 measured step, the ~1M model only")
    args = parser.parse_args()
    common.run("async_rollout", lambda: measure(args))


if __name__ == "__main__":
    main()
