"""r3rag's OpenRLHF plugin with OpenRLHF's own classes: loading, execute, samples, per-step rewards, launch.

OpenRLHF's trainer modules import vllm and flash_attn, which cannot install in the main CPU env;
``r3_env.train.openrlhf_cpu`` provides their import surface. Everything else is real:
OpenRLHF's agent loader, its ``SamplesGenerator`` and ``RemoteExperienceMaker`` (subclassed by
the plugin), its argument parser (run on launch/ppo_r3.sh's flags), and a Ray worker running the
plugin's setup hook.
"""

from __future__ import annotations

import asyncio
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import (
    CHATML_TEMPLATE,
    ROOT,
    Script,
    ServiceProcess,
    answer_step,
    make_tokenizer,
    query_step,
    save_tiny_causal_lm,
)

from r3_env.train import openrlhf_cpu

openrlhf_cpu.enable()
STANDINS = str(openrlhf_cpu.STANDINS)

import r3_env.openrlhf as plugin  # noqa: E402
from r3_env.engines import HFEngine, SamplingParams  # noqa: E402
from r3_env.openrlhf import step_rewards  # noqa: E402
from r3_env.openrlhf.step_rewards import SETUP_HOOK  # noqa: E402
from r3_env.openrlhf.train import runtime_env  # noqa: E402
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index  # noqa: E402
from r3_env.world.build import WorldConfig, generate_world  # noqa: E402

step_rewards.install()


class Captured(Exception):
    def __init__(self, args) -> None:
        super().__init__("captured")
        self.namespace = args


def openrlhf_args(flags: list[str], monkeypatch) -> object:
    """The hierarchical args OpenRLHF's train_ppo_ray builds from ``flags`` (its parser and checks, run for real)."""
    import openrlhf.utils
    import ray

    def capture(args):
        raise Captured(args)

    monkeypatch.setattr(openrlhf.utils, "get_strategy", capture)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(sys, "argv", ["train_ppo_ray", *flags])
    with pytest.raises(Captured) as caught:
        runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")
    return caught.value.namespace


def launch_flags(script: str, **env: str) -> tuple[list[str], dict[str, str]]:
    """The OpenRLHF flags and agent variables a launch script resolves (its --dry-run output)."""
    run_env = {**os.environ, "PYTHON": sys.executable, **env}
    output = subprocess.run(
        ["bash", str(ROOT / "launch" / script), "--dry-run"], env=run_env, capture_output=True, text=True, check=True
    ).stdout
    lines = output.strip().splitlines()
    variables = dict(line.split("=", 1) for line in lines[:2])
    command = subprocess.run(["bash", "-c", f"printf '%s\\n' {lines[2]}"], capture_output=True, text=True).stdout
    words = command.strip().splitlines()
    assert words[:3] == [sys.executable, "-m", "r3_env.openrlhf.train"]
    return words[3:], variables


# -- version pin and registration ----------------------------------------------------------------------


def test_unsupported_openrlhf_fails_at_import_with_what_to_install(monkeypatch):
    monkeypatch.setattr(plugin.metadata, "version", lambda name: "0.9.0")
    monkeypatch.delenv(plugin.ALLOW_UNTESTED_ENV, raising=False)
    with pytest.raises(plugin.UnsupportedOpenRLHF, match=r"tested with openrlhf 0\.11\.2, but 0\.9\.0.*pip install"):
        plugin.check_openrlhf_version()
    monkeypatch.setenv(plugin.ALLOW_UNTESTED_ENV, "1")
    assert plugin.check_openrlhf_version() == "0.9.0"


def test_install_registers_the_subclasses_in_openrlhf_modules():
    import openrlhf.trainer.ppo_trainer as ppo_trainer
    import openrlhf.trainer.ppo_trainer_async as ppo_trainer_async
    import openrlhf.trainer.ppo_utils.experience_maker as experience_maker
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    assert step_rewards.installed()
    assert issubclass(ppo_trainer.SamplesGenerator, SamplesGenerator)
    assert ppo_trainer.SamplesGenerator is ppo_trainer_async.SamplesGenerator is step_rewards.StepRewardSamplesGenerator
    assert issubclass(ppo_trainer.RemoteExperienceMaker, RemoteExperienceMaker)
    assert experience_maker.compute_reward is step_rewards.compute_reward_with_steps
    step_rewards.install()  # idempotent
    assert ppo_trainer.SamplesGenerator is step_rewards.StepRewardSamplesGenerator


def test_step_placement_without_the_extension_is_refused(monkeypatch):
    from r3_env.openrlhf.agent import AgentExecutor
    from r3_env.rollout_config import RolloutConfig

    monkeypatch.setattr(step_rewards, "_installed", False)
    with pytest.raises(RuntimeError, match="python -m r3_env.openrlhf.train"):
        AgentExecutor(RolloutConfig())


def test_a_ray_worker_runs_the_setup_hook_and_sees_the_agent_config(monkeypatch):
    import ray

    monkeypatch.setenv("R3RAG_AGENT_OVERRIDES", '{"env.max_steps": 3}')
    env = runtime_env()
    assert env["worker_process_setup_hook"] == SETUP_HOOK
    assert env["env_vars"]["R3RAG_AGENT_OVERRIDES"] == '{"env.max_steps": 3}'
    env["env_vars"]["PYTHONPATH"] = os.pathsep.join([STANDINS, str(ROOT)])

    @ray.remote
    def probe():
        import sys

        from r3_env.openrlhf import step_rewards as remote
        from r3_env.recipes import agent_config_from_environment

        # the hook imported nothing (no DeepSpeed accelerator before Ray assigns a GPU) ...
        untouched = "openrlhf.trainer.ppo_trainer" not in sys.modules
        import openrlhf.trainer.ppo_trainer as trainer  # ... and patches the trainer when it is imported

        patched = trainer.SamplesGenerator is remote.StepRewardSamplesGenerator is not None
        return remote.installed(), untouched, patched, agent_config_from_environment().env.max_steps

    # address local: a cluster of its own, never one a stale /tmp/ray/ray_current_cluster names
    ray.init(address="local", num_cpus=1, runtime_env=env, include_dashboard=False, log_to_driver=False)
    try:
        assert ray.get(probe.remote(), timeout=120) == (True, True, True, 3)
    finally:
        ray.shutdown()


# -- the dense reward placement -------------------------------------------------------------------------


def test_dense_step_rewards_sit_at_each_steps_last_token_in_action_mask_coordinates():
    # sequence: 3 prompt tokens, action [3,6), feedback [6,8), action [8,10)
    mask = torch.zeros(9)
    mask[2:5] = 1
    mask[7:9] = 1
    dense = step_rewards.dense_step_rewards([0.5, 2.0], [(3, 6), (8, 10)], mask)
    assert dense.tolist() == [0, 0, 0, 0, 0.5, 0, 0, 0, 2.0]
    cut = step_rewards.dense_step_rewards([0.5, 2.0], [(3, 6), (8, 12)], mask)  # the last step lost tokens to max_len
    assert cut.sum() == 2.5 and cut[8] == 2.0
    with pytest.raises(ValueError, match="2 step rewards for 1 action ranges"):
        step_rewards.dense_step_rewards([1.0, 2.0], [(3, 6)], mask)


def test_compute_reward_without_step_rewards_is_openrlhfs():
    from openrlhf.models.utils import compute_reward

    kl = torch.rand(2, 6)
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    r = torch.tensor([1.0, -0.5])
    expected = compute_reward(r, 0.1, kl, action_mask=mask, reward_clip_range=(-1, 1))
    assert torch.equal(step_rewards.compute_reward_with_steps(r, 0.1, kl, mask, (-1, 1)), expected)


# -- execute through OpenRLHF's loader, then OpenRLHF's sample and experience classes ---------------------


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin")
    generate_world(WorldConfig(entities=120, seed=5, bm25_check=0), root / "world")
    index = build_index(IndexBuildConfig(corpus_path=str(root / "world" / "corpus.jsonl"), save_dir=str(root / "idx")))
    (root / "retriever.yaml").write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    (root / "reward.yaml").write_text(yaml.safe_dump({"judge": {"backend": "lexical"}}))
    rows = [json.loads(line) for line in (root / "world" / "dev.jsonl").read_text().splitlines()]
    with (
        ServiceProcess(["retriever", "serve", "--config", str(root / "retriever.yaml")]) as retriever,
        ServiceProcess(["reward", "serve", "--config", str(root / "reward.yaml")]) as reward,
    ):
        yield {"retriever": retriever, "reward": reward, "rows": [r for r in rows if r["metadata"]["hops"] == 2]}


@pytest.mark.parametrize("tokenizer_name", ["chatml-bpe", "smollm2"])
def test_execute_as_the_rollout_actor_calls_it_then_per_step_returns_reach_the_tokens(
    services, tokenizer_name, request, tmp_path, monkeypatch
):
    """With a locally trained BPE and with SmolLM2's real tokenizer and chat template (a tiny random model)."""
    from openrlhf.trainer.ppo_trainer import SamplesGenerator  # what the trainer builds: the plugin subclass
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
    from transformers import AutoModelForCausalLM

    if tokenizer_name == "smollm2":
        tokenizer = request.getfixturevalue("smollm2_tokenizer")
    else:
        tokenizer = make_tokenizer(request.getfixturevalue("bpe_backend"), CHATML_TEMPLATE)
    model = AutoModelForCausalLM.from_pretrained(save_tiny_causal_lm(tmp_path / "policy", tokenizer))
    row = services["rows"][0]
    first, second = (d["question"] for d in row["metadata"]["question_decomposition"])
    steps = [query_step("start", first), query_step("next", second), answer_step("done", row["golden_answers"][0])]
    engine = HFEngine(model, tokenizer, script=Script(tokenizer, {row["question"]: steps}))
    overrides = {"services.retriever_url": services["retriever"].url, "services.reward_url": services["reward"].url}
    monkeypatch.setenv("R3RAG_AGENT_OVERRIDES", json.dumps(overrides))
    monkeypatch.delenv("R3RAG_AGENT_CONFIG", raising=False)
    executor = _load_agent_executor(str(ROOT / "r3_env" / "openrlhf" / "agent.py"))  # OpenRLHF's own loader

    async def generate_responses(num_samples: int):  # what RolloutRayActor.generate_responses does
        params = SamplingParams(temperature=1.0, max_tokens=None, logprobs=1)
        return await asyncio.gather(
            *(
                executor.execute(
                    prompt=row["question"],
                    label=json.dumps(row["golden_answers"]),
                    sampling_params=params,
                    max_length=2048,
                    hf_tokenizer=tokenizer,
                    llm_engine=engine,
                    images=None,
                )
                for _ in range(num_samples)
            )
        )

    responses = asyncio.run(generate_responses(2))
    response = responses[0]
    assert len(response["action_ranges"]) == 3 and len(response["step_rewards"]) == 3
    assert response["extra_logs"]["outcome_correct"] == 1.0 and response["scores"] == 1.0
    assert response["reward"] == pytest.approx(sum(response["step_rewards"]))
    assert response["step_rewards"][2] == 2.0
    assert len(response["rollout_log_probs"]) == len(response["observation_tokens"])

    flags, _ = launch_flags("ppo_r3.sh", POLICY=str(tmp_path / "policy"))
    args = openrlhf_args(flags + ["--rollout.n_samples_per_prompt", "2", "--data.max_len", "2048"], monkeypatch)
    strategy = type("Strategy", (), {"args": args})()
    generator = SamplesGenerator(strategy, None, None, tokenizer, [])
    experiences = [generator._process_response_into_experience(r, max_len=2048) for r in responses]
    experience = experiences[0]
    mask = experience.action_mask[0]
    tokens = response["observation_tokens"]
    for start, end in response["action_ranges"]:
        assert mask[start - 1 : end - 1].all()  # action tokens are trained on
    for (_, end), (next_start, _) in zip(response["action_ranges"], response["action_ranges"][1:], strict=False):
        assert not mask[end - 1 : next_start - 1].any()  # document tokens never are
        assert "Retrieved documents" in tokenizer.decode(tokens[end:next_start])
    dense = experience.info[step_rewards.DENSE_KEY][0]
    for (_, end), value in zip(response["action_ranges"], response["step_rewards"], strict=True):
        assert dense[end - 2] == pytest.approx(value)
    assert dense.sum() == pytest.approx(response["reward"])

    # OpenRLHF's experience maker (the plugin's subclass) with GAE, gamma = lambda = 1, zero values and KL:
    # the return at each token is the sum of the step rewards from its step on.
    args.algo.advantage.lambd = 1.0
    from openrlhf.trainer.ppo_trainer import RemoteExperienceMaker  # the plugin's subclass, as the trainer sees it

    maker = RemoteExperienceMaker(None, None, None, None, _FixedKL(0.0), strategy, tokenizer)
    batch = maker.split_rollout_samples(experiences)
    for sample in batch:
        sample.kl = torch.zeros(sample.action_mask.shape)
        sample.values = torch.zeros(sample.action_mask.shape)
    batch = maker.compute_advantages_and_returns(batch)
    returns = batch[0].returns[0]
    remaining = sum(response["step_rewards"])
    for (start, _end), value in zip(response["action_ranges"], response["step_rewards"], strict=True):
        assert returns[start - 1] == pytest.approx(remaining, abs=1e-5)
        remaining -= value
    assert step_rewards.DENSE_KEY not in batch[0].info
    # a group baseline would mix raw step rewards with a normalised total: refused, with the fix
    args.algo.advantage.estimator = "group_norm"
    grouped = maker.split_rollout_samples(
        [generator._process_response_into_experience(r, max_len=2048) for r in responses]
    )
    for sample in grouped:
        sample.kl = torch.zeros(sample.action_mask.shape)
    with pytest.raises(ValueError, match="placement to scalar"):
        maker.compute_advantages_and_returns(grouped)


def test_scalar_placement_leaves_openrlhf_unchanged(services, bpe_backend, tmp_path, monkeypatch):
    from openrlhf.trainer.ppo_trainer import SamplesGenerator

    from r3_env.openrlhf.agent import to_openrlhf
    from r3_env.rollout import RolloutResult

    result = RolloutResult("q", [1, 2, 3, 4, 5], [(1, 3), (4, 5)], None, False, [0.5, 2.0], 1.0, "correct", {}, {})
    assert "step_rewards" not in to_openrlhf(result, "[]", "scalar")
    response = to_openrlhf(result, "[]", "step")
    args = type("A", (), {"algo": type("B", (), {"dynamic_filtering_enable": False})()})()
    generator = SamplesGenerator(type("S", (), {"args": args})(), None, None, None, [])
    scalar = generator._process_response_into_experience(to_openrlhf(result, "[]", "scalar"), max_len=64)
    assert step_rewards.DENSE_KEY not in scalar.info and scalar.rewards.tolist() == [2.5]
    assert generator._process_response_into_experience(response, max_len=64).info[step_rewards.DENSE_KEY].sum() == 2.5


class _FixedKL:
    def __init__(self, value: float) -> None:
        self.value = value


# -- launch scripts parse with OpenRLHF's own parser --------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "env", "estimator", "critic"),
    [
        ("ppo_r3.sh", {}, "gae", True),
        ("grpo_r3.sh", {}, "group_norm", False),
        ("ppo_r3.sh", {"ALGO": "reinforce++"}, "reinforce_baseline", False),
    ],
)
def test_launch_scripts_resolve_to_the_papers_settings_in_openrlhfs_parser(script, env, estimator, critic, monkeypatch):
    flags, variables = launch_flags(script, **env)
    args = openrlhf_args(flags, monkeypatch)
    assert args.algo.advantage.estimator == estimator
    assert (args.critic.model_name_or_path is not None) == critic
    assert args.train.agent_func_path.endswith("r3_env/openrlhf/agent.py")
    assert args.reward.remote_url == ["agent"]
    if estimator == "gae":  # R3-RAG's RL settings (docs/recipes/r3-rag.md#stage-2-rl)
        assert (args.actor.adam.lr, args.critic.adam.lr, args.algo.kl.init_coef) == (5e-7, 9e-6, 0.01)
        assert (args.rollout.batch_size, args.train.batch_size, args.rollout.n_samples_per_prompt) == (64, 64, 4)
        assert (args.train.num_episodes, args.ds.zero_stage, args.ds.param_dtype) == (4, 2, "bf16")
    assert args.ckpt.load_enable and args.ckpt.path  # a rerun resumes from OpenRLHF's own checkpoints
    overrides = json.loads(variables["R3RAG_AGENT_OVERRIDES"].replace("\\", ""))
    assert overrides["reward.placement"] == ("step" if critic else "scalar")  # group baselines take totals
    assert overrides["services.reward_url"].startswith("http://")
    assert args.vllm.enable_prefix_caching
    assert Path(variables["R3RAG_AGENT_CONFIG"]).is_file()


def test_launch_script_rejects_bad_variables():
    for env in (
        {"ALGO": "dpo"},
        {"PLACEMENT": "middle"},
        {"RECIPE": "/nonexistent.yaml"},
        {"PLACEMENT": "step", "ALGO": "grpo"},
    ):
        result = subprocess.run(
            ["bash", str(ROOT / "launch" / "ppo_r3.sh"), "--dry-run"],
            env={**os.environ, "PYTHON": sys.executable, **env},
            capture_output=True,
            text=True,
        )
        assert result.returncode == 2 and next(iter(env)) in result.stderr, result.stderr


def test_runtime_env_leaves_what_the_job_sets_to_the_job(monkeypatch):
    job = {"runtime_env": {"env_vars": {"R3RAG_REWARD_API_KEY": "k", "NCCL_DEBUG": "INFO"}, "working_dir": "."}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    monkeypatch.setenv("R3RAG_REWARD_API_KEY", "k")
    monkeypatch.setenv("R3RAG_AGENT_CONFIG", "r3.yaml")
    env = runtime_env()
    assert env["worker_process_setup_hook"] == SETUP_HOOK
    assert env["env_vars"]["R3RAG_AGENT_CONFIG"] == "r3.yaml"
    assert "R3RAG_REWARD_API_KEY" not in env["env_vars"] and "NCCL_DEBUG" not in env["env_vars"]
    job["runtime_env"]["worker_process_setup_hook"] = "mine.setup"
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    with pytest.raises(RuntimeError, match="r3_env.openrlhf.step_rewards.install"):
        runtime_env()


def test_local_trainer_reads_the_settings_openrlhfs_parser_gives(monkeypatch):
    """Every field the local trainer hands OpenRLHF's experience code equals what OpenRLHF's own parser makes."""
    from r3_env.train.config import PPOConfig
    from r3_env.train.ppo import openrlhf_args as local_args

    ppo = PPOConfig(
        n_samples_per_prompt=4, micro_batch_size=2, gamma=0.99, lambd=0.9, init_kl_coef=0.02, kl_estimator="k3",
        reward_clip=5.0, max_len=2048,
    )  # fmt: skip
    flags, _ = launch_flags("ppo_r3.sh")
    flags += [
        "--algo.advantage.gamma", "0.99", "--algo.advantage.lambd", "0.9", "--rollout.n_samples_per_prompt", "4",
        "--rollout.micro_batch_size", "2", "--algo.kl.init_coef", "0.02", "--algo.kl.estimator", "k3",
        "--reward.clip_range", "-5", "5", "--data.max_len", "2048",
    ]  # fmt: skip
    parsed = openrlhf_args(flags, monkeypatch)

    def compare(ours, theirs, where):
        for name, value in vars(ours).items():
            if hasattr(value, "__dict__"):
                compare(value, getattr(theirs, name), f"{where}.{name}")
            else:
                expected = getattr(theirs, name)
                assert (list(value) if isinstance(value, tuple) else value) == (
                    list(expected) if isinstance(expected, tuple) else expected
                ), f"{where}.{name}"

    compare(local_args(ppo, "step"), parsed, "args")
