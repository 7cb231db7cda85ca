"""Slow: one multi-turn rollout batch through OpenRLHF's own vLLM rollout actor (vLLM's CPU build).

vLLM cannot share the main env (see r3_env/train/openrlhf_cpu.py), so the rollout side runs in
.venv-vllm (``bash scripts/setup_vllm.sh``, part of the README's test command) while the
retrieval service and the reward server run from this env on real ports.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from conftest import CHATML_TEMPLATE, ROOT, ServiceProcess, make_tokenizer, query_step_pattern, save_tiny_causal_lm

from r3_env.openrlhf.step_rewards import SETUP_HOOK
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index
from r3_env.world.build import WorldConfig, generate_world

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
# Well-formed query steps only: every episode retrieves until max_steps (the random model never answers).
QUERY_STEP = query_step_pattern(analysis_words=4, query_words=3)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_multi_turn_rollout_batch_through_openrlhfs_vllm_actor(bpe_backend, tmp_path):
    if not VLLM_PYTHON.exists():
        pytest.skip("no .venv-vllm: run `bash scripts/setup_vllm.sh` (vLLM's CPU build, about 100 s, 3.7 GB)")
    generate_world(WorldConfig(entities=120, seed=9, bm25_check=0), tmp_path / "world")
    index = build_index(
        IndexBuildConfig(corpus_path=str(tmp_path / "world" / "corpus.jsonl"), save_dir=str(tmp_path / "idx"))
    )
    (tmp_path / "retriever.yaml").write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    (tmp_path / "reward.yaml").write_text(yaml.safe_dump({"judge": {"backend": "lexical"}}))
    rows = [json.loads(line) for line in (tmp_path / "world" / "dev.jsonl").read_text().splitlines()][:3]
    tokenizer = make_tokenizer(bpe_backend, CHATML_TEMPLATE)
    model = save_tiny_causal_lm(tmp_path / "policy", tokenizer, heads=2, head_dim=64, kv_heads=1)
    with (
        ServiceProcess(["retriever", "serve", "--config", str(tmp_path / "retriever.yaml")]) as retriever,
        ServiceProcess(["reward", "serve", "--config", str(tmp_path / "reward.yaml")]) as reward,
    ):
        spec = {
            "model": str(model),
            "agent": str(ROOT / "r3_env" / "openrlhf" / "agent.py"),
            "setup_hook": SETUP_HOOK,
            "overrides": {
                "services.retriever_url": retriever.url,
                "services.reward_url": reward.url,
                "env.max_steps": 3,
                "env.max_step_tokens": 64,
            },
            "regex": QUERY_STEP,
            "rows": rows,
            "samples": 2,
            "max_length": 4096,
        }
        (tmp_path / "spec.json").write_text(json.dumps(spec))
        result = subprocess.run(
            [
                str(VLLM_PYTHON),
                str(ROOT / "tests" / "vllm_rollout_check.py"),
                str(tmp_path / "spec.json"),
                str(tmp_path / "out.json"),
            ],
            capture_output=True,
            text=True,
            timeout=840,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    out = json.loads((tmp_path / "out.json").read_text())
    responses = out["responses"]
    assert len(responses) == 6
    for response in responses:
        assert len(response["action_ranges"]) == 3  # three query steps, then max_steps: no answer
        assert response["extra_logs"]["outcome_no_answer"] == 1.0
        assert len(response["step_rewards"]) == 3 and response["reward"] == pytest.approx(sum(response["step_rewards"]))
        assert all(0.0 <= r <= 0.9 for r in response["step_rewards"])  # relevance x (1 - 0.1)
        assert all(action.startswith("The problem analysis:") for action in response["actions"])
        assert all("Retrieved documents for step" in feedback for feedback in response["feedback"])
        assert response["logprobs"] == response["tokens"]
