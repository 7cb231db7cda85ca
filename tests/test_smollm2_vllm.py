"""Slow: SmolLM2-135M-Instruct served by vLLM's CPU build (OpenAI-compatible server, from .venv-vllm) as the
reward server's judge and as Algorithm 1's few-shot teacher, the way a user without a GPU would run both.

A 135M model is a weak judge and teacher; what is checked is that every request goes through the real
server and comes back parsed or as a flagged fallback, never as an error, and that the few-shot examples
reach the teacher. bench/judge_quality.py and bench/smollm2_teacher.py measure how good they are.
"""

from __future__ import annotations

import json

import httpx
import pytest
import yaml
from conftest import ROOT, ServiceProcess, run_r3rag

from demo.services import VLLMServer
from r3_env.data import iter_jsonl, read_dataset
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index
from r3_env.world.build import WorldConfig, generate_world

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def smollm2_server(smollm2_model, tmp_path_factory):
    if not VLLM_PYTHON.exists():
        pytest.skip("no .venv-vllm: run `bash scripts/setup_vllm.sh` (vLLM's CPU build, about 100 s, 3.7 GB)")
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with VLLMServer(str(VLLM_PYTHON), str(smollm2_model), log=log) as server:
        yield server


def test_smollm2_judges_relevance_and_correctness_through_the_openai_backend(smollm2_server, smollm2_model, tmp_path):
    config = tmp_path / "reward.yaml"
    judge = {"backend": "openai", "base_url": smollm2_server.base_url, "model": str(smollm2_model), "max_tokens": 64}
    config.write_text(yaml.safe_dump({"judge": judge}))
    documents = ["Marta Kell directed the film Silent Harbor in 1998.", "Varholm is a port city."]
    relevance = [
        {"question": "Who directed Silent Harbor?", "analysis": "I need its director.", "query": query,
         "documents": documents}
        for query in ("Silent Harbor director", "Varholm population", "Silent Harbor film")
    ]  # fmt: skip
    question = "Who directed Silent Harbor?"
    correctness = [
        {"question": question, "prediction": "the director Marta Kell", "golden_answers": ["Kell"]},
        {"question": question, "prediction": "Paris", "golden_answers": ["Marta Kell"]},
    ]
    with ServiceProcess(["reward", "serve", "--config", str(config)]) as reward:
        status = httpx.get(reward.url + "/health", timeout=10).json()["judge_status"]
        rows = httpx.post(reward.url + "/relevance", json={"items": relevance}, timeout=300).json()["results"]
        verdicts = httpx.post(reward.url + "/correctness", json={"items": correctness}, timeout=300).json()["results"]
        metrics = httpx.get(reward.url + "/metrics", timeout=10).text
    assert status == {"reachable": True, "model_listed": True, "models": [str(smollm2_model)]}
    assert len(rows) == 3
    for row in rows:  # SmolLM2's reply parsed into a score, or a flagged fallback with its reason: never an error
        assert row["backend"] == f"openai:{smollm2_model}" and 0.0 <= row["score"] <= 1.0
        assert row["fallback"] is False or (row["score"] == 0.0 and row["reason"])
    assert [v["method"] for v in verdicts][1] in ("judge", "fallback")  # "Paris" fails string match: the judge decides
    assert all(isinstance(v["correct"], bool) for v in verdicts)
    calls = [line for line in metrics.splitlines() if line.startswith("r3rag_reward_judge_calls_total")]
    assert calls and sum(float(line.split()[-1]) for line in calls) >= 4  # 3 relevance + at least 1 correctness


def test_smollm2_writes_algorithm_1_trajectories_from_few_shot_examples(smollm2_server, smollm2_model, tmp_path):
    generate_world(WorldConfig(entities=200, seed=3, bm25_check=0), tmp_path / "world")
    index = build_index(IndexBuildConfig(corpus_path=str(tmp_path / "world" / "corpus.jsonl"),
                                         save_dir=str(tmp_path / "idx")))  # fmt: skip
    retriever = tmp_path / "retriever.yaml"
    retriever.write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    train = read_dataset(tmp_path / "world" / "train.jsonl")
    (tmp_path / "examples.jsonl").write_text("".join(json.dumps(i.to_json()) + "\n" for i in train[:4]))
    (tmp_path / "asked.jsonl").write_text("".join(json.dumps(i.to_json()) + "\n" for i in train[10:14]))
    common = ["--retrieval.config", str(retriever), "--samples", "1", "--env.max_step_tokens", "96"]
    scripted = run_r3rag("coldstart", "synth", "--data", str(tmp_path / "examples.jsonl"), "--out",
                         str(tmp_path / "scripted"), *common)  # fmt: skip
    assert scripted.returncode == 0, scripted.stderr[-3000:]
    examples = tmp_path / "scripted" / "trajectories.jsonl"
    teacher = ["--teacher.kind", "openai", "--teacher.base_url", smollm2_server.base_url, "--teacher.model",
               str(smollm2_model), "--teacher.max_tokens", "96", "--teacher.api_key_env", "NO_KEY_NEEDED"]  # fmt: skip
    runs = {}
    for name, shots in (("zero_shot", []), ("two_shot", ["--teacher.few_shot", str(examples)])):
        done = run_r3rag("coldstart", "synth", "--data", str(tmp_path / "asked.jsonl"), "--out", str(tmp_path / name),
                         *common, *teacher, *shots, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = [row for _, row in iter_jsonl(tmp_path / name / "samples.jsonl")]
    for rows in runs.values():
        assert len(rows) == 4 and all(row["teacher"] == str(smollm2_model) for row in rows)
        assert all(row["outcome"] in ("correct", "wrong", "no_answer", "format_error") for row in rows)
    # every request of the few-shot run carried the example conversations: far more prompt tokens per request
    per_request = {name: sum(r["usage"]["prompt_tokens"] for r in rows) / sum(r["usage"]["requests"] for r in rows)
                   for name, rows in runs.items()}  # fmt: skip
    assert per_request["two_shot"] > per_request["zero_shot"] + 300, per_request
    manifest = json.loads((tmp_path / "two_shot" / "synth.json").read_text())
    assert manifest["teacher"]["few_shot"] == str(examples) and manifest["teacher"]["few_shot_count"] == 2
