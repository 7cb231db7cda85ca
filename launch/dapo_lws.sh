#!/usr/bin/env bash
# "Learning when to search" (docs/recipes/lws.md) on OpenRLHF: DAPO (group-normalised advantages, no critic, clip
# 0.2 / 0.28, dynamic filtering, KL loss 1e-4) on the two-stage lws reward, with the paper's settings.
#
#   ray job submit --address=http://HEAD:8265 --runtime-env-json='{"working_dir": "."}' -- bash launch/dapo_lws.sh
#   SWITCH_STEP=200 bash launch/dapo_lws.sh --dry-run [more OpenRLHF flags]    # print the resolved command
#
# This is launch/ppo_r3.sh with ALGO=dapo and the defaults below; its other variables apply too (services,
# GPU layout, checkpoints, START_STEP for a resumed run, KL_COEF=0 for DAPO without KL, DYNAMIC_FILTERING).
#
# Variables (defaults in brackets):
#   SWITCH_STEP       training step at which stage 2 starts; 0 runs stage 2 only [the config's: 100]
#   BETA              per retrieval: stage 1's bonus for a wrong answer, stage 2's cost for a right one
#                     [the config's: 0.3]
#   QUERY_ENCODER     encoder of the search reward's query diversity [the config's: intfloat/e5-base-v2]
#   STEPS             at most this many training steps: the run reads the first STEPS * ROLLOUT_BATCH / EPISODES
#                     prompts of PROMPT_DATA, EPISODES times [500]
#   EPISODES          passes over those prompts [1]
#   AGENT_CONFIG [launch/configs/lws.yaml]  ROLLOUT_BATCH [32]  SAMPLES_PER_PROMPT [32]  ACTOR_LR [1e-6]
#   MAX_LEN [6144: a prompt of up to 2,048 tokens and 4,096 of steps and documents; OpenRLHF 0.11.2 has
#   one limit for the whole episode]  SAVE_DIR [checkpoints/lws-<ALGO>]  ALGO [dapo]
#
# The stage clock. The reward does not see OpenRLHF's step: each vLLM engine counts the episodes it ran and
# divides by reward.episodes_per_step (ROLLOUT_BATCH * SAMPLES_PER_PROMPT / VLLM_ENGINES), then adds
# START_STEP. Dynamic filtering drops the prompts whose samples are all right or all wrong and generates
# replacements, and those episodes advance the clock too (so do --eval.dataset's): with p the share of
# prompts kept (OpenRLHF logs dynamic_filtering_pass_rate, in percent), stage 2 starts near OpenRLHF step
# SWITCH_STEP * p.
# Scale SWITCH_STEP by the pass rate, or set DYNAMIC_FILTERING=0 for a switch at SWITCH_STEP exactly.
# The filter reads the mean score, which r3rag sets to accuracy (DAPO's rule), so it also drops groups that
# are all right but differ in retrieval count: the groups stage 2's retrieval cost teaches from.
# Steps. OpenRLHF stops when its prompts run out; with dynamic filtering a step uses ROLLOUT_BATCH / p
# prompts, so a run makes about STEPS * p steps: raise STEPS (PROMPT_DATA needs the prompts) to make more.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=launch/lib.sh
source "$here/lib.sh"

export ALGO="${ALGO:-dapo}"
export AGENT_CONFIG="${AGENT_CONFIG:-$here/configs/lws.yaml}"
export ROLLOUT_BATCH="${ROLLOUT_BATCH:-32}"
export SAMPLES_PER_PROMPT="${SAMPLES_PER_PROMPT:-32}"
export ACTOR_LR="${ACTOR_LR:-1e-6}"
export MAX_LEN="${MAX_LEN:-6144}"
export EPISODES="${EPISODES:-1}"
export SAVE_DIR="${SAVE_DIR:-checkpoints/lws-$ALGO}"
STEPS="${STEPS:-500}"
require_int 1 STEPS EPISODES ROLLOUT_BATCH

# The schedule reaches the reward as reward.options, which an override replaces whole: ppo_r3.sh merges
# REWARD_OPTIONS over the config's options.
options=()
if [[ -n "${SWITCH_STEP:-}" ]]; then
    require_int 0 SWITCH_STEP
    if (( SWITCH_STEP >= STEPS )); then
        echo "warning: SWITCH_STEP=$SWITCH_STEP is not below STEPS=$STEPS: the run stays in stage 1" >&2
    fi
    options+=("\"switch_step\": $SWITCH_STEP")
fi
if [[ -n "${BETA:-}" ]]; then
    require_number BETA
    options+=("\"beta\": $BETA")
fi
if (( ${#options[@]} )); then
    if [[ -n "${REWARD_OPTIONS:-}" ]]; then
        echo "REWARD_OPTIONS and SWITCH_STEP / BETA are both set: put switch_step and beta in REWARD_OPTIONS" >&2
        exit 2
    fi
    REWARD_OPTIONS="{$(IFS=,; echo "${options[*]}")}"
    export REWARD_OPTIONS
fi

exec bash "$here/ppo_r3.sh" --data.max_samples "$(( (STEPS * ROLLOUT_BATCH + EPISODES - 1) / EPISODES ))" \
    --rollout.top_p 1.0 "$@"
