#!/usr/bin/env bash
# Submit a pr-rlhf command to a Ray cluster as a job: the working tree ships as the job's working directory (minus
# cluster/runtime_env.yaml's excludes); the cluster's nodes already hold the environment (cluster/Dockerfile, or
# `make setup` + `pip install -e ".[gpu]"` on each node).
#
#   cluster/submit.sh [--address URL] [--no-wait] [--entrypoint-num-gpus N] -- pr-rlhf train recipes/gpu/ppo_personalized.yaml
#   cluster/submit.sh -- pr-rlhf pgenrm recipes/pgenrm_pipeline.yaml            # PSI -> CRE -> curriculum
#   cluster/submit.sh -- pr-rlhf bon recipes/gpu/bon_sweep.yaml
#
# Paths: each node runs the job in a temporary copy of the working dir; send outputs and shards to storage every
# node shares, e.g. `--set train.out=/mnt/pr_rlhf/runs/ppo --set train.data.shards=/mnt/pr_rlhf/data/prb`.
# Address: --address, else $RAY_ADDRESS, else http://127.0.0.1:8265 (the dashboard, e.g. forwarded with
# `ray dashboard cluster/ray_cluster_gpu.yaml` or `kubectl port-forward svc/...-head-svc 8265`).
# --entrypoint-num-gpus: GPUs for the driver itself, for commands that run an engine in it (`pr-rlhf train-rm` with a
# vLLM planner on cuda: `pr-rlhf plan` says so); the driver then runs on a GPU node instead of the head.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
address=${RAY_ADDRESS:-http://127.0.0.1:8265}
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --address) address=${2:?--address needs a URL}; shift 2 ;;
    --no-wait) extra+=(--no-wait); shift ;;
    --entrypoint-num-gpus) extra+=(--entrypoint-num-gpus "${2:?--entrypoint-num-gpus needs a number}"); shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    --) shift; break ;;
    *) echo "submit.sh: unknown option $1 (the command goes after --)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "submit.sh: no command; e.g. cluster/submit.sh -- pr-rlhf bon recipes/bon_sweep.yaml" >&2; exit 2; }
# `pr-rlhf` runs as `python -m pr_rlhf.cli` inside the job (the shipped working dir, not an installed copy)
if [ "$1" = "pr-rlhf" ]; then shift; set -- python -m pr_rlhf.cli "$@"; fi
ray_bin=${RAY_BIN:-ray}
command -v "$ray_bin" >/dev/null 2>&1 || ray_bin="$root/.venv/bin/ray"
exec "$ray_bin" job submit --address "$address" --working-dir "$root" \
  --runtime-env "$here/runtime_env.yaml" ${extra[@]+"${extra[@]}"} -- "$@"
