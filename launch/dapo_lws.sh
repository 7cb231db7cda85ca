#!/usr/bin/env bash
# "Learning when to search" (docs/recipes/lws.md) on OpenRLHF: DAPO (group-normalised advantages, no critic, clip
# 0.2 / 0.28, dynamic filtering, KL loss 1e-4) on the two-stage lws reward, with the paper's settings.
#
#   ray job submit --address=http://HEAD:8265 --runtime-env-json='{"working_dir": "."}' -- bash launch/dapo_lws.sh
#   SWITCH_STEP=200 bash launch/dapo_lws.sh --dry-run [more OpenRLHF flags]    # print the resolved command
#
# This is launch/ppo_r3.sh with RECIPE=lws (recipes/lws.yaml: the format, the reward, DAPO and the paper's budget);
# its other variables apply too (services, GPU layout, checkpoints, START_STEP for a resumed run, KL_COEF=0 for
# DAPO without KL, DYNAMIC_FILTERING) and override the recipe's (ALGO, STEPS, EPISODES, ROLLOUT_BATCH,
# SAMPLES_PER_PROMPT, ACTOR_LR, TOP_P, MAX_LEN: OpenRLHF 0.11.2 has one limit for the whole episode).
#
# Variables (defaults in brackets):
#   SWITCH_STEP       training step at which stage 2 starts; 0 runs stage 2 only [the recipe's: 100]
#   BETA              per retrieval: stage 1's bonus for a wrong answer, stage 2's cost for a right one
#                     [the recipe's: 0.3]
#   QUERY_ENCODER     encoder of the search reward's query diversity [the recipe's: intfloat/e5-base-v2]
#   STEPS             at most this many training steps: the run reads the first STEPS * ROLLOUT_BATCH / EPISODES
#                     prompts of PROMPT_DATA, EPISODES times [the recipe's: 500]
#   RECIPE [lws]  SAVE_DIR [checkpoints/lws-<ALGO>]
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

export RECIPE="${RECIPE:-lws}"

# The schedule reaches the reward as reward.options, which an override replaces whole: ppo_r3.sh merges
# REWARD_OPTIONS over the recipe's options.
options=()
if [[ -n "${SWITCH_STEP:-}" ]]; then
    require_int 0 SWITCH_STEP
    if [[ -z "${STEPS:-}" ]] && ! STEPS="$("${PYTHON:-python3}" -m r3_env.recipes get "$RECIPE" algo.steps 2>&1)"; then
        echo "RECIPE=$RECIPE: ${STEPS##*$'\n'}" >&2
        exit 2
    fi
    require_int 1 STEPS
    if (( STEPS && SWITCH_STEP >= STEPS )); then
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

exec bash "$here/ppo_r3.sh" "$@"
