"""Multi-node launch: the GPU layout of launch/ppo_r3.sh through OpenRLHF's parser, and the Ray cluster scripts.

Nothing here starts Ray: each script's --dry-run prints the exact commands it would run.
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


def dry_run(script: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(
        ["bash", str(ROOT / "launch" / script), "--dry-run"],
        env={**clean, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
    )


def layout(args) -> dict:
    return {
        "actor": (args.actor.num_nodes, args.actor.num_gpus_per_node),
        "ref": (args.ref.num_nodes, args.ref.num_gpus_per_node),
        "critic": (args.critic.num_nodes, args.critic.num_gpus_per_node),
        "vllm": (args.vllm.num_engines, args.vllm.tensor_parallel_size),
        "colocate": (args.train.colocate_all, args.train.colocate_actor_ref),
    }


def test_one_node_of_eight_gpus_colocates_everything(monkeypatch):
    flags, _ = launch_flags("ppo_r3.sh")
    args = openrlhf_args(flags, monkeypatch)
    assert layout(args) == {
        "actor": (1, 8),
        "ref": (1, 8),
        "critic": (1, 8),
        "vllm": (8, 1),
        "colocate": (True, False),
    }
    assert args.vllm.enable_sleep and args.ds.enable_sleep and args.vllm.gpu_memory_utilization == 0.5


def test_four_nodes_of_eight_gpus_colocated(monkeypatch):
    flags, _ = launch_flags("ppo_r3.sh", NODES="4", GPUS_PER_NODE="8")
    assert layout(openrlhf_args(flags, monkeypatch)) == {
        "actor": (4, 8),
        "ref": (4, 8),
        "critic": (4, 8),
        "vllm": (32, 1),
        "colocate": (True, False),
    }


def test_four_nodes_of_eight_gpus_split_between_actor_critic_and_vllm(monkeypatch):
    env = {
        "NODES": "4",
        "GPUS_PER_NODE": "8",
        "COLOCATE": "actor_ref",
        "ACTOR_NODES": "2",
        "CRITIC_NODES": "1",
        "VLLM_ENGINES": "4",
        "VLLM_TP": "2",
        "ROLLOUT_BATCH": "128",
    }
    flags, variables = launch_flags("ppo_r3.sh", **env)
    args = openrlhf_args(flags, monkeypatch)
    assert layout(args) == {
        "actor": (2, 8),
        "ref": (2, 8),
        "critic": (1, 8),
        "vllm": (4, 2),
        "colocate": (False, True),
    }
    assert not args.vllm.enable_sleep and args.vllm.gpu_memory_utilization == 0.9
    (overrides,) = shlex.split(variables["R3RAG_AGENT_OVERRIDES"])
    assert json.loads(overrides)["reward.episodes_per_step"] == 128  # 128 prompts x 4 samples / 4 engines


def test_without_a_critic_or_kl_none_colocated_counts_only_actor_and_vllm(monkeypatch):
    env = {"ALGO": "grpo", "KL_COEF": "0", "COLOCATE": "none", "ACTOR_GPUS_PER_NODE": "4", "VLLM_ENGINES": "4"}
    flags, _ = launch_flags("ppo_r3.sh", **env)
    args = openrlhf_args(flags, monkeypatch)
    assert args.critic.model_name_or_path is None and args.algo.kl.init_coef == 0
    assert (args.actor.num_gpus_per_node, args.vllm.num_engines, args.train.colocate_all) == (4, 4, False)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"VLLM_ENGINES": "4"}, "VLLM_ENGINES x VLLM_TP (4 x 1) must equal ACTOR_NODES x ACTOR_GPUS_PER_NODE (8)"),
        ({"COLOCATE": "none"}, "COLOCATE=none needs 32 GPUs (actor 8, ref 8, critic 8, vLLM 8)"),
        ({"COLOCATE": "actor_ref", "NODES": "4", "ACTOR_NODES": "4"}, "needs 96 GPUs (actor 32, ref shared"),
        ({"ACTOR_NODES": "2"}, "ACTOR_NODES x ACTOR_GPUS_PER_NODE (2 x 8) does not fit"),
        ({"CRITIC_GPUS_PER_NODE": "4"}, "set CRITIC_NODES and CRITIC_GPUS_PER_NODE to the actor's (1, 8)"),
        ({"VLLM_TP": "16", "VLLM_ENGINES": "1"}, "VLLM_TP (16) must be at most GPUS_PER_NODE (8)"),
        ({"COLOCATE": "some"}, "COLOCATE must be all, actor_ref or none"),
        ({"NODES": "4", "ROLLOUT_BATCH": "16"}, "raise ROLLOUT_BATCH"),
        ({"ACTOR_GPUS_PER_NODE": "0"}, "ACTOR_GPUS_PER_NODE must be a whole number"),
    ],
)
def test_a_layout_that_does_not_add_up_exits_2_before_anything_runs(env, message):
    result = dry_run("ppo_r3.sh", **env)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not result.stdout


def test_submit_to_checks_here_and_hands_the_set_variables_to_ray_job_submit():
    result = dry_run("ppo_r3.sh", SUBMIT_TO="http://10.0.0.1:8265", NODES="4", POLICY="ckpt/r3-cs")
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout)
    assert words[:6] == ["ray", "job", "submit", "--address", "http://10.0.0.1:8265", "--working-dir"]
    assert words[6] == str(ROOT / "launch" / "..")
    tail = words[words.index("--") + 1 :]
    assert tail[0] == "env" and tail[-2:] == ["bash", "launch/ppo_r3.sh"]
    assert {"POLICY=ckpt/r3-cs", "NODES=4"} <= set(tail[1:-2])
    assert not any(word.startswith(("ACTOR_NODES=", "SAVE_DIR=")) for word in tail)  # defaults resolve there
    # a wrapper's recipe travels with the job; an absolute path inside the repository as the uploaded copy's
    lws = dry_run("dapo_lws.sh", SUBMIT_TO="http://10.0.0.1:8265", NODES="4")
    assert "RECIPE=lws" in shlex.split(lws.stdout), lws.stderr
    lws = dry_run("dapo_lws.sh", SUBMIT_TO="http://10.0.0.1:8265", RECIPE=str(ROOT / "recipes" / "lws.yaml"))
    assert "RECIPE=recipes/lws.yaml" in shlex.split(lws.stdout), lws.stderr
    bad = dry_run("ppo_r3.sh", SUBMIT_TO="http://10.0.0.1:8265", NODES="4", VLLM_ENGINES="3")
    assert bad.returncode == 2 and not bad.stdout  # the layout is checked before submitting


def test_head_and_worker_print_their_ray_start_commands():
    head = dry_run("cluster/ray_head.sh", HEAD_IP="10.0.0.1", NUM_GPUS="8", NUM_CPUS="64", BLOCK="1")
    assert (
        shlex.split(head.stdout)
        == (
            "ray start --head --node-ip-address 10.0.0.1 --port 6379 --dashboard-host 0.0.0.0 "
            "--dashboard-port 8265 --num-gpus 8 --num-cpus 64 --block"
        ).split()
    )
    worker = dry_run("cluster/ray_worker.sh", HEAD_ADDRESS="10.0.0.1:6379", NUM_GPUS="8")
    assert shlex.split(worker.stdout) == "ray start --address 10.0.0.1:6379 --num-gpus 8".split()
    missing = dry_run("cluster/ray_worker.sh", HEAD_ADDRESS="")
    assert missing.returncode == 2 and "HEAD_ADDRESS must be the head's IP:PORT" in missing.stderr
    bad = dry_run("cluster/ray_head.sh", HEAD_IP="10.0.0.1", NUM_GPUS="many")
    assert bad.returncode == 2 and "NUM_GPUS" in bad.stderr


def test_the_sbatch_script_starts_one_ray_step_per_node_then_submits_the_job():
    result = dry_run("cluster/slurm_ray.sbatch", NODELIST="n1 n2 n3 n4", HEAD_IP="10.0.0.1", GPUS_PER_NODE="8")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert shlex.split(lines[0]) == [
        *"srun --overlap --nodes=1 --ntasks=1 -w n1 env BLOCK=1 HEAD_IP=10.0.0.1 RAY_PORT=6379".split(),
        *"DASHBOARD_PORT=8265 NUM_GPUS=8 RAY=ray bash launch/cluster/ray_head.sh &".split(),
    ]
    for line, node in zip(lines[1:4], ("n2", "n3", "n4"), strict=True):
        assert shlex.split(line) == [
            *f"srun --overlap --nodes=1 --ntasks=1 -w {node} env BLOCK=1 HEAD_ADDRESS=10.0.0.1:6379".split(),
            *"NUM_GPUS=8 RAY=ray bash launch/cluster/ray_worker.sh &".split(),
        ]
    assert lines[4] == "# wait until Ray at 10.0.0.1:6379 reports 32 GPUs"
    assert lines[5] == "NODES=4 GPUS_PER_NODE=8 SUBMIT_TO=http://10.0.0.1:8265 bash launch/ppo_r3.sh"
    # the job line it runs resolves, through ppo_r3.sh's own check, to the 4-node layout
    env = {"NODES": "4", "GPUS_PER_NODE": "8"}
    assert dry_run("ppo_r3.sh", **env).returncode == 0
    outside = dry_run("cluster/slurm_ray.sbatch")
    assert outside.returncode == 2 and "no SLURM allocation" in outside.stderr
