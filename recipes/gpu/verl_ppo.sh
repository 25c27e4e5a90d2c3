#!/usr/bin/env bash
# verl's PPO (verl.trainer.main_ppo) with the personalized reward from the pr_rlhf reward service, at the PRB
# protocol's settings (docs/protocols.md section 5): batch 128, max prompt 8192, max response 512, actor lr 5e-7, critic
# lr 5e-6, rollout n = 1, temperature 1.0, no KL in the reward, 1 epoch.
#   1. the data:    pr-rlhf data build --source prb --input PRB_DIR --out data/prb
#                   pr-rlhf data export-verl --shards data/prb --out data/verl_prb
#   2. the reward:  pr-rlhf serve-reward recipes/serve_reward.yaml --set serve.port=8000   (or on the cluster)
#   3. this:        POLICY=/models/Qwen2.5-0.5B-Instruct GPUS=8 bash recipes/gpu/verl_ppo.sh [extra hydra overrides]
# The reward function (pr_rlhf/integrations/verl.py) reads the user, query and profile from each row's extra_info
# and calls $PR_RLHF_REWARD_URL/score (retries; failures score $PR_RLHF_REWARD_FAILURE and are logged by reason).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
data=${DATA:-$root/data/verl_prb}
policy=${POLICY:?set POLICY to the policy model directory (e.g. Qwen2.5-0.5B-Instruct)}
export PR_RLHF_REWARD_URL=${PR_RLHF_REWARD_URL:-http://127.0.0.1:8000}
python=${PYTHON:-python3}
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
  trainer.logger='["console","mlflow"]' "$@"
