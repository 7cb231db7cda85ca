#!/usr/bin/env bash
# The evaluation recipe on one GPU node: serve the retriever and the judge, evaluate, score, report.
#
#   DATA=data/hotpotqa/dev.jsonl,data/2wikimultihopqa/dev.jsonl,data/musique/dev.jsonl \
#   RETRIEVER_CONFIG=e5.yaml POLICY=checkpoints/r3-ppo bash launch/eval.sh [--dry-run] [more `r3rag eval run` flags]
#
# The paper's protocol by default: greedy, top-5 per step, at most 5 steps, judge ACC + EM + F1.
# Services already running elsewhere are used instead of started here (RETRIEVER_URL, REWARD_URL).
# Reruns resume: finished questions and judge verdicts are kept in each run folder.
#
# Variables (defaults in brackets):
#   POLICY            the model to evaluate, hub name or folder [required]
#   DATA              FlashRAG dataset files, comma-separated [required]
#   METHODS           comma-separated: r3 react direct naive_rag flashrag:ircot ... [r3]
#   ENGINE            vllm (offline), hf, or openai with ENGINE_URL (a served policy) [vllm]
#   OUT               the runs' parent folder; each method writes OUT/<method>-<retriever label> [runs/eval]
#   TOPK, MAX_STEPS   documents per step, step limit [5, 5]
#   RETRIEVER_CONFIG  retriever.yaml to serve here      RETRIEVER_URL  a running retrieval service instead
#   RETRIEVER_NAME    the retriever's label in the report [from the config, else "service"]
#   RETRIEVER_PORT    [8000]
#   REWARD_URL        a running reward server; otherwise launch/serve_reward.sh starts one with JUDGE_MODEL
#   JUDGE_MODEL       the ACC judge [Qwen/Qwen2.5-72B-Instruct, as in the paper]; JUDGE_TP [4]
#   REWARD_PORT       [8002]
#   POLICY_DEVICES, JUDGE_DEVICES  CUDA_VISIBLE_DEVICES of the policy and the judge [0; 4,5,6,7]
#   WAIT_S            seconds to wait for each service [1800]
#   R3RAG             the r3rag command [r3rag]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=launch/lib.sh
source "$here/lib.sh"
split_dry_run "$@"

POLICY="${POLICY:?set POLICY to the model to evaluate (hub name or folder)}"
DATA="${DATA:?set DATA to FlashRAG dataset files, comma-separated}"
METHODS="${METHODS:-r3}"
ENGINE="${ENGINE:-vllm}"
OUT="${OUT:-runs/eval}"
TOPK="${TOPK:-5}"
MAX_STEPS="${MAX_STEPS:-5}"
RETRIEVER_PORT="${RETRIEVER_PORT:-8000}"
REWARD_PORT="${REWARD_PORT:-8002}"
JUDGE_MODEL="${JUDGE_MODEL:-Qwen/Qwen2.5-72B-Instruct}"
JUDGE_TP="${JUDGE_TP:-4}"
POLICY_DEVICES="${POLICY_DEVICES:-0}"
JUDGE_DEVICES="${JUDGE_DEVICES:-4,5,6,7}"
WAIT_S="${WAIT_S:-1800}"
R3RAG="${R3RAG:-r3rag}"

if [[ -z "${RETRIEVER_URL:-}" && -z "${RETRIEVER_CONFIG:-}" ]]; then
    echo "set RETRIEVER_CONFIG (a retriever.yaml to serve here) or RETRIEVER_URL (a running service)" >&2
    exit 2
fi
if [[ "$ENGINE" == "openai" && -z "${ENGINE_URL:-}" ]]; then
    echo "ENGINE=openai needs ENGINE_URL, the /v1 URL serving POLICY" >&2
    exit 2
fi

# Each service runs in a session of its own (lib.sh's start_service), stopped however this script ends.
trap stop_services EXIT

run() {
    if (( dry_run )); then print_command "$@"; else "$@"; fi
}

if (( ! dry_run )); then mkdir -p "$OUT/logs"; fi
retriever_url="${RETRIEVER_URL:-http://127.0.0.1:$RETRIEVER_PORT}"
if [[ -z "${RETRIEVER_URL:-}" ]]; then
    if (( dry_run )); then
        CONFIG="$RETRIEVER_CONFIG" PORT="$RETRIEVER_PORT" R3RAG="$R3RAG" bash "$here/serve_retriever.sh" --dry-run
    else
        start_service "$retriever_url" "the retriever" "$OUT/logs/retriever.log" \
            env CONFIG="$RETRIEVER_CONFIG" PORT="$RETRIEVER_PORT" R3RAG="$R3RAG" bash "$here/serve_retriever.sh"
    fi
fi
reward_url="${REWARD_URL:-http://127.0.0.1:$REWARD_PORT}"
if [[ -z "${REWARD_URL:-}" ]]; then
    if (( dry_run )); then
        JUDGE_MODEL="$JUDGE_MODEL" JUDGE_TP="$JUDGE_TP" PORT="$REWARD_PORT" R3RAG="$R3RAG" \
            CUDA_VISIBLE_DEVICES="$JUDGE_DEVICES" bash "$here/serve_reward.sh" --dry-run
    else
        start_service "$reward_url" "the reward server" "$OUT/logs/reward.log" \
            env JUDGE_MODEL="$JUDGE_MODEL" JUDGE_TP="$JUDGE_TP" PORT="$REWARD_PORT" R3RAG="$R3RAG" \
            CUDA_VISIBLE_DEVICES="$JUDGE_DEVICES" bash "$here/serve_reward.sh"
    fi
fi

label="${RETRIEVER_NAME:-}"
if [[ -z "$label" && -n "${RETRIEVER_CONFIG:-}" && -z "${RETRIEVER_URL:-}" ]]; then
    label="$(basename "$RETRIEVER_CONFIG" .yaml)"
fi
retriever_flags=(--retrieval.url "$retriever_url" --retriever_name "${label:-service}")
engine_flags=(--engine.kind "$ENGINE" --engine.model "$POLICY")
if [[ "$ENGINE" == "openai" ]]; then engine_flags+=(--engine.base_url "$ENGINE_URL"); fi

IFS=',' read -r -a methods <<<"$METHODS"
for method in "${methods[@]}"; do
    run_dir="$OUT/${method//:/-}-${label:-service}"
    run env CUDA_VISIBLE_DEVICES="$POLICY_DEVICES" "$R3RAG" eval run --data "$DATA" --out "$run_dir" \
        --method "$method" "${engine_flags[@]}" "${retriever_flags[@]}" \
        --env.topk "$TOPK" --env.max_steps "$MAX_STEPS" ${extra[@]+"${extra[@]}"}
    run "$R3RAG" eval score --run "$run_dir" --judge.url "$reward_url"
done
run "$R3RAG" eval report "$OUT"
