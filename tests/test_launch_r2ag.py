"""launch/dapo_r2ag.sh: one progressive round of R2AG with DAPO, its flags through OpenRLHF's own parser.

The script is launch/ppo_r3.sh with ALGO=dapo and the paper's settings (docs/recipes/r2ag.md#progressive-training);
the driver (``r3rag r2ag train --trainer openrlhf``) calls it once per round with PROMPT_DATA, POLICY and
SAVE_DIR set, and the agent reads recipes/r2ag.yaml through $R3RAG_AGENT_CONFIG.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT
from test_openrlhf_plugin import launch_flags, openrlhf_args

from r3_env.protocol import get_format
from r3_env.recipes import agent_config_from_environment, load_recipe
from r3_env.rewards import get_scheme

SCRIPT = "dapo_r2ag.sh"
CONFIG = ROOT / "recipes" / "r2ag.yaml"
ROUND_DATA = "runs/r2ag/round2/prompts.jsonl"
PREVIOUS = "runs/r2ag/round1/policy"


def agent_overrides(variables: dict[str, str]) -> dict:
    """The JSON object of dotted keys the script exports as $R3RAG_AGENT_OVERRIDES (printed shell-quoted)."""
    (value,) = shlex.split(variables["R3RAG_AGENT_OVERRIDES"])
    return json.loads(value)


def test_dapo_r2ag_resolves_to_the_papers_settings_in_openrlhfs_parser(monkeypatch):
    flags, variables = launch_flags(SCRIPT, PROMPT_DATA=ROUND_DATA, POLICY=PREVIOUS)
    args = openrlhf_args(flags, monkeypatch)
    # DAPO: group-normalised advantages without a critic, clip-higher (eps_low 0.2, eps_high 0.28), token-level loss
    assert args.algo.advantage.estimator == "group_norm"
    assert args.critic.model_name_or_path is None and not any(flag.startswith("--critic.") for flag in flags)
    assert list(args.actor.eps_clip_low_high) == [0.2, 0.28]
    assert args.actor.loss_agg_mode == "token-mean"
    assert args.algo.kl.use_loss and args.algo.kl.init_coef == 1e-4  # ppo_r3.sh's DAPO default
    # dynamic sampling: the score is the step's reward (0 or more), so (0, inf) drops the all-zero groups only
    assert args.algo.dynamic_filtering_enable
    low, high = args.algo.dynamic_filtering_range
    assert low == 0 and math.isinf(high) and high > 0
    # docs/recipes/r2ag.md#progressive-training: G = 12, prompt batch 128, lr 1e-6, about 80 steps,
    # 2,048 prompt + 4,096 output tokens
    assert (args.rollout.n_samples_per_prompt, args.rollout.batch_size) == (12, 128)
    assert args.actor.adam.lr == 1e-6
    assert (args.data.max_samples, args.train.num_episodes) == (80 * 128, 1)
    assert args.data.max_len == 2048 + 4096
    # the round's prompts, labelled by their metadata (gold ids and kept documents); the previous round's model
    assert args.data.prompt_dataset == ROUND_DATA
    assert (args.data.input_key, args.data.label_key) == ("question", "metadata")
    assert args.actor.model_name_or_path == PREVIOUS
    assert args.train.agent_func_path.endswith("r3_env/openrlhf/agent.py")
    assert args.reward.remote_url == ["agent"]
    assert args.ckpt.output_dir == "checkpoints/r2ag-round1" and args.ckpt.load_enable
    assert variables["R3RAG_AGENT_CONFIG"] == str(CONFIG)
    overrides = agent_overrides(variables)
    assert overrides["reward.placement"] == "scalar"  # a group baseline takes the step's reward
    assert overrides["reward.episodes_per_step"] == 128 * 12 // 8  # per vLLM engine, 8 by default
    assert "reward.options" not in overrides  # the config's


def test_the_driver_sets_each_rounds_prompts_model_and_output(monkeypatch):
    env = {"PROMPT_DATA": ROUND_DATA, "POLICY": PREVIOUS, "SAVE_DIR": "runs/r2ag/round2/policy", "ROUND": "2"}
    flags, _ = launch_flags(SCRIPT, **env)
    args = openrlhf_args(flags, monkeypatch)
    assert (args.data.prompt_dataset, args.actor.model_name_or_path) == (ROUND_DATA, PREVIOUS)
    assert args.ckpt.output_dir == "runs/r2ag/round2/policy"
    assert args.ckpt.path == "runs/r2ag/round2/policy/ckpt"  # a rerun of the round resumes it


def test_round_names_the_default_output_and_steps_cap_the_prompts(monkeypatch):
    flags, _ = launch_flags(SCRIPT, PROMPT_DATA=ROUND_DATA, ROUND="3", STEPS="40", EPISODES="2")
    args = openrlhf_args(flags, monkeypatch)
    assert args.ckpt.output_dir == "checkpoints/r2ag-round3"
    assert (args.data.max_samples, args.train.num_episodes) == (40 * 128 // 2, 2)


def test_the_filter_range_kl_and_filtering_can_be_changed(monkeypatch):
    flags, _ = launch_flags(SCRIPT, PROMPT_DATA=ROUND_DATA, DYNAMIC_FILTERING_RANGE="0 1", KL_COEF="0")
    args = openrlhf_args(flags, monkeypatch)
    assert list(args.algo.dynamic_filtering_range) == [0, 1]
    assert args.algo.kl.init_coef == 0  # DAPO without KL: OpenRLHF builds no reference model
    flags, _ = launch_flags(SCRIPT, PROMPT_DATA=ROUND_DATA, DYNAMIC_FILTERING="0")
    args = openrlhf_args(flags, monkeypatch)
    assert not args.algo.dynamic_filtering_enable and args.algo.advantage.estimator == "group_norm"


def test_the_r2ag_config_is_a_one_step_multi_query_config_with_the_top_survivor_reward():
    """Needs the ``multi_query`` step format, ``policy.format_options`` and the ``top_survivor`` scheme."""
    config = load_recipe(CONFIG).rollout_config()
    env, reward, policy = config.env, config.reward, config.policy
    assert (env.max_steps, env.topk, env.doc_chars, env.format_retries, env.max_step_tokens) == (1, 1, 512, 0, 4096)
    assert (reward.scheme, reward.placement) == ("top_survivor", "scalar")
    assert reward.options == {
        "alpha": 0.2,
        "beta": 0.3,
        "gamma": 0.2,
        "omega": 1.0,
        "predicted_weight": 1.25,
        "format_bonus": 0.01,
        "format_cap": 0.02,
        "survivors_base": 4,
        "survivors_predicted": 2,
    }
    assert (policy.step_format, policy.format_options) == ("multi_query", {"max_base": 4, "max_predicted": 2})
    assert config.services.episode_retries == 1
    step_format = get_format(policy.step_format, **policy.format_options)
    assert (step_format.max_base, step_format.max_predicted) == (4, 2)
    scheme = get_scheme(reward.scheme, **reward.options)
    assert scheme.needs_gold and not scheme.needs_correctness and not scheme.needs_training_step


def test_the_agent_reads_the_config_and_overrides_the_script_exports(monkeypatch):
    _, variables = launch_flags(SCRIPT, PROMPT_DATA=ROUND_DATA, RETRIEVER_URL="http://retriever:8000")
    monkeypatch.setenv("R3RAG_AGENT_CONFIG", variables["R3RAG_AGENT_CONFIG"])
    monkeypatch.setenv("R3RAG_AGENT_OVERRIDES", json.dumps(agent_overrides(variables)))
    config = agent_config_from_environment()
    assert (config.reward.scheme, config.reward.placement, config.env.max_steps) == ("top_survivor", "scalar", 1)
    assert config.services.retriever_url == "http://retriever:8000"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"ROUND": "0"}, "ROUND"),
        ({"ROUND": "x"}, "ROUND"),
        ({"ROUND": "-1"}, "ROUND"),
        ({"STEPS": "0"}, "STEPS"),
        ({"STEPS": "many"}, "STEPS"),
        ({"EPISODES": "0"}, "EPISODES"),
        ({"ROLLOUT_BATCH": "0"}, "ROLLOUT_BATCH"),
        ({"ACTOR_LR": "fast"}, "ACTOR_LR"),
        ({"DYNAMIC_FILTERING_RANGE": "0"}, "DYNAMIC_FILTERING_RANGE"),
        ({"DYNAMIC_FILTERING_RANGE": "low high"}, "DYNAMIC_FILTERING_RANGE"),
        ({"DYNAMIC_FILTERING_RANGE": "1 0"}, "DYNAMIC_FILTERING_RANGE"),
        ({"RECIPE": "/nonexistent.yaml"}, "RECIPE"),
    ],
)
def test_bad_variables_exit_2_naming_the_variable(env, named):
    result = subprocess.run(
        ["bash", str(ROOT / "launch" / SCRIPT), "--dry-run"],
        env={**os.environ, "PYTHON": sys.executable, "PROMPT_DATA": ROUND_DATA, **env},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and named in result.stderr, result.stderr
    assert not result.stdout


def test_the_rounds_prompts_are_required():
    env = {key: value for key, value in os.environ.items() if key != "PROMPT_DATA"}
    result = subprocess.run(
        ["bash", str(ROOT / "launch" / SCRIPT), "--dry-run"],
        env={**env, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "PROMPT_DATA" in result.stderr, result.stderr
    assert not result.stdout
