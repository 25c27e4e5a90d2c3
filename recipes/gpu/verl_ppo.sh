#!/usr/bin/env bash
# verl's PPO (verl.trainer.main_ppo) with the personalized reward from the pr_rlhf reward service, at the PRB
# protocol's settings (docs/protocols.md section 5): batch 128, max prompt 8192, max response 512, actor lr 5e-7, critic
# lr 5e-6, rollout n = 1, temperature 1.0, no KL in the reward, 1 epoch.
#   1. the data:    pr-rlhf data build --source prb --input PRB_DIR --out data/prb
#                   pr-rlhf data export-verl --shards data/prb --out data/verl_prb
#   2. the reward:  pr-rlhf serve-reward recipes/serve_reward.yaml --set serve.port=8000   (or on the cluster)
#   3. this:        POLICY=/models/Qwen2.5-0.5B-Instruct GPUS=8 bash recipes/gpu/verl_ppo.sh [extra hydra overrides]
#                   on several nodes: NODES=2 PR_RLHF_REWARD_URL=http://HEAD_IP:8000 POLICY=... bash recipes/gpu/verl_ppo.sh
# The reward function (pr_rlhf/integrations/verl.py) reads the user, query and profile from each row's extra_info
# and calls $PR_RLHF_REWARD_URL/score (retries; failures score $PR_RLHF_REWARD_FAILURE and are logged by reason).
#
# The reward URL is checked before training: a reward service nobody reaches does not stop verl, every sample just
# scores $PR_RLHF_REWARD_FAILURE (0.0) and the run "trains" on zeros. So this script GETs $PR_RLHF_REWARD_URL/health
# from here and, when a Ray cluster is up (NODES > 1 or RAY_ADDRESS set), from a task pinned to every alive node
# (verl's reward workers may run on any of them), and stops with the failing nodes named. On more than one node the
# URL is required: 127.0.0.1 is each node's own loopback, so a default there would reach the service from its own
# node only. PR_RLHF_REWARD_URL also goes into verl's Ray runtime env, since workers on other nodes do not inherit
# this shell's environment (the token, $PR_RLHF_REWARD_TOKEN, does not: verl prints its runtime env; give the
# cluster's nodes the token in their own environment).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
data=${DATA:-$root/data/verl_prb}
policy=${POLICY:?set POLICY to the policy model directory (e.g. Qwen2.5-0.5B-Instruct)}
python=${PYTHON:-python3}
nodes=${NODES:-1}
if [ -z "${PR_RLHF_REWARD_URL:-}" ]; then
  if [ "$nodes" -gt 1 ]; then
    echo "verl_ppo.sh: NODES=$nodes but PR_RLHF_REWARD_URL is not set: set it to the reward service's address as" \
         "every node reaches it, e.g. http://HEAD_IP:8000 for \`pr-rlhf serve-reward\` on the head (127.0.0.1 is each" \
         "node's own loopback: the other nodes' reward workers would score every sample 0.0)" >&2
    exit 2
  fi
  PR_RLHF_REWARD_URL=http://127.0.0.1:8000
  echo "verl_ppo.sh: PR_RLHF_REWARD_URL not set; one node: using $PR_RLHF_REWARD_URL" >&2
fi
export PR_RLHF_REWARD_URL
health="${PR_RLHF_REWARD_URL%/}/health"
# 1. from the launcher
if command -v curl >/dev/null 2>&1; then
  reached() { curl -fsS --max-time 10 -o /dev/null "$1"; }
else
  reached() { "$python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)' "$1"; }
fi
if ! reached "$health"; then
  echo "verl_ppo.sh: the reward service is unreachable: GET $health failed from $(hostname). Start it" \
       "(pr-rlhf serve-reward recipes/serve_reward.yaml) or fix PR_RLHF_REWARD_URL; not starting verl" >&2
  exit 3
fi
# 2. from every node of the Ray cluster verl joins
if [ "$nodes" -gt 1 ] || [ -n "${RAY_ADDRESS:-}" ]; then
  bound=(); command -v timeout >/dev/null 2>&1 && bound=(timeout 300)   # ray.init retries an absent GCS for long
  ${bound[@]+"${bound[@]}"} "$python" - "$health" <<'PY' || { echo "verl_ppo.sh: reward URL check failed" >&2; exit 3; }
import os
import socket
import sys
import urllib.request

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

url = sys.argv[1]


@ray.remote(num_cpus=0)
def probe(url: str) -> tuple[str, str]:
    try:
        urllib.request.urlopen(url, timeout=10).close()
        return socket.gethostname(), ""
    except Exception as exc:  # noqa: BLE001 - any failure is the answer
        return socket.gethostname(), repr(exc)


try:
    ray.init(address=os.environ.get("RAY_ADDRESS") or "auto", logging_level="ERROR", log_to_driver=False)
except Exception as exc:  # noqa: BLE001
    sys.exit(f"verl_ppo.sh: no Ray cluster to check the reward URL from ({exc}); start it first (ray start)")
nodes = [n for n in ray.nodes() if n["Alive"]]
answers = ray.get([probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                   .remote(url) for n in nodes])
failed = [f"{host} ({node['NodeManagerAddress']}): {error}" for node, (host, error) in zip(nodes, answers) if error]
ray.shutdown()
if failed:
    sys.exit(f"verl_ppo.sh: GET {url} fails from {len(failed)} of {len(nodes)} Ray node(s): " + "; ".join(failed)
             + ". Set PR_RLHF_REWARD_URL to an address every node reaches; not starting verl")
print(f"verl_ppo.sh: reward service reachable from all {len(nodes)} Ray node(s)", file=sys.stderr)
PY
fi
exec "$python" -m verl.trainer.main_ppo \
  data.train_files="$data/train.parquet" data.val_files="$data/test.parquet" \
  data.train_batch_size=128 data.max_prompt_length=8192 data.max_response_length=512 \
  data.filter_overlong_prompts=True data.truncation=error \
  actor_rollout_ref.model.path="$policy" \
  actor_rollout_ref.actor.optim.lr=5e-7 actor_rollout_ref.actor.ppo_mini_batch_size=32 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 actor_rollout_ref.actor.use_kl_loss=False \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=1 actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
  critic.model.path="$policy" critic.optim.lr=5e-6 critic.ppo_micro_batch_size_per_gpu=4 \
  algorithm.adv_estimator=gae algorithm.use_kl_in_reward=False \
  custom_reward_function.path="$root/pr_rlhf/integrations/verl.py" custom_reward_function.name=compute_score \
  trainer.total_epochs=1 trainer.n_gpus_per_node="${GPUS:-8}" trainer.nnodes="${NODES:-1}" \
  trainer.project_name=pr_rlhf trainer.experiment_name=verl_ppo_personalized \
  trainer.logger='["console","mlflow"]' \
  +ray_kwargs.ray_init.runtime_env.env_vars.PR_RLHF_REWARD_URL="$PR_RLHF_REWARD_URL" "$@"
