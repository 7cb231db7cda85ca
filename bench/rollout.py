"""Rollout throughput: concurrent multi-turn episodes against the official sampler's design, and env overhead.

    .venv/bin/python bench/rollout.py [--engine hf|vllm] [--questions 32] [--entities 400] [--max-batch 32]

Both designs use the same engine over a tiny random Qwen2, the same retrieval service (BM25 over
a synthetic world) and the same reward server (lexical judge), each its own process here:

- concurrent (r3rag): every question in flight at once; the engine batches generation across
  episodes, retrieval and judge calls are coalesced across episodes;
- sequential (the official R3-RAG sampler's design): one question at a time, its steps one after
  another, one retrieval and one judge call per step.

Engines:

- ``hf``: r3_env.engines.HFEngine (batched ``model.generate``). The model's token choices are
  forced to each question's gold decomposition (constrained decoding; every forward pass is real),
  so episodes have the real shape: one query per hop, then the answer. HF generate recomputes the
  whole context at every step (no prefix cache), so on CPU long contexts make it prefill-bound.
- ``vllm``: vLLM's CPU build (``.venv-vllm``, scripts/setup_vllm.sh), the engine training uses:
  ``AsyncLLMEngine`` with prefix caching. Its sampling is constrained by a regex to well-formed
  query steps (real sampling inside it), so every episode retrieves until ``max_steps``.

Targets: concurrent >= 4x the sequential trajectories/s at 32 questions; environment time
(parse, retrieve, render, tokenize, judge and reward bookkeeping, generation excluded) under 5%
of rollout wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import (  # noqa: E402
    CHATML_TEMPLATE,
    Script,
    ServiceProcess,
    answer_step,
    make_tokenizer,
    query_step,
    query_step_pattern,
    save_tiny_causal_lm,
    train_bpe,
)

from r3_env.engines import HFEngine, SamplingParams  # noqa: E402
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index  # noqa: E402
from r3_env.rollout import run_episode  # noqa: E402
from r3_env.rollout_config import RolloutConfig  # noqa: E402
from r3_env.rollout_context import RolloutContext  # noqa: E402
from r3_env.world.build import WorldConfig, generate_world  # noqa: E402


def plans(rows: list[dict]) -> dict[str, list[str]]:
    steps = {}
    for row in rows:
        hops = row["metadata"]["question_decomposition"]
        queries = [query_step(f"I need to know: {h['question']}", h["question"]) for h in hops]
        steps[row["question"]] = [*queries, answer_step("The documents answer it.", row["golden_answers"][0])]
    return steps


QUERY_STEP = query_step_pattern(analysis_words=7, query_words=4)


class VLLMEngine:
    """OpenRLHF's ``generate(token_ids, sampling_params)`` contract over vLLM's AsyncLLMEngine (as its actor has)."""

    def __init__(self, llm) -> None:
        self.llm = llm

    async def generate(self, prompt_token_ids, sampling_params, **_):
        from vllm.inputs import TokensPrompt
        from vllm.utils import random_uuid

        final = None
        async for output in self.llm.generate(
            TokensPrompt(prompt_token_ids=list(prompt_token_ids)), sampling_params, request_id=random_uuid()
        ):
            final = output
        return final


async def rollouts(config: RolloutConfig, tokenizer, engine_factory, rows, concurrent: bool) -> dict:
    context = RolloutContext(config, tokenizer)
    engine, params = engine_factory()

    async def one(row):
        return await run_episode(context, engine, row["question"], json.dumps(row), params, 4096)

    started = time.perf_counter()
    if concurrent:
        results = await asyncio.gather(*(one(row) for row in rows))
    else:
        results = [await one(row) for row in rows]
    wall = time.perf_counter() - started
    await context.aclose()
    stats = context.stats
    return {
        "wall_s": wall,
        "trajectories_per_s": len(rows) / wall,
        "steps": sum(len(r.action_ranges) for r in results),
        "correct": sum(r.outcome == "correct" for r in results),
        "environment_share": stats.environment_share,
        "environment_s_per_episode": stats.environment_s / stats.episodes,
        "mean_retrieval_batch": context.search_batcher.mean_batch,
        "mean_relevance_batch": context.relevance_batcher.mean_batch,
    }


def hf_designs(spec: dict) -> tuple[dict, dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"])
    rows, script = spec["rows"], Script(tokenizer, plans(spec["rows"]))

    def factory(max_batch: int):
        return lambda: (HFEngine(model, tokenizer, max_batch=max_batch, script=script), SamplingParams())

    return run_designs(spec, tokenizer, factory(1), factory(spec["max_batch"]), rows)


def vllm_designs(spec: dict) -> tuple[dict, dict]:
    import vllm
    from transformers import AutoTokenizer
    from vllm.sampling_params import StructuredOutputsParams

    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    args = vllm.AsyncEngineArgs(
        model=spec["model"], enforce_eager=True, dtype="float32", max_model_len=4096, enable_prefix_caching=True
    )
    llm = vllm.AsyncLLMEngine.from_engine_args(args)
    params = vllm.SamplingParams(temperature=1.0, structured_outputs=StructuredOutputsParams(regex=QUERY_STEP))
    engine = lambda: (VLLMEngine(llm), params)
    try:
        return run_designs(spec, tokenizer, engine, engine, spec["rows"])
    finally:
        llm.shutdown()


def run_designs(spec: dict, tokenizer, sequential_engine, concurrent_engine, rows) -> tuple[dict, dict]:
    env = yaml.safe_load((ROOT / "launch" / "configs" / "r3.yaml").read_text())["env"]  # R3-RAG's RL settings
    services = spec["services"]
    concurrent_config = RolloutConfig.from_dict({"env": env, "services": services})
    sequential_config = RolloutConfig.from_dict({"env": env, "services": {**services, "batch_wait_ms": 0}})

    async def both():  # one event loop: vLLM's engine belongs to the loop that made it
        await rollouts(concurrent_config, tokenizer, concurrent_engine, rows[:4], True)  # warm-up
        sequential = await rollouts(sequential_config, tokenizer, sequential_engine, rows, False)
        concurrent = await rollouts(concurrent_config, tokenizer, concurrent_engine, rows, True)
        return sequential, concurrent

    return asyncio.run(both())


def show(engine: str, rows: int, sequential: dict, concurrent: dict) -> None:
    print(
        f"engine {engine}: {rows} questions, {concurrent['steps']} steps ({concurrent['correct']} answered correctly)"
    )
    print(f"{'':28}{'sequential (official)':>24}{'concurrent (r3rag)':>22}")
    for key, fmt in (
        ("wall_s", "{:.2f}"),
        ("trajectories_per_s", "{:.2f}"),
        ("environment_share", "{:.1%}"),
        ("environment_s_per_episode", "{:.3f}"),
        ("mean_retrieval_batch", "{:.1f}"),
        ("mean_relevance_batch", "{:.1f}"),
    ):
        print(f"{key:28}{fmt.format(sequential[key]):>24}{fmt.format(concurrent[key]):>22}")
    ratio = concurrent["trajectories_per_s"] / sequential["trajectories_per_s"]
    print(f"concurrent / sequential trajectories/s: {ratio:.1f}x (target >= 4x)")
    print(f"environment share of rollout wall time (concurrent): {concurrent['environment_share']:.1%} (target < 5%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--entities", type=int, default=400)
    parser.add_argument("--max-batch", type=int, default=32, help="hf: requests per generate batch")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # run the designs from this spec (in .venv-vllm)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.child:
        spec = json.loads(Path(args.child).read_text())
        sequential, concurrent = vllm_designs(spec)
        Path(spec["out"]).write_text(json.dumps([sequential, concurrent]))
        return

    work = Path(tempfile.mkdtemp(prefix="r3rag-bench-rollout-"))
    generate_world(WorldConfig(entities=args.entities, seed=7, bm25_check=0), work / "world")
    rows = [json.loads(line) for line in (work / "world" / "dev.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["metadata"]["hops"] >= 2][: args.questions]
    index = build_index(IndexBuildConfig(corpus_path=str(work / "world" / "corpus.jsonl"), save_dir=str(work / "idx")))
    (work / "retriever.yaml").write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    (work / "reward.yaml").write_text(yaml.safe_dump({"judge": {"backend": "lexical"}}))
    tokenizer = make_tokenizer(train_bpe(), CHATML_TEMPLATE)
    head = {"heads": 2, "head_dim": 64, "kv_heads": 1} if args.engine == "vllm" else {}  # vLLM CPU: head size 64
    model = save_tiny_causal_lm(work / "policy", tokenizer, **head)

    with (
        ServiceProcess(["retriever", "serve", "--config", str(work / "retriever.yaml")]) as retriever,
        ServiceProcess(["reward", "serve", "--config", str(work / "reward.yaml")]) as reward,
    ):
        spec = {
            "model": str(model),
            "rows": rows,
            "max_batch": args.max_batch,
            "services": {"retriever_url": retriever.url, "reward_url": reward.url},
            "out": str(work / "figures.json"),
        }
        if args.engine == "hf":
            sequential, concurrent = hf_designs(spec)
        else:
            python = ROOT / ".venv-vllm" / "bin" / "python"
            if not python.exists():
                raise SystemExit("--engine vllm needs .venv-vllm: run `bash scripts/setup_vllm.sh`")
            (work / "spec.json").write_text(json.dumps(spec))
            env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
            env.update(VLLM_CPU_NUM_OF_RESERVED_CPU="0", VLLM_CPU_KVCACHE_SPACE="2")
            subprocess.run([str(python), __file__, "--child", str(work / "spec.json")], check=True, env=env)
            sequential, concurrent = json.loads((work / "figures.json").read_text())
    show(args.engine, len(rows), sequential, concurrent)


if __name__ == "__main__":
    main()
