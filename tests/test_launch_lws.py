"""launch/dapo_lws.sh: "Learning when to search" with DAPO, its flags through OpenRLHF's own parser.

The script is launch/ppo_r3.sh with ALGO=dapo and the paper's settings (docs/recipes/lws.md#training); the
stage schedule (SWITCH_STEP, BETA) reaches the agent through $R3RAG_AGENT_OVERRIDES.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT
from test_openrlhf_plugin import launch_flags, openrlhf_args

from r3_env.config import load_yaml
from r3_env.protocol import get_format
from r3_env.recipes import agent_config_from_environment, load_recipe
from r3_env.rewards import get_scheme

SCRIPT = "dapo_lws.sh"
CONFIG = ROOT / "recipes" / "lws.yaml"


def agent_overrides(variables: dict[str, str]) -> dict:
    """The JSON object of dotted keys the script exports as $R3RAG_AGENT_OVERRIDES (printed shell-quoted)."""
    (value,) = shlex.split(variables["R3RAG_AGENT_OVERRIDES"])
    return json.loads(value)


def test_dapo_lws_resolves_to_the_papers_settings_in_openrlhfs_parser(monkeypatch):
    flags, variables = launch_flags(SCRIPT)
    args = openrlhf_args(flags, monkeypatch)
    # DAPO: group-normalised advantages without a critic, clip-higher, dynamic sampling on accuracy
    assert args.algo.advantage.estimator == "group_norm"
    assert args.critic.model_name_or_path is None and not any(flag.startswith("--critic.") for flag in flags)
    assert list(args.actor.eps_clip_low_high) == [0.2, 0.28]
    assert args.algo.dynamic_filtering_enable and list(args.algo.dynamic_filtering_range) == [0, 1]
    assert args.actor.loss_agg_mode == "token-mean"
    assert args.algo.kl.use_loss and args.algo.kl.init_coef == 1e-4  # the paper's kl_loss_coef
    # docs/recipes/lws.md#training: 32 rollouts per prompt, batch 32, temperature and top-p 1.0, lr 1e-6, 500 steps
    assert (args.rollout.n_samples_per_prompt, args.rollout.batch_size) == (32, 32)
    assert (args.rollout.temperature, args.rollout.top_p, args.actor.adam.lr) == (1.0, 1.0, 1e-6)
    assert (args.data.max_samples, args.train.num_episodes) == (500 * 32, 1)
    assert args.data.max_len == 2048 + 4096
    assert args.train.agent_func_path.endswith("r3_env/openrlhf/agent.py")
    assert args.reward.remote_url == ["agent"]
    assert args.ckpt.output_dir == "checkpoints/lws-dapo" and args.ckpt.load_enable
    assert variables["R3RAG_AGENT_CONFIG"] == str(CONFIG)
    overrides = agent_overrides(variables)
    assert overrides["reward.placement"] == "scalar"  # a group baseline takes episode totals
    assert overrides["reward.episodes_per_step"] == 32 * 32 // 8  # per vLLM engine, 8 by default
    assert overrides["reward.start_step"] == 0
    assert "reward.options" not in overrides  # the config's schedule


@pytest.mark.parametrize(
    ("env", "options", "episodes_per_step"),
    [
        ({"SWITCH_STEP": "250", "BETA": "0.5"}, {"switch_step": 250, "beta": 0.5}, 128),
        ({"SWITCH_STEP": "0", "VLLM_ENGINES": "4", "ACTOR_GPUS_PER_NODE": "4"}, {"switch_step": 0, "beta": 0.3}, 256),
        (
            {
                "BETA": "1e-1",
                "ROLLOUT_BATCH": "18",
                "SAMPLES_PER_PROMPT": "8",
                "VLLM_ENGINES": "3",
                "ACTOR_GPUS_PER_NODE": "3",
            },
            {"beta": 0.1},
            48,
        ),
    ],
)
def test_the_stage_schedule_reaches_the_agent_with_the_config_options_kept(env, options, episodes_per_step):
    _, variables = launch_flags(SCRIPT, **env)
    overrides = agent_overrides(variables)
    expected = {**load_yaml(CONFIG)["reward"]["options"], **options}
    assert overrides["reward.options"] == expected  # an override replaces reward.options whole
    assert overrides["reward.episodes_per_step"] == episodes_per_step  # ceil(batch * samples / engines)


def test_the_agent_reads_the_schedule_and_clock_the_script_exports(monkeypatch):
    env = {"SWITCH_STEP": "250", "BETA": "0.5", "START_STEP": "120", "QUERY_ENCODER": "/models/qwen3-embedding"}
    _, variables = launch_flags(SCRIPT, **env)
    monkeypatch.setenv("R3RAG_AGENT_CONFIG", variables["R3RAG_AGENT_CONFIG"])
    monkeypatch.setenv("R3RAG_AGENT_OVERRIDES", json.dumps(agent_overrides(variables)))
    reward = agent_config_from_environment().reward
    assert (reward.options["switch_step"], reward.options["beta"], reward.options["diversity"]) == (250, 0.5, True)
    assert (reward.episodes_per_step, reward.start_step) == (128, 120)
    assert (reward.query_encoder, reward.placement) == ("/models/qwen3-embedding", "scalar")


def test_kl_and_dynamic_filtering_can_be_turned_off(monkeypatch):
    flags, _ = launch_flags(SCRIPT, KL_COEF="0", DYNAMIC_FILTERING="0")
    args = openrlhf_args(flags, monkeypatch)
    assert args.algo.kl.init_coef == 0  # DAPO proper: OpenRLHF builds no reference model
    assert not args.algo.dynamic_filtering_enable
    assert args.algo.advantage.estimator == "group_norm"


def test_the_lws_config_is_a_rollout_config_of_the_tags_format_and_the_lws_scheme():
    """Needs the ``tags`` step format and the ``lws`` reward scheme in r3_env."""
    config = load_recipe(CONFIG).rollout_config()
    assert (config.policy.step_format, config.reward.scheme, config.reward.placement) == ("tags", "lws", "scalar")
    assert config.env.max_steps == 5 and config.reward.options["beta"] == 0.3
    assert config.reward.query_encoder
    get_format(config.policy.step_format)
    scheme = get_scheme(config.reward.scheme, **config.reward.options)
    assert scheme.needs_training_step and scheme.needs_query_similarity


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SWITCH_STEP": "abc"}, "SWITCH_STEP"),
        ({"SWITCH_STEP": "1.5"}, "SWITCH_STEP"),
        ({"SWITCH_STEP": "-10"}, "SWITCH_STEP"),
        ({"BETA": "-0.3"}, "BETA"),
        ({"BETA": "high"}, "BETA"),
        ({"STEPS": "0"}, "STEPS"),
        ({"KL_COEF": "none"}, "KL_COEF"),
        ({"ACTOR_LR": "fast"}, "ACTOR_LR"),
        ({"DYNAMIC_FILTERING": "yes"}, "DYNAMIC_FILTERING"),
        ({"VLLM_ENGINES": "0"}, "VLLM_ENGINES"),
        ({"REWARD_OPTIONS": "[1]"}, "REWARD_OPTIONS"),
        ({"REWARD_OPTIONS": '{"diversity": false}', "SWITCH_STEP": "10"}, "REWARD_OPTIONS"),
        ({"PLACEMENT": "step"}, "PLACEMENT"),
        ({"RECIPE": "/nonexistent.yaml"}, "RECIPE"),
        ({"RECIPE": "frugal"}, "RECIPE"),
        (
            {"ROLLOUT_BATCH": "32", "VLLM_ENGINES": "3", "ACTOR_GPUS_PER_NODE": "3"},
            "ROLLOUT_BATCH (32) must divide by VLLM_ENGINES (3)",
        ),
    ],
)
def test_bad_variables_exit_2_naming_the_variable(env, named):
    result = subprocess.run(
        ["bash", str(ROOT / "launch" / SCRIPT), "--dry-run"],
        env={**os.environ, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and named in result.stderr, result.stderr
    assert not result.stdout


def test_a_switch_after_the_last_step_is_warned_about():
    result = subprocess.run(
        ["bash", str(ROOT / "launch" / SCRIPT), "--dry-run"],
        env={**os.environ, "PYTHON": sys.executable, "SWITCH_STEP": "600"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "SWITCH_STEP=600" in result.stderr and "stage 1" in result.stderr


def test_a_resumed_run_must_say_which_step_its_reward_resumes_at(tmp_path):
    """OpenRLHF resumes from CKPT_DIR by itself; the staged reward's clock does not, so START_STEP is required."""
    (tmp_path / "ckpt" / "_actor" / "global_step120").mkdir(parents=True)
    env = {**os.environ, "PYTHON": sys.executable, "CKPT_DIR": str(tmp_path / "ckpt")}
    script = ["bash", str(ROOT / "launch" / SCRIPT), "--dry-run"]
    refused = subprocess.run(script, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "set START_STEP" in refused.stderr
    resumed = subprocess.run(script, env={**env, "START_STEP": "120"}, capture_output=True, text=True)
    assert resumed.returncode == 0 and '\\"reward.start_step\\":\\ 120' in resumed.stdout, resumed.stdout
