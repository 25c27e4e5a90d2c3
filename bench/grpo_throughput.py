"""Benchmark of GRPO step throughput: our Ray ``RLController`` vs. TRL's ``GRPOTrainer``, same workload.

Both sides run the same GRPO step on the same CPU budget:

- model: a random-init tiny Qwen2 from ``resolve_model("tiny:{...}")`` at two sizes, ~1M parameters (overhead-
  bound) and ~25M (compute-bound); float32;
- prompts: the synthetic world's training queries (policy prompt with the user's top-3 profile posts), trimmed
  from the front to exactly 64 tokens, in the same order on both sides (8 prompts per step);
- 8 completions per prompt (64 per step), temperature 1, top_p 1, at most 64 new tokens (the model's eos stops a
  completion early, the same way on both sides; neither side can be forced past it without touching its engine,
  so generated tokens are counted honestly and reported next to the completions);
- reward: the synthetic world's gold utility of the completion text for the asking user (ours: the reward pool,
  ``reward.kind=gold``; TRL: a reward function calling the same ``World.gold_utility``);
- one optimizer step per step over all 64 samples, micro-batches of ``--micro-batch`` (ours:
  ``learner.micro_batch_size``; TRL: ``per_device_train_batch_size`` x ``gradient_accumulation_steps`` = 64),
  AdamW lr 1e-6, weight decay 0.01, grad clip 1.0, clip ratio 0.2, token-mean loss, no KL (beta=0 / kl.coef=0);
- 2 torch threads everywhere: ``OMP_NUM_THREADS=2`` is exported before Ray starts, so every actor (rollout
  worker, learner rank, reward worker) inherits it instead of Ray's default of ``max(1, floor(num_cpus))``
  (1 thread for the 1-CPU rollout worker and the 0.5-CPU learner); a probe task checks it;
  ``--ray-default-threads`` leaves Ray's default in place (diagnostic: what a plain ``pr-rlhf train`` gets). The
  TRL process calls ``torch.set_num_threads(2)``.

Ours: ``RLController`` with the hf rollout backend, one learner rank (strategy ``none`` by default, ``--strategy
fsdp2`` for FSDP2 at world size 1), the gold reward pool. What is timed is exactly ``RLController.train_step``
(rollout -> reward -> old log-probs -> advantages -> update -> weight sync); the one-time setup ``run()`` does
first (``RLController(...)``: prompt loading; ``init_ray``; ``start_workers()``: actor creation and model loads;
the initial ``_sync_weights(0)``) happens before the clock starts, and the held-out evaluation and checkpoints
``run()`` adds around the steps are left out (TRL's side has no eval / saving either).

TRL: ``GRPOTrainer(...).train()`` with ``max_steps = 1 + N``; a ``TrainerCallback`` takes the time at the end
of each optimizer step, so model loading, trainer construction and accelerate setup are outside the timed
region. TRL skips the separate old-log-prob forward when generation and optimizer steps are aligned (they are).

Each side runs in its own subprocess (Ray is down while TRL runs). Timed region: after one warm-up step, N
measured steps; completions/s = 64 * N / (their wall seconds). Model: the random-init tiny Qwen2s above (built
locally); data: a 24-user synthetic world's training queries (shards built with BM25 retrieval into a temp dir).
The LAST line is machine-readable (``bench/common.py``):

    BENCH grpo_throughput completions_per_s_ours_tiny=<> completions_per_s_trl_tiny=<> completions_per_s_ours_25m=<>
          completions_per_s_trl_25m=<> ratio_tiny=<ours/trl at ~1M> ratio_25m=<ours/trl at ~25M>
          [size_25m=failed:<reason>] config=.. baseline=.. ours=.. ratio=<ours/trl at the largest size measured>

(a size not measured has no fields; one that failed only its ``size_<size>=failed:..`` field). Run:
``.venv/bin/python bench/grpo_throughput.py`` (N=3, both sizes; about 5 minutes on 2 cores) or ``--quick`` (N=1,
~1M only: no 25m fields). Per-step phase times are printed for both sides (ours: the
controller's ``time/*_s`` metrics; TRL: wrappers timing ``_generate`` and ``_calculate_rewards``, the rest of the
step is "train"). docs/benchmarks.md has what made ours faster.

"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common
from pr_rlhf.threads import capped_threads

THREADS = capped_threads(2)
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(THREADS)  # before torch is imported here, and inherited by Ray's processes

PROMPTS_PER_STEP = 8
GROUP = 8
PROMPT_TOKENS = 64
MAX_NEW_TOKENS = 64
LR = 1e-6
SEED = 0
# ~1M: 3072 x 128 tied embedding (0.39M) + 3 layers of 0.2M; ~25M: 3072 x 512 (1.57M) + 8 layers of 2.95M.
SIZES = {
    "tiny": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 3, "num_attention_heads": 4,
             "num_key_value_heads": 2},
    "25m": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8, "num_attention_heads": 8,
            "num_key_value_heads": 4},
}
WORLD = {"users": 24, "cold_start_users": 4}  # small world: shards build in seconds


def model_spec(size: str) -> str:
    return "tiny:" + json.dumps(SIZES[size], sort_keys=True)


# ---------------------------------------------------------------------------------------------------------------
# Shared setup (parent process)
# ---------------------------------------------------------------------------------------------------------------

def count_params(model_dir: str) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())  # tied embedding counted once


def fit_prompt(tokenizer, messages: list, target: int) -> str | None:
    """The policy prompt (user turn only, chat template applied) with its profile trimmed from the front, token
    by token, until the rendered prompt is exactly ``target`` tokens; None if no cut lands exactly on it."""
    from pr_rlhf.models.prompting import render_chat

    user = next(m["content"] for m in messages if m["role"] == "user")
    ids = tokenizer(user, add_special_tokens=False).input_ids
    for k in range(len(ids)):
        content = tokenizer.decode(ids[k:]).lstrip(" !,.;:)")
        text = render_chat(tokenizer, [{"role": "user", "content": content}])
        n = len(tokenizer(text).input_ids)
        if n == target:
            return text
        if n < target:
            return None
    return None


def prepare(workdir: Path, steps_total: int, sizes: list[str]) -> dict:
    """Shards of the synthetic world, both models (cached), and the step-ordered list of 64-token prompts."""
    from data_pipelines.build import build_shards
    from pr_rlhf.configs.recipe import data_config
    from pr_rlhf.configs.rl import RLConfig
    from pr_rlhf.configs.world import WorldConfig
    from pr_rlhf.models.prompting import load_tokenizer
    from pr_rlhf.models.sources import resolve_model
    from pr_rlhf.rl.prompts import load_prompts

    shards = workdir / "shards"
    build_shards(data_config(source="synthetic", out=str(shards), retrieval={"embedder": "bm25"}),
                 WorldConfig(**WORLD))
    dirs = {size: resolve_model(model_spec(size)) for size in sizes}
    tokenizer = load_tokenizer(dirs[sizes[0]])
    for size in sizes[1:]:  # the tiny builder trains one tokenizer for every size: prompts are shared
        assert load_tokenizer(dirs[size]).get_vocab() == tokenizer.get_vocab()
    train, _ = load_prompts(RLConfig(data={"shards": str(shards), "profile_top_k": 3}))
    need = PROMPTS_PER_STEP * steps_total
    ordered = []
    for item in train:
        text = fit_prompt(tokenizer, item.messages, PROMPT_TOKENS)
        if text is not None:
            ordered.append({"prompt_id": item.prompt_id, "user_id": item.user_id, "subset": item.subset,
                            "question": item.question, "text": text})
        if len(ordered) == need:
            break
    if len(ordered) < need:
        raise RuntimeError(f"only {len(ordered)} prompts fit {PROMPT_TOKENS} tokens exactly; need {need}")
    (workdir / "prompts.json").write_text(json.dumps(ordered))
    return {"shards": str(shards), "dirs": dirs, "params": {s: count_params(d) for s, d in dirs.items()}}


# ---------------------------------------------------------------------------------------------------------------
# Side (a): our RLController
# ---------------------------------------------------------------------------------------------------------------

def run_ours(args: argparse.Namespace) -> dict:
    import numpy as np
    import ray
    import torch

    torch.set_num_threads(THREADS)
    from pr_rlhf.configs.recipe import Recipe
    from pr_rlhf.rl.prompts import PromptItem, prompt_order
    from workers.controller import RLController, cpus_needed
    from workers.ray_utils import init_ray, shutdown_local_ray

    workdir = Path(args.workdir)
    ordered = json.loads((workdir / "prompts.json").read_text())
    spec = model_spec(args.size)
    recipe = Recipe.model_validate({
        "name": f"bench-grpo-{args.size}", "seed": SEED,
        "reward": {"kind": "gold"},
        "tracking": {"enabled": False},
        "train": {
            # one more step than run: the last measured step launches the next one's generation as in a longer run
            # (one_step_off), as the warm-up step launched the first measured one's
            "algorithm": "grpo", "steps": args.steps + 2, "prompts_per_step": PROMPTS_PER_STEP, "group_size": GROUP,
            "rollout_mode": args.rollout_mode,
            "max_tokens": MAX_NEW_TOKENS, "temperature": 1.0, "top_p": 1.0, "resume": False,
            "out": str(workdir / f"ours-{args.size}"),
            "rollout": {"backend": "hf", "model": spec, "dtype": "float32", "max_model_len": 1024},
            "rollout_workers": 1,
            "learner": {"model": spec, "world_size": 1, "strategy": args.strategy, "lr": LR, "weight_decay": 0.01,
                        "grad_clip": 1.0, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2,
                        "loss_agg_mode": "token-mean", "micro_batch_size": args.micro_batch, "kl": {"coef": 0.0}},
            "data": {"shards": str(workdir / "shards"), "profile_top_k": 3},
        },
    })
    t_setup = time.perf_counter()
    controller = RLController(recipe)
    # The benchmark's prompts, placed so that batch_at() hands them out in exactly the step order TRL sees.
    n = len(ordered)
    perm = prompt_order(n, SEED, 0)
    slots: list = [None] * n
    for pos, row in enumerate(ordered):
        slots[perm[pos]] = PromptItem(row["prompt_id"], row["user_id"], row["subset"], row["question"], row["text"])
    controller.train_prompts = slots
    if args.actor_threads:   # e.g. one_step_off: the rollout and the learner run at once, a core each
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.actor_threads)
    if args.ray_default_threads:  # what `pr-rlhf train` gets today: Ray sets OMP_NUM_THREADS=floor(num_cpus) or 1
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.pop(var, None)
    init_ray(None, num_cpus=max(os.cpu_count() or 1, math.ceil(cpus_needed(recipe))))

    @ray.remote(num_cpus=recipe.train.learner.num_cpus_per_worker)
    def probe_threads() -> int:
        import torch as _torch

        return _torch.get_num_threads()

    actor_threads = ray.get(probe_threads.remote())
    controller.start_workers()
    controller._sync_weights(0)  # what run() does before its first step: rollout starts from the learner's weights
    setup_s = time.perf_counter() - t_setup
    try:
        stamps, history = [], []
        for step in range(args.steps + 1):  # step 0: warm-up
            metrics = controller.train_step(step)
            stamps.append(time.perf_counter())
            history.append(metrics)
    finally:
        controller.shutdown()
        shutdown_local_ray()
    measured = history[1:]
    wall = stamps[-1] - stamps[0]
    phases = sorted({k for m in measured for k in m if k.startswith("time/")})
    per_step = {k: float(np.mean([m.get(k, 0.0) for m in measured])) for k in phases}
    per_step["actor/update_time_s"] = float(np.mean([m.get("actor/update_time_s", float("nan")) for m in measured]))
    step_s = wall / args.steps
    per_step["time/other_s"] = step_s - sum(per_step[k] for k in phases)
    tokens = [m["rollout/response_tokens_mean"] for m in measured]
    return {"side": "ours", "size": args.size, "steps": args.steps, "wall_s": wall, "step_s": step_s,
            "completions_per_s": PROMPTS_PER_STEP * GROUP * args.steps / wall,
            "completion_tokens_mean": float(np.mean(tokens)),
            "tokens_per_s": PROMPTS_PER_STEP * GROUP * float(np.mean(tokens)) * args.steps / wall,
            "setup_s": setup_s, "phases": per_step, "torch_threads_driver": torch.get_num_threads(),
            "torch_threads_actor": actor_threads, "warmup_step_s": sum(
                v for k, v in history[0].items() if k.startswith("time/")),
            "reward_mean": float(np.mean([m["reward/mean"] for m in measured]))}


# ---------------------------------------------------------------------------------------------------------------
# Side (b): TRL GRPOTrainer
# ---------------------------------------------------------------------------------------------------------------

def run_trl(args: argparse.Namespace) -> dict:
    import logging
    import warnings

    import numpy as np
    import torch

    torch.set_num_threads(THREADS)
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pr_rlhf.models.hf_engine import quiet_hf_loading
    from pr_rlhf.models.prompting import load_tokenizer
    from pr_rlhf.models.sources import resolve_model
    from pr_rlhf.shards import ShardReader
    from pr_rlhf.world import WorldConfig, build_world

    workdir = Path(args.workdir)
    ordered = json.loads((workdir / "prompts.json").read_text())
    t_setup = time.perf_counter()
    quiet_hf_loading()
    model_dir = resolve_model(model_spec(args.size))
    world_cfg = ShardReader(str(workdir / "shards")).manifest["config"]["world"]
    world = build_world(WorldConfig.model_validate(world_cfg))  # the world the reward pool judges in

    def gold_reward(prompts, completions, user_id, **_kw):
        return [float(world.gold_utility(text, uid)) for text, uid in zip(completions, user_id)]

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    dataset = Dataset.from_list([{"prompt": r["text"], "user_id": r["user_id"]} for r in ordered])
    micro = args.micro_batch
    config = GRPOConfig(
        output_dir=str(workdir / f"trl-{args.size}"), num_generations=GROUP, per_device_train_batch_size=micro,
        gradient_accumulation_steps=PROMPTS_PER_STEP * GROUP // micro, max_completion_length=MAX_NEW_TOKENS,
        temperature=1.0, top_p=1.0, use_vllm=False, beta=0.0, num_iterations=1, epsilon=0.2,
        loss_type="dapo", learning_rate=LR, lr_scheduler_type="constant", weight_decay=0.01, max_grad_norm=1.0,
        max_steps=args.steps + 1, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, shuffle_dataset=False, seed=SEED, dataloader_num_workers=0,
        remove_unused_columns=False)

    stamps: list[float] = []
    phase: dict[str, list[float]] = {"generate": [], "reward": [], "generate_and_score": []}
    lengths: list[list[int]] = []
    prompt_lens: set[int] = set()

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **_kw):
            stamps.append(time.perf_counter())

    trainer = GRPOTrainer(model=model, reward_funcs=[gold_reward], args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Clock()])

    def timed(name, fn, record=None):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            phase[name].append(time.perf_counter() - t0)
            if record is not None:
                record(a, out)
            return out
        return wrapper

    trainer._generate = timed("generate", trainer._generate,
                              lambda a, out: prompt_lens.update(len(p) for p in out[0]))
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards,
                                       lambda a, out: lengths.append([len(c) for c in a[3]]))
    trainer._generate_and_score_completions = timed("generate_and_score", trainer._generate_and_score_completions)
    setup_s = time.perf_counter() - t_setup
    t_train = time.perf_counter()
    trainer.train()
    if len(stamps) != args.steps + 1:
        raise RuntimeError(f"TRL ran {len(stamps)} optimizer steps, expected {args.steps + 1}")
    wall = stamps[-1] - stamps[0]
    step_s = wall / args.steps
    m = slice(1, None)  # drop the warm-up step
    gen, rew, gas = (float(np.mean(phase[k][m])) for k in ("generate", "reward", "generate_and_score"))
    phases = {"time/generate_s": gen, "time/reward_s": rew, "time/score_other_s": gas - gen - rew,
              "time/train_s": step_s - gas}
    tokens = float(np.mean([x for step in lengths[1:] for x in step]))
    return {"side": "trl", "size": args.size, "steps": args.steps, "wall_s": wall, "step_s": step_s,
            "completions_per_s": PROMPTS_PER_STEP * GROUP * args.steps / wall, "completion_tokens_mean": tokens,
            "tokens_per_s": PROMPTS_PER_STEP * GROUP * tokens * args.steps / wall, "setup_s": setup_s,
            "phases": phases, "torch_threads_driver": torch.get_num_threads(), "prompt_lengths": sorted(prompt_lens),
            "generations": len(phase["generate"]), "warmup_step_s": stamps[0] - t_train}


# ---------------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------------

def run_side(args: argparse.Namespace, side: str, size: str) -> dict:
    cmd = [sys.executable, __file__, "--side", side, "--size", size, "--workdir", args.workdir, "--steps",
           str(args.steps), "--micro-batch", str(args.micro_batch), "--strategy", args.strategy,
           "--rollout-mode", args.rollout_mode, *(["--actor-threads", str(args.actor_threads)]
                                                  if args.actor_threads else [])]
    if args.ray_default_threads:
        cmd.append("--ray-default-threads")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{side}/{size} failed with {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def fmt_phases(phases: dict) -> str:
    return ", ".join(f"{k.removeprefix('time/').removesuffix('_s')} {v:.2f}" for k, v in phases.items())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="measured steps per side (after 1 warm-up step)")
    parser.add_argument("--quick", action="store_true", help="1 measured step, the ~1M model only")
    parser.add_argument("--micro-batch", type=int, default=16, help="samples per forward/backward, both sides")
    parser.add_argument("--strategy", default="none", choices=["none", "fsdp2"], help="our learner's strategy")
    parser.add_argument("--rollout-mode", default="sync", choices=["sync", "one_step_off"],
                        help="our train.rollout_mode (one_step_off: generation overlaps the update)")
    parser.add_argument("--actor-threads", type=int, default=0,
                        help="torch threads of each of our actors (default: the benchmark's 2); one_step_off runs "
                             "the rollout and the learner at once, so 1 each shares 2 cores without oversubscribing")
    parser.add_argument("--ray-default-threads", action="store_true",
                        help="diagnostic: do not export OMP_NUM_THREADS=2 to our Ray actors (they then get Ray's "
                             "default, 1 thread each, as a plain `pr-rlhf train` does); TRL keeps 2")
    parser.add_argument("--side", choices=["ours", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--size", choices=sorted(SIZES), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = 1
    if (PROMPTS_PER_STEP * GROUP) % args.micro_batch:
        parser.error(f"--micro-batch must divide {PROMPTS_PER_STEP * GROUP}")
    return args


def measure_size(args: argparse.Namespace, size: str, info: dict) -> dict[str, dict]:
    """Both sides at one model size, one after the other."""
    print(f"\n[{size}] {model_spec(size)}: {info['params'][size] / 1e6:.2f}M parameters", flush=True)
    results = {}
    for side in ("ours", "trl"):
        load = os.getloadavg()[0]
        r = results[side] = run_side(args, side, size)
        extra = (f"threads driver/actor {r['torch_threads_driver']}/{r['torch_threads_actor']}"
                 if side == "ours" else f"threads {r['torch_threads_driver']}, prompt lengths {r['prompt_lengths']}")
        print(f"  {side:>4}: {r['completions_per_s']:7.2f} completions/s, {r['tokens_per_s']:8.1f} tokens/s "
              f"({r['completion_tokens_mean']:.1f} tokens/completion), {r['step_s']:.2f} s/step "
              f"[setup excluded: {r['setup_s']:.1f} s; {extra}; load avg before {load:.1f}]", flush=True)
        print(f"        per step (s): {fmt_phases(r['phases'])}", flush=True)
    ours, trl = results["ours"], results["trl"]
    print(f"  ratio ours/trl: {ours['completions_per_s'] / trl['completions_per_s']:.2f}x completions/s, "
          f"{ours['tokens_per_s'] / trl['tokens_per_s']:.2f}x tokens/s", flush=True)
    return results


def measure(args: argparse.Namespace) -> common.Result:
    sizes = ["tiny"] if args.quick else ["tiny", "25m"]
    t_start = time.perf_counter()
    fields: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        args.workdir = tmp
        info = prepare(Path(tmp), args.steps + 1, sizes)
        models = ", ".join(f"{s}: random-init Qwen2 of {info['params'][s] / 1e6:.2f}M params" for s in sizes)
        common.header(model=models,
                      data=f"training queries of a {WORLD['users']}-user synthetic world, {PROMPTS_PER_STEP} prompts x "
                           f"{GROUP} completions per step, prompts {PROMPT_TOKENS} tokens, <= {MAX_NEW_TOKENS} new "
                           "tokens, gold reward",
                      settings=f"{args.steps} measured steps after 1 warm-up, micro-batch {args.micro_batch}, "
                               f"{THREADS} torch threads, our learner strategy {args.strategy!r}, our rollout "
                               f"{args.rollout_mode}")
        results = common.by_size(fields, sizes, lambda size: measure_size(args, size, info))

    def cps(size: str, side: str) -> float:
        return results[size][side]["completions_per_s"]

    print(f"\ntotal wall time {time.perf_counter() - t_start:.0f} s")
    largest = list(results)[-1]
    params = info["params"][largest] / 1e6
    # the sizes measured only (a size skipped or failed would be a nan here; a failed one has its failed: field)
    fields = {**{f"completions_per_s_{side}_{size}": cps(size, side) for size in results for side in ("ours", "trl")},
              **{f"ratio_{size}": cps(size, "ours") / cps(size, "trl") for size in results}, **fields}
    return common.Result(
        "grpo_throughput", ratio=cps(largest, "ours") / cps(largest, "trl"), fields=fields,
        config=f"GRPO step, random-init Qwen2 of {params:.1f}M params, {PROMPTS_PER_STEP} x {GROUP} completions of <= "
               f"{MAX_NEW_TOKENS} tokens per step, gold reward, {THREADS} threads, setup excluded, our rollout "
               f"{args.rollout_mode}"
               + (f"; at ~1M params {fields['ratio_tiny']:.2f}x" if largest != "tiny" else ""),
        baseline=f"TRL GRPOTrainer: {cps(largest, 'trl'):.2f} completions/s",
        ours=f"RLController on Ray: {cps(largest, 'ours'):.2f} completions/s")


def main() -> None:
    args = parse_args()
    if args.side:
        result = run_ours(args) if args.side == "ours" else run_trl(args)
        print("RESULT " + json.dumps(result), flush=True)
        return
    common.run("grpo_throughput", lambda: measure(args))


if __name__ == "__main__":
    main()
