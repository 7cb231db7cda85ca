#!/usr/bin/env bash
# Start the Ray head on this node; the other nodes join it with launch/cluster/ray_worker.sh.
#
#   bash launch/cluster/ray_head.sh [--dry-run] [more `ray start` flags]
#
# Then: HEAD_ADDRESS=<ip>:6379 bash launch/cluster/ray_worker.sh on every other node, and
# SUBMIT_TO=http://<ip>:8265 NODES=... GPUS_PER_NODE=... bash launch/ppo_r3.sh from anywhere.
#
# Variables (defaults in brackets):
#   HEAD_IP          address the head binds and workers reach [the first of `hostname -I`]
#   RAY_PORT         the port workers join (GCS) [6379]
#   DASHBOARD_PORT   dashboard and job-submission API [8265]
#   NUM_GPUS         GPUs this node offers to Ray [nvidia-smi's count, else 0]
#   NUM_CPUS         CPUs this node offers to Ray [Ray's count]
#   BLOCK            1: stay in the foreground until stopped (SLURM steps, containers) [0]
#   RAY              the ray command [ray]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=launch/lib.sh
source "$here/../lib.sh"
split_dry_run "$@"

RAY="${RAY:-ray}"
RAY_PORT="${RAY_PORT:-6379}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8265}"
HEAD_IP="${HEAD_IP:-$(hostname -I 2>/dev/null | awk '{print $1}')}"
NUM_GPUS="${NUM_GPUS:-$(count_gpus)}"
BLOCK="${BLOCK:-0}"
require_int 1 RAY_PORT DASHBOARD_PORT
require_int 0 NUM_GPUS
if [[ -z "$HEAD_IP" ]]; then
    echo "HEAD_IP is empty and \`hostname -I\` found no address: set HEAD_IP to this node's address" >&2
    exit 2
fi

cmd=("$RAY" start --head --node-ip-address "$HEAD_IP" --port "$RAY_PORT"
    --dashboard-host 0.0.0.0 --dashboard-port "$DASHBOARD_PORT" --num-gpus "$NUM_GPUS")
if [[ -n "${NUM_CPUS:-}" ]]; then require_int 1 NUM_CPUS; cmd+=(--num-cpus "$NUM_CPUS"); fi
if [[ "$BLOCK" == 1 ]]; then cmd+=(--block); fi
cmd+=("${extra[@]}")

if (( dry_run )); then
    print_command "${cmd[@]}"
    exit 0
fi
require_ray "$RAY"
echo "workers join with: HEAD_ADDRESS=$HEAD_IP:$RAY_PORT bash launch/cluster/ray_worker.sh"
echo "jobs go to:        SUBMIT_TO=http://$HEAD_IP:$DASHBOARD_PORT bash launch/ppo_r3.sh"
exec "${cmd[@]}"
