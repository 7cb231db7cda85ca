#!/usr/bin/env bash
# Join this node to the Ray cluster whose head launch/cluster/ray_head.sh started.
#
#   HEAD_ADDRESS=10.0.0.1:6379 bash launch/cluster/ray_worker.sh [--dry-run] [more `ray start` flags]
#
# Variables (defaults in brackets):
#   HEAD_ADDRESS     the head's IP:RAY_PORT [required]
#   NODE_IP          this node's address as the others reach it [Ray's choice]
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
NUM_GPUS="${NUM_GPUS:-$(count_gpus)}"
BLOCK="${BLOCK:-0}"
require_int 0 NUM_GPUS
if [[ ! "${HEAD_ADDRESS:-}" =~ ^[^:[:space:]]+:[0-9]+$ ]]; then
    echo "HEAD_ADDRESS must be the head's IP:PORT (ray_head.sh prints it), got '${HEAD_ADDRESS:-}'" >&2
    exit 2
fi

cmd=("$RAY" start --address "$HEAD_ADDRESS" --num-gpus "$NUM_GPUS")
if [[ -n "${NODE_IP:-}" ]]; then cmd+=(--node-ip-address "$NODE_IP"); fi
if [[ -n "${NUM_CPUS:-}" ]]; then require_int 1 NUM_CPUS; cmd+=(--num-cpus "$NUM_CPUS"); fi
if [[ "$BLOCK" == 1 ]]; then cmd+=(--block); fi
cmd+=("${extra[@]}")

if (( dry_run )); then
    print_command "${cmd[@]}"
    exit 0
fi
require_ray "$RAY"
exec "${cmd[@]}"
