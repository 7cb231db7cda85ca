"""Slow: evaluation through vLLM's CPU build, both ways a user runs it.

- ``--engine.kind vllm``: the offline async engine, in .venv-vllm (``bash scripts/setup_vllm.sh``,
  part of the README's test command), against a retrieval service from this env on a real port;
- ``--engine.kind openai``: ``r3rag eval run`` from this env against vLLM's OpenAI-compatible
  server (how an official R3-RAG checkpoint is evaluated).

The tiny model's weights are random, so its steps do not parse: what is checked is that every
question is run, recorded and counted through each engine.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml
from conftest import CHATML_TEMPLATE, ROOT, ServiceProcess, make_tokenizer, run_r3rag, save_tiny_causal_lm

from demo.services import VLLMServer, vllm_cpu_env
from r3_env.data import iter_jsonl
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index
from r3_env.world.build import WorldConfig, generate_world

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


@pytest.fixture(scope="module")
def setup(tmp_path_factory, bpe_backend):
    if not VLLM_PYTHON.exists():
        pytest.skip("no .venv-vllm: run `bash scripts/setup_vllm.sh` (vLLM's CPU build, about 100 s, 3.7 GB)")
    root = tmp_path_factory.mktemp("eval-vllm")
    generate_world(WorldConfig(entities=120, seed=4, bm25_check=0), root / "world")
    index = build_index(IndexBuildConfig(corpus_path=str(root / "world" / "corpus.jsonl"), save_dir=str(root / "idx")))
    (root / "retriever.yaml").write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    model = save_tiny_causal_lm(root / "policy", make_tokenizer(bpe_backend, CHATML_TEMPLATE), heads=2, head_dim=64,
                                kv_heads=1)  # fmt: skip
    return root, model


def _check_rows(out, questions: int) -> None:
    rows = [row for _, row in iter_jsonl(out / "predictions.jsonl")]
    assert len(rows) == questions and len({row["id"] for row in rows}) == questions
    for row in rows:
        assert row["usage"]["requests"] >= 1 and row["usage"]["completion_tokens"] >= 1
        assert row["num_steps"] >= 1 and (row["answer"] is not None or "invalid" in row or row["num_retrievals"] == 3)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_offline_vllm_engine(setup):
    root, model = setup
    with ServiceProcess(["retriever", "serve", "--config", str(root / "retriever.yaml")]) as retriever:
        result = subprocess.run(
            [str(VLLM_PYTHON), str(ROOT / "tests" / "vllm_eval_check.py"), str(root / "world" / "dev.jsonl"),
             str(root / "vllm-run"), str(model), retriever.url],
            capture_output=True, text=True, timeout=840, env={**os.environ, **vllm_cpu_env(), "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "4 questions" in result.stdout
    _check_rows(root / "vllm-run", 4)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_seeded_sampling_survives_chunked_prefill_on_cpu(setup):
    """Sampled evaluation (rft's, best-of-n's) with a seed: long concurrent prompts are prefilled in chunks."""
    _, model = setup
    result = subprocess.run(
        [str(VLLM_PYTHON), str(ROOT / "tests" / "vllm_sampling_check.py"), str(model)],
        capture_output=True, text=True, timeout=540, env={**os.environ, **vllm_cpu_env(), "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    lines = result.stdout.strip().splitlines()[-8:]
    assert len(lines) == 8 and all(int(line.split()[0]) > 1000 and int(line.split()[1]) >= 1 for line in lines)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_openai_engine_against_vllms_server(setup):
    root, model = setup
    with VLLMServer(str(VLLM_PYTHON), str(model)) as server:
        result = run_r3rag(
            "eval", "run", "--data", str(root / "world" / "dev.jsonl"), "--out", str(root / "openai-run"),
            "--max_questions", "4", "--engine.kind", "openai", "--engine.base_url", server.base_url,
            "--engine.model", str(model), "--env.max_steps", "3", "--env.max_step_tokens", "48",
            "--retrieval.config", str(root / "retriever.yaml"),
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    _check_rows(root / "openai-run", 4)
    assert json_field(root / "openai-run" / "run.json", "chat_template") == "server"


def json_field(path, key):
    import json

    return json.loads(path.read_text())[key]
