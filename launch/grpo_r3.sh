#!/usr/bin/env bash
# R3-RAG's RL stage with GRPO (group-normalised advantages, KL in the loss, no critic) instead of PPO.
# Users of peers report that GRPO can collapse on this task; compare with launch/ppo_r3.sh.
# Same variables as launch/ppo_r3.sh; ALGO=reinforce++ here gives REINFORCE++ with a group baseline.
#
#   ray job submit --address=http://HEAD:8265 --runtime-env-json='{"working_dir": "."}' -- bash launch/grpo_r3.sh
set -euo pipefail
ALGO="${ALGO:-grpo}" exec bash "$(dirname "$0")/ppo_r3.sh" "$@"
