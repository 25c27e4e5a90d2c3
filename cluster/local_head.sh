#!/usr/bin/env bash
# A private Ray cluster on 127.0.0.1 for `ray job submit` on one machine (laptop, CI). Only the cluster started
# here is ever stopped, never with `ray stop` (which stops every Ray on the machine): each node starts in a session
# of its own (setsid), and stop ends every process of that session and any other naming the node's temp dir.
# (Ray renames some of its processes, e.g. ray::DashboardAgent, the client server, the dashboard's modules, so
# their command lines name no temp dir: found by it alone they outlived the cluster, busy on the CPU.)
#
#   cluster/local_head.sh start TEMP_DIR [--worker]   # prints the job-submission address (head) and exits;
#                                                     # --worker: a second node joining RAY_HEAD_ADDRESS
#   cluster/local_head.sh stop  TEMP_DIR
#
# Environment: RAY_PORT (GCS, default 6390), RAY_DASHBOARD_PORT (default 8265), RAY_NUM_CPUS (default nproc),
# RAY_RESOURCES (JSON custom resources, e.g. '{"learner": 1}'), RAY_HEAD_ADDRESS (for --worker),
# RAY_BIN (default .venv/bin/ray). Auth: RAY_AUTH_MODE=disabled unless set (loopback-only local clusters);
# on shared machines use RAY_AUTH_MODE=token on both sides.
set -euo pipefail
cmd=${1:?usage: local_head.sh start|stop TEMP_DIR [--worker]}
temp_dir=$(mkdir -p "${2:?TEMP_DIR required}" && cd "$2" && pwd)
role=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
ray_bin=${RAY_BIN:-$here/../.venv/bin/ray}
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0        # every listener on 127.0.0.1
export PATH="$(cd "$(dirname "$ray_bin")" && pwd):$PATH"  # jobs' `python` is the environment's python
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
port=${RAY_PORT:-6390}
dash=${RAY_DASHBOARD_PORT:-8265}
cpus=${RAY_NUM_CPUS:-$(nproc)}
resources=${RAY_RESOURCES:-"{}"}
# Ports another Ray on the same machine may already hold (its dashboard agent, metrics, client server): set
# RAY_AGENT_PORT / RAY_AGENT_GRPC_PORT / RAY_METRICS_PORT / RAY_CLIENT_PORT to run beside it.
extra_ports=()
[ -n "${RAY_AGENT_PORT:-}" ] && extra_ports+=(--dashboard-agent-listen-port "$RAY_AGENT_PORT")
[ -n "${RAY_AGENT_GRPC_PORT:-}" ] && extra_ports+=(--dashboard-agent-grpc-port "$RAY_AGENT_GRPC_PORT")
[ -n "${RAY_METRICS_PORT:-}" ] && extra_ports+=(--metrics-export-port "$RAY_METRICS_PORT")
[ -n "${RAY_CLIENT_PORT:-}" ] && extra_ports+=(--ray-client-server-port "$RAY_CLIENT_PORT")

cluster_pids() {
  # The processes of the node's own session (all that `start` launched), and any naming its session folder.
  local sid=""
  [ -f "$temp_dir/node.sid" ] && sid=$(cat "$temp_dir/node.sid")
  # (zombies are left out: they are gone already, waiting for init to reap them)
  { [ -n "$sid" ] && ps -eo pid=,sid=,stat= | awk -v sid="$sid" '$2 == sid && $3 !~ /^Z/ {print $1}'
    ps -ww -eo pid=,stat=,args= | grep -F -- "$temp_dir/session_" | grep -v -F -- "grep -F" | awk '$2 !~ /^Z/ {print $1}'
  } | grep -v -x -e "$$" | sort -u || true
}

in_own_session() {
  # run "$@" as the leader of a new session and record its id (its pid): every process it starts stays in it
  setsid --wait bash -c 'echo $$ > "$0/node.sid"; shift; exec "$@"' "$temp_dir" _ "$@"
}

case "$cmd" in
  start)
    if [ "$role" = "--worker" ]; then
      # a second node on this machine, on loopback too (see loopback_worker.py for why not plain `ray start`)
      in_own_session python "$here/loopback_worker.py" \
        --address "${RAY_HEAD_ADDRESS:-127.0.0.1:$port}" --node-ip-address 127.0.0.1 \
        --temp-dir "$temp_dir" --num-cpus "$cpus" --resources "$resources" --disable-usage-stats \
        ${extra_ports[@]+"${extra_ports[@]}"} >"$temp_dir/start-worker.log" 2>&1
    else
      in_own_session "$ray_bin" start --head --node-ip-address 127.0.0.1 --port "$port" --temp-dir "$temp_dir" \
        --dashboard-host 127.0.0.1 --dashboard-port "$dash" --num-cpus "$cpus" --resources "$resources" \
        --disable-usage-stats ${extra_ports[@]+"${extra_ports[@]}"} >"$temp_dir/start-head.log" 2>&1
      echo "http://127.0.0.1:$dash"
    fi
    ;;
  stop)
    # 5 s of grace after TERM (the GCS and raylet may ignore it longer), then KILL and up to 10 s for the killed
    # processes to exit (a moment, longer on a loaded machine)
    for signal_and_wait in "TERM 5" "KILL 10"; do
      read -r sig wait_s <<<"$signal_and_wait"
      pids=$(cluster_pids)
      [ -n "$pids" ] && kill -"$sig" $pids 2>/dev/null || true
      for _ in $(seq 1 $((wait_s * 4))); do
        [ -z "$(cluster_pids)" ] && break
        sleep 0.25
      done
    done
    rm -f "$temp_dir/ray_current_cluster" "$temp_dir/node.sid"
    ;;
  *) echo "usage: local_head.sh start|stop TEMP_DIR [--worker]" >&2; exit 2 ;;
esac
