#!/usr/bin/env bash
# R2AG (docs/recipes/r2ag.md) on OpenRLHF: one progressive round of DAPO (group-normalised advantages, no critic, clip
# 0.2 / 0.28, dynamic filtering) on the retrieval steering model's expansion steps, with the Top-Survivor reward
# (recipes/r2ag.yaml) and the paper's settings. One training sample is one expansion step.
#
#   PROMPT_DATA=runs/r2ag/round2/prompts.jsonl POLICY=runs/r2ag/round1/train SAVE_DIR=runs/r2ag/round2/train \
#       ROUND=2 bash launch/dapo_r2ag.sh --dry-run [more OpenRLHF flags]    # print the resolved command
#
# `r3rag r2ag train --trainer openrlhf` calls this once per round with PROMPT_DATA, POLICY and SAVE_DIR set:
# round r trains the model of round r - 1 on the trees still incomplete and saves the model round r + 1 starts
# from. This is launch/ppo_r3.sh with RECIPE=r2ag (recipes/r2ag.yaml: the format, the reward, DAPO and the paper's
# budget); its other variables apply too (services, GPU layout, checkpoints, KL_COEF=0 for DAPO without KL,
# DYNAMIC_FILTERING=0 to keep every group) and override the recipe's.
#
# Variables (defaults in brackets):
#   PROMPT_DATA       the round's prompts (<round dir>/prompts.jsonl), FlashRAG jsonl rows: question, and metadata
#                     holding supporting_passage_ids (the gold ids) and start_documents (the documents kept so far, a list
#                     of {"id", "contents"}) [required]
#   POLICY            the model this round trains: the previous round's SAVE_DIR, the base model in round 1
#                     [the recipe's: Qwen/Qwen3-8B, the paper's steering model]
#   ROUND             the progressive round, from 1 [1]
#   SAVE_DIR          this round's trained model (<round dir>/train); its checkpoints go to <SAVE_DIR>/ckpt, so
#                     a rerun of a round resumes it [checkpoints/r2ag-round<ROUND>]
#   STEPS             at most this many training steps: the run reads the first STEPS * ROLLOUT_BATCH / EPISODES
#                     prompts of PROMPT_DATA, EPISODES times [the recipe's: 80, the paper converged in about 80 steps]
#   EPISODES          passes over those prompts [the recipe's: 1]
#   LABEL_KEY         the label OpenRLHF hands the agent: the row's metadata (gold ids and kept documents)
#                     [the recipe's: metadata]
#   DYNAMIC_FILTERING_RANGE  a prompt's group is kept when its samples' mean score lies strictly between these
#                     [the recipe's: 0 inf, see below]
#   RECIPE [r2ag]  ROLLOUT_BATCH, SAMPLES_PER_PROMPT, ACTOR_LR, MAX_LEN, ALGO [the recipe's]
#   KL_COEF [ppo_r3.sh's for dapo: 1e-4]
#
# Dynamic filtering. The paper drops the groups whose rewards all equal (std 0). OpenRLHF's filter reads each
# sample's score (not its reward), averages it over the prompt's group and keeps the group when the mean lies
# strictly between DYNAMIC_FILTERING_RANGE's bounds. With the step's reward R (0 or more; 0 for a broken step) as
# top_survivor's score, "0 inf" drops exactly the groups whose rewards are all 0 and never a group whose rewards
# differ. Groups whose rewards all equal a positive value are kept: no mean-in-range test can drop them without
# dropping groups that differ. Their advantages are 0, so they give no policy gradient, but they share the batch.
# Steps. OpenRLHF stops when its prompts run out, and a step uses ROLLOUT_BATCH / p prompts when the filter keeps a
# share p of them (OpenRLHF logs dynamic_filtering_pass_rate, in percent): a round of N prompts makes at most
# N * p * EPISODES / ROLLOUT_BATCH steps (the paper's 4,674 trees: at most 36 per episode in round 1).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=launch/lib.sh
source "$here/lib.sh"

ROUND="${ROUND:-1}"
require_int 1 ROUND
if [[ -z "${PROMPT_DATA:-}" ]]; then
    echo "PROMPT_DATA must name the round's prompts (<round dir>/prompts.jsonl: rows whose metadata holds" \
        "supporting_passage_ids and start_documents)" >&2
    exit 2
fi
export PROMPT_DATA
export RECIPE="${RECIPE:-r2ag}"
export SAVE_DIR="${SAVE_DIR:-checkpoints/r2ag-round$ROUND}"

exec bash "$here/ppo_r3.sh" "$@"
