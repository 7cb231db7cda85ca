#!/usr/bin/env bash
# R3-RAG's cold-start SFT (docs/recipes/r3-rag.md#stage-1-cold-start) on OpenRLHF's SFT trainer: full
# fine-tuning, DeepSpeed ZeRO-3, max length 4096, 3 epochs; lr 7e-6 and batch 16 for Qwen2.5-7B, 1e-5 and 8
# for Llama-3.1-8B.
#
#   r3rag coldstart synth ...  &&  r3rag coldstart sft-data --input runs/coldstart/trajectories.jsonl
#   bash launch/sft_coldstart.sh                 # one node, every GPU (deepspeed launcher)
#   HOSTFILE=hosts bash launch/sft_coldstart.sh  # several nodes (deepspeed hostfile: "host slots=8" lines)
#   bash launch/sft_coldstart.sh --dry-run [more OpenRLHF flags]   # print the resolved command
#
# Variables (defaults in brackets):
#   POLICY            base model, hub name or folder [Qwen/Qwen2.5-7B-Instruct]
#   FORM              transcript (multi-turn, loss on every step) or per_step (the paper's examples) [transcript]
#   SFT_DATA          r3rag coldstart sft-data output [runs/coldstart/sft_<FORM>.jsonl]
#   CHAT_TEMPLATE_FILE  the template sft-data wrote when RL uses one other than the tokenizer's [none]
#   LR, BATCH         [7e-6, 16; 1e-5, 8 when POLICY names Llama]
#   MICRO_BATCH       per GPU [1]
#   EPOCHS, MAX_LEN   [3, 4096]
#   GPUS_PER_NODE     [8]   HOSTFILE: deepspeed hostfile for several nodes [none]
#   SAVE_DIR          the cold-start model (R3-RAG-CS) [checkpoints/r3-cs]
#   CKPT_DIR          resumable DeepSpeed checkpoints; a rerun resumes from the newest [<SAVE_DIR>/ckpt]
#   WANDB_API_KEY     log to Weights & Biases when set; TensorBoard under <SAVE_DIR>/tb otherwise
#   DEEPSPEED         the launcher [deepspeed]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=launch/lib.sh
source "$here/lib.sh"
split_dry_run "$@"

POLICY="${POLICY:-Qwen/Qwen2.5-7B-Instruct}"
FORM="${FORM:-transcript}"
SFT_DATA="${SFT_DATA:-runs/coldstart/sft_$FORM.jsonl}"
shopt -s nocasematch
if [[ "$POLICY" == *llama* ]]; then LR="${LR:-1e-5}"; BATCH="${BATCH:-8}"; else LR="${LR:-7e-6}"; BATCH="${BATCH:-16}"; fi
shopt -u nocasematch
MICRO_BATCH="${MICRO_BATCH:-1}"
EPOCHS="${EPOCHS:-3}"
MAX_LEN="${MAX_LEN:-4096}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
SAVE_DIR="${SAVE_DIR:-checkpoints/r3-cs}"
CKPT_DIR="${CKPT_DIR:-$SAVE_DIR/ckpt}"
DEEPSPEED="${DEEPSPEED:-deepspeed}"

case "$FORM" in
    transcript) data_flags=(--data.input_key messages --data.apply_chat_template --data.multiturn) ;;
    per_step) data_flags=(--data.input_key prompt --data.output_key response --data.apply_chat_template) ;;
    *)
        echo "FORM must be transcript or per_step, got '$FORM'" >&2
        exit 2 ;;
esac
if [[ -n "${CHAT_TEMPLATE_FILE:-}" ]]; then
    if [[ ! -f "$CHAT_TEMPLATE_FILE" ]]; then
        echo "CHAT_TEMPLATE_FILE=$CHAT_TEMPLATE_FILE does not exist" >&2
        exit 2
    fi
    data_flags+=(--data.tokenizer_chat_template "$(cat "$CHAT_TEMPLATE_FILE")")
fi
if (( ! dry_run )) && [[ ! -f "$SFT_DATA" ]]; then
    echo "SFT_DATA=$SFT_DATA does not exist: run r3rag coldstart synth, then r3rag coldstart sft-data" >&2
    exit 2
fi

if [[ -n "${HOSTFILE:-}" ]]; then launcher=("$DEEPSPEED" --hostfile "$HOSTFILE"); else launcher=("$DEEPSPEED" --num_gpus "$GPUS_PER_NODE"); fi
cmd=("${launcher[@]}" --module openrlhf.cli.train_sft
    --model.model_name_or_path "$POLICY"
    --data.dataset "$SFT_DATA" "${data_flags[@]}" --data.max_len "$MAX_LEN"
    --train.batch_size "$BATCH" --train.micro_batch_size "$MICRO_BATCH" --train.max_epochs "$EPOCHS"
    --adam.lr "$LR" --lr_warmup_ratio 0.03
    --ds.zero_stage 3 --ds.param_dtype bf16 --model.gradient_checkpointing_enable
    --ckpt.output_dir "$SAVE_DIR" --ckpt.path "$CKPT_DIR" --ckpt.save_steps 500 --ckpt.max_num 2 --ckpt.load_enable
    --logger.logging_steps 1 --logger.tensorboard_dir "$SAVE_DIR/tb")
if [[ -n "${WANDB_API_KEY:-}" ]]; then cmd+=(--logger.wandb.key "$WANDB_API_KEY" --logger.wandb.project r3rag); fi
cmd+=("${extra[@]}")

if (( dry_run )); then
    print_command "${cmd[@]}"
    exit 0
fi
exec "${cmd[@]}"
