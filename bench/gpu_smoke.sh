#!/usr/bin/env bash
# GPU smoke test: proves the CUDA paths on ONE GPU in <= 8 minutes. A 3-step GRPO run of the tiny recipe where
#   - the rollout worker is vLLM on CUDA (backend vllm, device cuda),
#   - the learner is FSDP2 on NCCL (device cuda; the rank and the rollout worker share the GPU: 0.5 each),
#   - vLLM runs its default multiprocess runtime (engine core in a process of its own, CUDA graphs on),
#   - the weights are synced learner -> vLLM after every step through vLLM's weight-transfer API: the gloo engine
#     (pr_rlhf/models/vllm_weight_transfer.py) registered by the plugin, received through vLLM's layerwise reload on
#     the GPU (gloo-staged, since the engine shares the learner's GPU and NCCL refuses two ranks on one device),
#     time/weight_sync_s > 0; with two or more GPUs a second run syncs over vLLM's own nccl engine (learner on one
#     GPU, vLLM on another),
# the same with the one-step-off rollout (generation overlapping the update, staleness 1 after the first step) and
# colocated (the hybrid engine: vLLM sleeping in the learner rank's bundle during the update),
# then one P-GenRM-sized check: the learner picks flash-attn when installed. Prints what it found; exit 0 = pass.
#   bash bench/gpu_smoke.sh            # from the repository root, with .venv holding the GPU extras
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
out=${OUT:-bench/out/gpu_smoke}
rm -rf "$out"; mkdir -p "$out"
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$py" - <<'PY'
import torch, importlib.util
assert torch.cuda.is_available(), "no CUDA device visible"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, "
      f"nccl {torch.cuda.nccl.version()}, flash_attn {'yes' if importlib.util.find_spec('flash_attn') else 'no'}")
PY
start=$(date +%s)
# grpo RUN STEPS GPUS_EACH SECONDS [--set ...]: GRPO of the tiny recipe with a CUDA vLLM rollout and a CUDA learner
grpo() {
  local run=$1 steps=$2 gpus=$3 seconds=$4; shift 4
  timeout "$seconds" "$py" -m pr_rlhf.cli train recipes/grpo_tiny.yaml --out "$out/$run" \
    --set train.steps="$steps" --set train.prompts_per_step=4 --set train.group_size=4 --set train.max_tokens=32 \
    --set train.eval_every="$steps" --set train.checkpoint_every="$steps" --set train.warmup_sft_steps=0 \
    --set train.data.shards="$out/shards" --set train.data.heldout_prompts=4 --set train.eval_samples=2 \
    --set train.rollout.backend=vllm --set train.rollout.device=cuda --set train.rollout.dtype=bfloat16 \
    --set train.rollout.gpu_memory_utilization=0.3 --set train.rollout_num_gpus="$gpus" \
    --set train.learner.device=cuda --set train.learner.dtype=bfloat16 \
    --set train.learner.num_gpus_per_worker="$gpus" "$@"
  "$py" - "$out/$run" "$steps" <<'PY'
import json, sys
run, steps = sys.argv[1], int(sys.argv[2])
history = json.load(open(f"{run}/history.json"))["history"]
assert len(history) == steps, history
sync = [h["time/weight_sync_s"] for h in history]
assert all(s > 0 for s in sync), sync
if "rollout/staleness" in history[0]:   # one step off: each step after the first trains on the previous weights' samples
    assert [h["rollout/staleness"] for h in history] == [0.0] + [1.0] * (steps - 1), history
if "time/sleep_s" in history[0]:   # colocated: the engine slept and woke around every update
    assert all(h["time/sleep_s"] > 0 and h["time/wake_s"] > 0 for h in history), history
print(f"GRPO on GPU ({run}): {steps} steps, weight sync {', '.join(f'{s:.2f}' for s in sync)} s, "
      f"reward {history[-1].get('reward/mean')}")
PY
}
grpo run 3 0.5 480 --set train.rollout.weight_transfer=gloo   # one GPU shared: the gloo engine
grpo run_async 3 0.5 240 --set train.rollout.weight_transfer=gloo --set train.rollout_mode=one_step_off
# the hybrid engine: vLLM in the learner rank's bundle on the same GPU, asleep during the update (sleep mode on)
grpo run_colocated 3 1 240 --set train.layout=colocated --set train.rollout_num_gpus=0.4
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  grpo run_nccl 2 1 300   # vLLM's nccl engine: the learner and the engine on a GPU each
else
  echo "one GPU: vLLM's nccl weight transfer (learner and engine on two GPUs) not exercised"
fi
echo "GPU smoke passed in $(( $(date +%s) - start )) s"
