#!/usr/bin/env bash
# Start the judge model with vLLM and, once it answers, the r3rag reward server in front of it.
#
#   bash launch/serve_reward.sh [--dry-run] [more `r3rag reward serve` flags]
#
# Variables (defaults in brackets):
#   JUDGE_MODEL       hub name or local folder of the judge [Qwen/Qwen2.5-14B-Instruct when vLLM is started
#                     here; with JUDGE_URL, the config's judge.model unless set]
#   JUDGE_PORT        port of the judge, on 127.0.0.1 [8001]
#   JUDGE_TP          tensor-parallel GPUs for the judge [1]
#   JUDGE_GPU_MEMORY  vLLM --gpu-memory-utilization [0.90]
#   JUDGE_MAX_LEN     vLLM --max-model-len [8192]
#   JUDGE_URL         an OpenAI-compatible /v1 URL already serving the judge: vLLM is not started
#   CONFIG            reward.yaml (judge, reward and service sections) [none]
#   HOST, PORT        where the reward server listens [the config's, else 127.0.0.1 and 8002]
#   WAIT_S            seconds to wait for the judge to load [1200]
#   R3RAG, VLLM       the commands [r3rag, vllm]
#   R3RAG_REWARD_API_KEY  bearer token clients must send (read from the environment)
set -euo pipefail

# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"
split_dry_run "$@"

JUDGE_PORT="${JUDGE_PORT:-8001}"
JUDGE_TP="${JUDGE_TP:-1}"
JUDGE_GPU_MEMORY="${JUDGE_GPU_MEMORY:-0.90}"
JUDGE_MAX_LEN="${JUDGE_MAX_LEN:-8192}"
WAIT_S="${WAIT_S:-1200}"
R3RAG="${R3RAG:-r3rag}"
VLLM="${VLLM:-vllm}"
start_judge=0
if [[ -z "${JUDGE_URL:-}" ]]; then
    JUDGE_URL="http://127.0.0.1:${JUDGE_PORT}/v1"
    JUDGE_MODEL="${JUDGE_MODEL:-Qwen/Qwen2.5-14B-Instruct}"  # the served name must be the one the server asks for
    start_judge=1
fi

judge_cmd=("$VLLM" serve "${JUDGE_MODEL:-}" --host 127.0.0.1 --port "$JUDGE_PORT" --served-model-name "${JUDGE_MODEL:-}"
    --tensor-parallel-size "$JUDGE_TP" --gpu-memory-utilization "$JUDGE_GPU_MEMORY" --max-model-len "$JUDGE_MAX_LEN")
reward_cmd=("$R3RAG" reward serve)
if [[ -n "${CONFIG:-}" ]]; then reward_cmd+=(--config "$CONFIG"); fi
reward_cmd+=(--judge.backend openai --judge.base_url "$JUDGE_URL")
if [[ -n "${JUDGE_MODEL:-}" ]]; then reward_cmd+=(--judge.model "$JUDGE_MODEL"); fi
if [[ -n "${HOST:-}" ]]; then reward_cmd+=(--service.host "$HOST"); fi
if [[ -n "${PORT:-}" ]]; then reward_cmd+=(--service.port "$PORT"); fi
reward_cmd+=("${extra[@]}")
warn_if_exposed "${HOST:-}" R3RAG_REWARD_API_KEY

if (( dry_run )); then
    if (( start_judge )); then print_command "${judge_cmd[@]}"; fi
    print_command "${reward_cmd[@]}"
    exit 0
fi

if (( start_judge )); then
    "${judge_cmd[@]}" &
    judge_pid=$!
    trap 'kill "$judge_pid" 2>/dev/null || true' EXIT
fi
echo "waiting up to ${WAIT_S}s for the judge at $JUDGE_URL ..." >&2
deadline=$((SECONDS + WAIT_S))
until curl -sf "$JUDGE_URL/models" >/dev/null; do
    if (( start_judge )) && ! kill -0 "$judge_pid" 2>/dev/null; then
        echo "the judge (vllm serve) exited before it was ready" >&2
        exit 1
    fi
    if (( SECONDS > deadline )); then
        echo "the judge did not answer at $JUDGE_URL/models within ${WAIT_S}s" >&2
        exit 1
    fi
    sleep 5
done
echo "judge ready; starting the reward server" >&2
"${reward_cmd[@]}"
