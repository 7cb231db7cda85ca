#!/usr/bin/env bash
# R3-RAG's RL stage on OpenRLHF: PPO with GAE and a critic (the paper's settings), or GRPO / REINFORCE++ / DAPO.
#
#   ray job submit --address=http://HEAD:8265 --runtime-env-json='{"working_dir": "."}' -- bash launch/ppo_r3.sh
#   bash launch/ppo_r3.sh --dry-run [more OpenRLHF flags]     # print the resolved command
#
# The retrieval service (launch/serve_retriever.sh) and the reward server (launch/serve_reward.sh)
# must be reachable from every node. Flags after the variables' defaults override them.
#
# The recipe (RECIPE, recipes/<name>.yaml) holds the method's settings: the agent reads its env, reward,
# services and policy sections through $R3RAG_AGENT_CONFIG, and its algo section gives the defaults of
# ALGO, POLICY, LABEL_KEY, ROLLOUT_BATCH, SAMPLES_PER_PROMPT, ACTOR_LR, TOP_P, TEMPERATURE, KL_COEF, MAX_LEN,
# EPISODES, STEPS, DYNAMIC_FILTERING and DYNAMIC_FILTERING_RANGE below ("the recipe's"); a variable set here wins.
#
# Variables (defaults in brackets):
#   RECIPE            a recipe's name (r3, r3_recall, lws, r2ag: recipes/<name>.yaml) or file [r3]
#   POLICY            the cold-start (SFT) checkpoint or a hub name [the recipe's; r3: Qwen/Qwen2.5-7B-Instruct]
#   PROMPT_DATA       RL questions, FlashRAG jsonl (question, golden_answers) [data/hotpotqa_rl.jsonl]
#   INPUT_KEY         question field [question]
#   LABEL_KEY         label field: golden answers, or a JSON label (see r3_env.data.read_label)
#                     [the recipe's, else golden_answers]
#   RETRIEVER_URL     retrieval service [http://127.0.0.1:8000]
#   REWARD_URL        reward server (judge) [http://127.0.0.1:8002]
#   SCHEME            reward scheme override: r3, r3_gold, outcome, lws, gold_hit [the config's]
#   REWARD_OPTIONS    JSON object of reward.options, merged over the config's, e.g. '{"beta": 0.5}' [none]
#   QUERY_ENCODER     reward.query_encoder: encoder folder of schemes that compare queries (lws) [the config's]
#   ALGO              ppo (GAE + critic, the paper), grpo (group_norm), reinforce++ (reinforce_baseline),
#                     dapo (group_norm, clip 0.2 / 0.28, dynamic filtering; see launch/dapo_lws.sh)
#                     [the recipe's; r3: ppo]
#   KL_COEF           KL coefficient: ppo's penalty in the reward, the others' loss term (k3, k2 for reinforce++);
#                     0: no KL and no reference model [the recipe's, else 0.01 for ppo, 0.001 for grpo and
#                     reinforce++, 1e-4 for dapo]
#   DYNAMIC_FILTERING 1: drop prompts whose samples are all right or all wrong and draw others (OpenRLHF's
#                     dynamic filtering on the score, which r3rag sets to answer accuracy) [the recipe's, else 1 for
#                     dapo, 0 for the others]
#   DYNAMIC_FILTERING_RANGE  LOW HIGH: dynamic filtering keeps a prompt when its samples' mean score lies
#                     strictly between them (HIGH may be inf) [the recipe's, else "0 1": accuracy neither 0 nor 1]
#   PLACEMENT         step (each step's reward at its last token; ppo only: group baselines normalise
#                     episode totals) or scalar (one reward per episode) [step for ppo, else scalar]
#   ROLLOUT_BATCH     prompts per rollout and per training batch [the recipe's; r3: 64]
#   START_STEP        training step a resumed run starts at (the clock of schemes that change with it, lws) [0]
#   NODES, GPUS_PER_NODE        the Ray cluster's nodes and GPUs per node [1, 8]
#   COLOCATE          all: actor, ref, critic and vLLM share the same GPUs (sleeping in turn);
#                     actor_ref: actor and ref share theirs, critic and vLLM get their own;
#                     none: every model on its own GPUs [all]
#   ACTOR_NODES, ACTOR_GPUS_PER_NODE    the actor's GPUs (the ref's too) [NODES, GPUS_PER_NODE]
#   CRITIC_NODES, CRITIC_GPUS_PER_NODE  the critic's (ALGO=ppo) [the actor's]
#   VLLM_ENGINES, VLLM_TP       vLLM rollout engines and their tensor parallelism (within a node)
#                               [ACTOR_NODES*ACTOR_GPUS_PER_NODE/VLLM_TP, 1]
#   VLLM_GPU_MEMORY             vLLM's share of each of its GPUs [0.5 with COLOCATE=all, else 0.9]
#   The layout is checked before anything runs: the models' GPUs must fit NODES x GPUS_PER_NODE, and
#   with COLOCATE=all the vLLM engines must cover exactly the actor's GPUs (OpenRLHF's own rule).
#   SUBMIT_TO         a Ray dashboard address (http://HEAD:8265): check here, then `ray job submit` this
#                     script with the variables set here, the repository as working dir [unset: run here]
#   SAMPLES_PER_PROMPT          [the recipe's, else 4 for ppo, 8 for grpo, reinforce++ and dapo]
#   ACTOR_LR          actor learning rate [the recipe's; r3: 5e-7]
#   TOP_P             rollout top-p (--rollout.top_p) [the recipe's, else OpenRLHF's]
#   TEMPERATURE       rollout temperature (--rollout.temperature) [the recipe's, else 1.0]
#   EPISODES          passes over the prompts (--train.num_episodes) [the recipe's; r3: 4]
#   STEPS             at most this many training steps: the run reads the first STEPS * ROLLOUT_BATCH / EPISODES
#                     prompts of PROMPT_DATA, EPISODES times [the recipe's, else every prompt]
#   MAX_LEN           prompt + every step + documents, in tokens [the recipe's; r3: 8192]
#   SAVE_DIR          final model [checkpoints/<recipe>-<ALGO>]
#   CKPT_DIR          resumable DeepSpeed checkpoints; a rerun resumes from the newest [<SAVE_DIR>/ckpt]
#   SAVE_STEPS        checkpoint every N steps [20]
#   WANDB_API_KEY     log to Weights & Biases when set; TENSORBOARD_DIR to TensorBoard [<SAVE_DIR>/tb]
#   TRAJECTORY_LOG    append every episode's record (steps, queries, documents, rewards) to this JSON-lines
#                     file, "{pid}" replaced by each vLLM engine's process id (policy.trajectory_log) [none]
#   PYTHON            [python3]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=launch/lib.sh
source "$here/lib.sh"
split_dry_run "$@"

# The variables set by the caller, forwarded to the cluster with SUBMIT_TO (secrets stay in its environment);
# paths inside this repository become relative, since the job runs in the uploaded copy of it.
repo="$(cd "$here/.." && pwd)"
set_here=()
for name in RECIPE POLICY PROMPT_DATA INPUT_KEY LABEL_KEY RETRIEVER_URL REWARD_URL SCHEME REWARD_OPTIONS \
    QUERY_ENCODER ALGO KL_COEF DYNAMIC_FILTERING DYNAMIC_FILTERING_RANGE PLACEMENT ROLLOUT_BATCH START_STEP \
    NODES GPUS_PER_NODE COLOCATE ACTOR_NODES ACTOR_GPUS_PER_NODE CRITIC_NODES CRITIC_GPUS_PER_NODE \
    VLLM_ENGINES VLLM_TP VLLM_GPU_MEMORY SAMPLES_PER_PROMPT ACTOR_LR TOP_P TEMPERATURE EPISODES STEPS MAX_LEN SAVE_DIR CKPT_DIR \
    SAVE_STEPS TENSORBOARD_DIR TRAJECTORY_LOG; do
    if [[ -n "${!name+set}" ]]; then value="${!name}"; set_here+=("$name=${value#"$repo"/}"); fi
done

PYTHON="${PYTHON:-python3}"
if ! r3_env_dir="$("$PYTHON" -c 'import importlib.util as u; print(u.find_spec("r3_env").submodule_search_locations[0])' 2>/dev/null)"; then
    echo "r3rag is not installed for $PYTHON: pip install -e . (or set PYTHON to the env's python)" >&2
    exit 2
fi
# The recipe's settings (recipe_path, recipe_name, recipe_<VARIABLE>), read by r3_env.recipes.
if [[ -n "${AGENT_CONFIG:-}" ]]; then
    echo "AGENT_CONFIG is no longer read: the agent's settings come from the recipe (RECIPE=r3, r3_recall, lws, r2ag or a" \
        "recipe file; see recipes/)" >&2
    exit 2
fi
RECIPE="${RECIPE:-r3}"
python_errors="$(mktemp)"
trap 'rm -f "$python_errors"' EXIT
# stdout only is eval'd or read as a number: a warning on stderr must not become shell code
if ! recipe_lines="$("$PYTHON" -m r3_env.recipes shell "$RECIPE" 2>"$python_errors")"; then
    echo "RECIPE=$RECIPE: $(tail -n 1 "$python_errors")" >&2
    exit 2
fi
recipe_path="" recipe_name="" recipe_ALGO="" recipe_POLICY="" recipe_LABEL_KEY="" recipe_ROLLOUT_BATCH=""
recipe_SAMPLES_PER_PROMPT="" recipe_ACTOR_LR="" recipe_TOP_P="" recipe_MAX_LEN="" recipe_EPISODES="" recipe_STEPS=""
recipe_DYNAMIC_FILTERING_RANGE="" recipe_TEMPERATURE="" recipe_KL_COEF="" recipe_DYNAMIC_FILTERING=""
eval "$recipe_lines"
for name in POLICY ROLLOUT_BATCH ACTOR_LR EPISODES MAX_LEN; do
    from_recipe="recipe_$name"
    if [[ -z "${!name:-}" && -z "${!from_recipe}" ]]; then
        echo "RECIPE=$RECIPE ($recipe_path) does not set $name: set $name, or its key in the recipe's algo section" >&2
        exit 2
    fi
done
POLICY="${POLICY:-$recipe_POLICY}"
PROMPT_DATA="${PROMPT_DATA:-data/hotpotqa_rl.jsonl}"
INPUT_KEY="${INPUT_KEY:-question}"
LABEL_KEY="${LABEL_KEY:-${recipe_LABEL_KEY:-golden_answers}}"
RETRIEVER_URL="${RETRIEVER_URL:-http://127.0.0.1:8000}"
REWARD_URL="${REWARD_URL:-http://127.0.0.1:8002}"
ALGO="${ALGO:-${recipe_ALGO:-ppo}}"
NODES="${NODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
COLOCATE="${COLOCATE:-all}"
require_int 1 NODES GPUS_PER_NODE
ACTOR_NODES="${ACTOR_NODES:-$NODES}"
ACTOR_GPUS_PER_NODE="${ACTOR_GPUS_PER_NODE:-$GPUS_PER_NODE}"
CRITIC_NODES="${CRITIC_NODES:-$ACTOR_NODES}"
CRITIC_GPUS_PER_NODE="${CRITIC_GPUS_PER_NODE:-$ACTOR_GPUS_PER_NODE}"
VLLM_TP="${VLLM_TP:-1}"
require_int 1 ACTOR_NODES ACTOR_GPUS_PER_NODE CRITIC_NODES CRITIC_GPUS_PER_NODE VLLM_TP
VLLM_ENGINES="${VLLM_ENGINES:-$((ACTOR_NODES * ACTOR_GPUS_PER_NODE / VLLM_TP))}"
if [[ "$COLOCATE" == all ]]; then VLLM_GPU_MEMORY="${VLLM_GPU_MEMORY:-0.5}"; else VLLM_GPU_MEMORY="${VLLM_GPU_MEMORY:-0.9}"; fi
MAX_LEN="${MAX_LEN:-$recipe_MAX_LEN}"
SAVE_DIR="${SAVE_DIR:-checkpoints/$recipe_name-$ALGO}"
CKPT_DIR="${CKPT_DIR:-$SAVE_DIR/ckpt}"
SAVE_STEPS="${SAVE_STEPS:-20}"
TENSORBOARD_DIR="${TENSORBOARD_DIR:-$SAVE_DIR/tb}"
ROLLOUT_BATCH="${ROLLOUT_BATCH:-$recipe_ROLLOUT_BATCH}"
START_STEP_SET="${START_STEP:-}"
START_STEP="${START_STEP:-0}"
ACTOR_LR="${ACTOR_LR:-$recipe_ACTOR_LR}"
EPISODES="${EPISODES:-$recipe_EPISODES}"
SAMPLES_PER_PROMPT="${SAMPLES_PER_PROMPT:-${recipe_SAMPLES_PER_PROMPT:-}}"
TOP_P="${TOP_P:-${recipe_TOP_P:-}}"
TEMPERATURE="${TEMPERATURE:-${recipe_TEMPERATURE:-1.0}}"
KL_COEF="${KL_COEF:-${recipe_KL_COEF:-}}"
DYNAMIC_FILTERING="${DYNAMIC_FILTERING:-${recipe_DYNAMIC_FILTERING:-}}"
STEPS="${STEPS:-${recipe_STEPS:-}}"

case "$ALGO" in
    ppo)
        SAMPLES_PER_PROMPT="${SAMPLES_PER_PROMPT:-4}"
        KL_COEF="${KL_COEF:-0.01}"
        algo_flags=(--algo.advantage.estimator gae --algo.advantage.gamma 1.0 --algo.advantage.lambd 0.95
            --critic.model_name_or_path "$POLICY" --critic.adam.lr 9e-6
            --critic.num_nodes "$CRITIC_NODES" --critic.num_gpus_per_node "$CRITIC_GPUS_PER_NODE") ;;
    grpo)
        SAMPLES_PER_PROMPT="${SAMPLES_PER_PROMPT:-8}"
        KL_COEF="${KL_COEF:-0.001}"
        algo_flags=(--algo.advantage.estimator group_norm --algo.kl.use_loss --algo.kl.estimator k3) ;;
    reinforce++)
        SAMPLES_PER_PROMPT="${SAMPLES_PER_PROMPT:-8}"
        KL_COEF="${KL_COEF:-0.001}"
        algo_flags=(--algo.advantage.estimator reinforce_baseline --algo.kl.use_loss --algo.kl.estimator k2) ;;
    dapo)  # DAPO: group-normalised advantages, decoupled clip (clip-higher), token-level loss, dynamic sampling
        SAMPLES_PER_PROMPT="${SAMPLES_PER_PROMPT:-8}"
        KL_COEF="${KL_COEF:-1e-4}"
        DYNAMIC_FILTERING="${DYNAMIC_FILTERING:-1}"
        algo_flags=(--algo.advantage.estimator group_norm --actor.eps_clip_low_high 0.2 0.28
            --actor.loss_agg_mode token-mean --algo.kl.use_loss --algo.kl.estimator k3) ;;
    *)
        echo "ALGO must be ppo, grpo, reinforce++ or dapo, got '$ALGO'" >&2
        exit 2 ;;
esac
DYNAMIC_FILTERING="${DYNAMIC_FILTERING:-0}"
DYNAMIC_FILTERING_RANGE="${DYNAMIC_FILTERING_RANGE:-${recipe_DYNAMIC_FILTERING_RANGE:-0 1}}"
require_int 1 VLLM_ENGINES ROLLOUT_BATCH SAMPLES_PER_PROMPT EPISODES
# STEPS caps the prompts read: STEPS * ROLLOUT_BATCH / EPISODES of them, EPISODES times
if [[ -n "$STEPS" ]]; then
    require_int 1 STEPS
    algo_flags+=(--data.max_samples "$(( (STEPS * ROLLOUT_BATCH + EPISODES - 1) / EPISODES ))")
fi
if [[ -n "$TOP_P" ]]; then
    require_number TOP_P
    algo_flags+=(--rollout.top_p "$TOP_P")
fi
require_number TEMPERATURE
require_int 0 START_STEP
require_number ACTOR_LR KL_COEF
if [[ "$DYNAMIC_FILTERING" != 0 && "$DYNAMIC_FILTERING" != 1 ]]; then
    echo "DYNAMIC_FILTERING must be 0 or 1, got '$DYNAMIC_FILTERING'" >&2
    exit 2
fi
number='-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?'
if [[ ! "$DYNAMIC_FILTERING_RANGE" =~ ^($number)\ ($number|inf)$ ]]; then
    echo "DYNAMIC_FILTERING_RANGE must be two numbers 'LOW HIGH' (HIGH may be inf), got '$DYNAMIC_FILTERING_RANGE'" >&2
    exit 2
fi
read -r filter_low filter_high <<< "$DYNAMIC_FILTERING_RANGE"
algo_flags+=(--algo.kl.init_coef "$KL_COEF")
# keep a prompt's samples when their mean score (accuracy by default) lies strictly between LOW and HIGH
if (( DYNAMIC_FILTERING )); then
    algo_flags+=(--algo.dynamic_filtering_enable --algo.dynamic_filtering_range "$filter_low" "$filter_high")
fi
if [[ "$ALGO" == ppo ]]; then PLACEMENT="${PLACEMENT:-step}"; else PLACEMENT="${PLACEMENT:-scalar}"; fi
if [[ "$PLACEMENT" != step && "$PLACEMENT" != scalar ]]; then
    echo "PLACEMENT must be step or scalar, got '$PLACEMENT'" >&2
    exit 2
fi
if [[ "$PLACEMENT" == step && "$ALGO" != ppo ]]; then
    echo "PLACEMENT=step needs ALGO=ppo: $ALGO's group baseline normalises episode totals; use PLACEMENT=scalar" >&2
    exit 2
fi
# check_layout: exit 2, naming the variables to change, unless the models' GPUs fit the cluster the way
# OpenRLHF places them; sets colocate_flags.
check_layout() {
    local total=$((NODES * GPUS_PER_NODE)) actor=$((ACTOR_NODES * ACTOR_GPUS_PER_NODE))
    local vllm=$((VLLM_ENGINES * VLLM_TP)) critic=0 ref=0 used group
    if [[ "$ALGO" == ppo ]]; then critic=$((CRITIC_NODES * CRITIC_GPUS_PER_NODE)); fi
    if [[ ! "$KL_COEF" =~ ^0(\.0*)?([eE][-+]?[0-9]+)?$ ]]; then ref=$actor; fi
    for group in ACTOR CRITIC; do
        local nodes="${group}_NODES" per_node="${group}_GPUS_PER_NODE"
        if (( ${!nodes} > NODES || ${!per_node} > GPUS_PER_NODE )); then
            echo "$nodes x $per_node (${!nodes} x ${!per_node}) does not fit the cluster's NODES x GPUS_PER_NODE" \
                "($NODES x $GPUS_PER_NODE)" >&2
            exit 2
        fi
    done
    if (( VLLM_TP > GPUS_PER_NODE )); then
        echo "VLLM_TP ($VLLM_TP) must be at most GPUS_PER_NODE ($GPUS_PER_NODE): an engine's tensor parallelism" \
            "stays within one node" >&2
        exit 2
    fi
    case "$COLOCATE" in
        all)
            colocate_flags=(--train.colocate_all --vllm.enable_sleep --ds.enable_sleep)
            if (( vllm != actor )); then
                echo "with COLOCATE=all the vLLM engines take turns with the actor on its GPUs: VLLM_ENGINES x VLLM_TP" \
                    "($VLLM_ENGINES x $VLLM_TP) must equal ACTOR_NODES x ACTOR_GPUS_PER_NODE ($actor)" >&2
                exit 2
            fi
            if (( critic )) && [[ "$CRITIC_NODES $CRITIC_GPUS_PER_NODE" != "$ACTOR_NODES $ACTOR_GPUS_PER_NODE" ]]; then
                echo "with COLOCATE=all the critic shares the actor's GPUs: set CRITIC_NODES and CRITIC_GPUS_PER_NODE" \
                    "to the actor's ($ACTOR_NODES, $ACTOR_GPUS_PER_NODE), or use COLOCATE=actor_ref" >&2
                exit 2
            fi
            used=$actor ;;
        actor_ref)
            colocate_flags=(--train.colocate_actor_ref)
            used=$((actor + critic + vllm)) ;;
        none)
            colocate_flags=()
            used=$((actor + ref + critic + vllm)) ;;
        *)
            echo "COLOCATE must be all, actor_ref or none, got '$COLOCATE'" >&2
            exit 2 ;;
    esac
    if (( used > total )); then
        echo "COLOCATE=$COLOCATE needs $used GPUs (actor $actor, ref $([[ $COLOCATE == none ]] && echo "$ref" ||
            echo shared), critic $critic, vLLM $vllm) but NODES x GPUS_PER_NODE is $total: lower ACTOR_*," \
            "CRITIC_* or VLLM_ENGINES, or colocate more" >&2
        exit 2
    fi
    if (( ROLLOUT_BATCH * SAMPLES_PER_PROMPT / 8 < actor )); then
        echo "ROLLOUT_BATCH x SAMPLES_PER_PROMPT / 8 (rollout micro-batches: $((ROLLOUT_BATCH * SAMPLES_PER_PROMPT / 8)))" \
            "must be at least the actor's $actor GPUs (OpenRLHF's rule): raise ROLLOUT_BATCH" >&2
        exit 2
    fi
}

check_layout

# The agent reads its config from these in every Ray worker (r3_env.openrlhf.train forwards R3RAG_*).
# A staged scheme's clock counts the episodes of one vLLM engine; OpenRLHF deals whole prompts to engines.
# shellcheck disable=SC2017  # whole prompts per engine first, then their samples
episodes_per_step=$(( ROLLOUT_BATCH / VLLM_ENGINES * SAMPLES_PER_PROMPT ))
overrides="{\"services.retriever_url\": \"$RETRIEVER_URL\", \"services.reward_url\": \"$REWARD_URL\""
overrides+=", \"reward.placement\": \"$PLACEMENT\", \"reward.episodes_per_step\": $episodes_per_step"
overrides+=", \"reward.start_step\": $START_STEP"
if [[ -n "${SCHEME:-}" ]]; then overrides+=", \"reward.scheme\": \"$SCHEME\""; fi
if [[ -n "${QUERY_ENCODER:-}" ]]; then overrides+=", \"reward.query_encoder\": \"$QUERY_ENCODER\""; fi
if [[ -n "${TRAJECTORY_LOG:-}" ]]; then overrides+=", \"policy.trajectory_log\": \"$TRAJECTORY_LOG\""; fi
agent_file="$r3_env_dir/openrlhf/agent.py"
if (( DYNAMIC_FILTERING )) && ! "$PYTHON" -c 'import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]))' \
    "$filter_low" "$filter_high"; then
    echo "DYNAMIC_FILTERING_RANGE: LOW must be below HIGH, got '$DYNAMIC_FILTERING_RANGE'" >&2
    exit 2
fi
if [[ -n "${REWARD_OPTIONS:-}" ]]; then
    # An override replaces reward.options whole, so the recipe's options are merged in here.
    reward_options="$("$PYTHON" -m r3_env.recipes reward-options "$recipe_path" "$REWARD_OPTIONS")" || exit 2
    overrides+=", \"reward.options\": $reward_options"
fi
overrides+="}"
export R3RAG_AGENT_CONFIG="$recipe_path"
export R3RAG_AGENT_OVERRIDES="$overrides"

# The config as the agent will read it; a scheme that changes with the training step needs an exact clock.
if ! staged="$("$PYTHON" -m r3_env.recipes staged 2>"$python_errors")"; then
    echo "cannot read the agent config with $PYTHON ($(tail -n 1 "$python_errors")): check RECIPE and the overrides," \
        "or set PYTHON to the python of the env r3rag is installed in" >&2
    exit 2
fi
rm -f "$python_errors"  # the trainer is exec'd below, where the EXIT trap no longer runs
if (( staged )); then
    if (( ROLLOUT_BATCH % VLLM_ENGINES )); then
        echo "the reward's stage clock counts each vLLM engine's episodes, and OpenRLHF deals whole prompts to" \
            "engines: ROLLOUT_BATCH ($ROLLOUT_BATCH) must divide by VLLM_ENGINES ($VLLM_ENGINES)" >&2
        exit 2
    fi
    if [[ -z "${START_STEP_SET:-}" && -d "$CKPT_DIR" && -n "$(ls -A "$CKPT_DIR" 2>/dev/null)" ]]; then
        echo "$CKPT_DIR holds a checkpoint this run resumes from: set START_STEP to its step (the newest" \
            "global_step folder there) so the reward's stages resume where they were" >&2
        exit 2
    fi
fi

cmd=("$PYTHON" -m r3_env.openrlhf.train
    --actor.model_name_or_path "$POLICY"
    --train.agent_func_path "$agent_file"
    --data.prompt_dataset "$PROMPT_DATA" --data.input_key "$INPUT_KEY" --data.label_key "$LABEL_KEY"
    --data.max_len "$MAX_LEN" --rollout.max_new_tokens 512
    --rollout.batch_size "$ROLLOUT_BATCH" --train.batch_size "$ROLLOUT_BATCH"
    --rollout.n_samples_per_prompt "$SAMPLES_PER_PROMPT"
    --rollout.micro_batch_size 8 --train.micro_batch_size 4 --rollout.temperature "$TEMPERATURE"
    --train.num_episodes "$EPISODES" --train.max_epochs 1
    --actor.adam.lr "$ACTOR_LR"
    "${algo_flags[@]}"
    --ds.zero_stage 2 --ds.param_dtype bf16 --actor.gradient_checkpointing_enable
    --actor.num_nodes "$ACTOR_NODES" --actor.num_gpus_per_node "$ACTOR_GPUS_PER_NODE"
    --ref.num_nodes "$ACTOR_NODES" --ref.num_gpus_per_node "$ACTOR_GPUS_PER_NODE"
    --vllm.num_engines "$VLLM_ENGINES" --vllm.tensor_parallel_size "$VLLM_TP"
    --vllm.gpu_memory_utilization "$VLLM_GPU_MEMORY" --vllm.enable_prefix_caching
    "${colocate_flags[@]}"
    --ckpt.output_dir "$SAVE_DIR" --ckpt.path "$CKPT_DIR" --ckpt.save_steps "$SAVE_STEPS" --ckpt.max_num 3
    --ckpt.load_enable
    --logger.logging_steps 1 --logger.tensorboard_dir "$TENSORBOARD_DIR")
if [[ -n "${WANDB_API_KEY:-}" ]]; then cmd+=(--logger.wandb.key "$WANDB_API_KEY" --logger.wandb.project r3rag); fi
cmd+=("${extra[@]}")

if [[ -n "${SUBMIT_TO:-}" ]]; then
    # The job resolves the same defaults on the cluster; only what was set here travels with it.
    submit=(ray job submit --address "$SUBMIT_TO" --working-dir "$here/.."
        --runtime-env-json '{"excludes": [".venv*", "runs", "demo_out", "checkpoints", ".git"]}'
        -- env "${set_here[@]}" bash launch/ppo_r3.sh "${extra[@]}")
    if (( dry_run )); then print_command "${submit[@]}"; exit 0; fi
    exec "${submit[@]}"
fi
if (( dry_run )); then
    echo "R3RAG_AGENT_CONFIG=$(printf '%q' "$R3RAG_AGENT_CONFIG")"
    echo "R3RAG_AGENT_OVERRIDES=$(printf '%q' "$R3RAG_AGENT_OVERRIDES")"
    print_command "${cmd[@]}"
    exit 0
fi
exec "${cmd[@]}"
