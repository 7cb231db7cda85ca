"""Rollout throughput: concurrent multi-turn episodes against the official sampler's design, and env overhead.

    .venv/bin/python bench/rollout.py [--questions 32] [--entities 400] [--max-batch 32]

Both designs use the same engine (r3_env.hf_engine.HFEngine over a tiny random Qwen2), the same
retrieval service (BM25 over a synthetic world) and the same reward server (lexical judge), each
its own process on this machine:

- concurrent (r3rag): every question in flight at once; the engine batches generation across
  episodes, retrieval and judge calls are coalesced across episodes;
- sequential (the official R3-RAG sampler's design): one question at a time, its steps one after
  another, one retrieval and one judge call per step.

The tiny model's token choices are forced to each question's gold decomposition (constrained
decoding; every forward pass is real), so episodes have the real multi-step shape: one query per
hop, then the answer. Targets: concurrent >= 4x the sequential trajectories/s at 32 questions;
environment time (parse, retrieve, render, tokenize, judge and reward bookkeeping, generation
excluded) under 5% of rollout wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
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
    save_tiny_causal_lm,
    train_bpe,
)

from r3_env.hf_engine import HFEngine, SamplingParams  # noqa: E402
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index  # noqa: E402
from r3_env.rollout import RolloutConfig, RolloutContext, run_episode  # noqa: E402
from r3_env.world.build import WorldConfig, generate_world  # noqa: E402


def plans(rows: list[dict]) -> dict[str, list[str]]:
    steps = {}
    for row in rows:
        hops = row["metadata"]["question_decomposition"]
        queries = [query_step(f"I need to know: {h['question']}", h["question"]) for h in hops]
        steps[row["question"]] = [*queries, answer_step("The documents answer it.", row["golden_answers"][0])]
    return steps


async def rollouts(config: RolloutConfig, tokenizer, model, rows, max_batch: int, concurrent: bool) -> dict:
    context = RolloutContext(config, tokenizer)
    engine = HFEngine(model, tokenizer, max_batch=max_batch, script=Script(tokenizer, plans(rows)))
    params = SamplingParams(temperature=1.0, max_tokens=None)

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
        "generate_batches": engine.batches,
        "mean_generate_batch": engine.requests / max(1, engine.batches),
        "mean_retrieval_batch": context.search_batcher.mean_batch,
        "mean_relevance_batch": context.relevance_batcher.mean_batch,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--entities", type=int, default=400)
    parser.add_argument("--max-batch", type=int, default=32)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from transformers import AutoModelForCausalLM

    work = Path(tempfile.mkdtemp(prefix="r3rag-bench-rollout-"))
    generate_world(WorldConfig(entities=args.entities, seed=7, bm25_check=0), work / "world")
    rows = [json.loads(line) for line in (work / "world" / "dev.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["metadata"]["hops"] >= 2][: args.questions]
    index = build_index(IndexBuildConfig(corpus_path=str(work / "world" / "corpus.jsonl"), save_dir=str(work / "idx")))
    (work / "retriever.yaml").write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    (work / "reward.yaml").write_text(yaml.safe_dump({"judge": {"backend": "lexical"}}))
    tokenizer = make_tokenizer(train_bpe(), CHATML_TEMPLATE)
    model = AutoModelForCausalLM.from_pretrained(save_tiny_causal_lm(work / "policy", tokenizer))

    with (
        ServiceProcess(["retriever", "serve", "--config", str(work / "retriever.yaml")]) as retriever,
        ServiceProcess(["reward", "serve", "--config", str(work / "reward.yaml")]) as reward,
    ):
        services = {"retriever_url": retriever.url, "reward_url": reward.url}
        env = yaml.safe_load((ROOT / "launch" / "configs" / "r3.yaml").read_text())["env"]  # R3-RAG's RL settings
        concurrent_config = RolloutConfig.from_dict({"env": env, "services": services})
        sequential_config = RolloutConfig.from_dict({"env": env, "services": {**services, "batch_wait_ms": 0}})
        asyncio.run(rollouts(concurrent_config, tokenizer, model, rows[:4], args.max_batch, True))  # warm-up
        sequential = asyncio.run(rollouts(sequential_config, tokenizer, model, rows, 1, False))
        concurrent = asyncio.run(rollouts(concurrent_config, tokenizer, model, rows, args.max_batch, True))

    print(f"{len(rows)} questions, {concurrent['steps']} steps ({concurrent['correct']} answered correctly)")
    print(f"{'':28}{'sequential (official)':>24}{'concurrent (r3rag)':>22}")
    for key, fmt in (
        ("wall_s", "{:.2f}"),
        ("trajectories_per_s", "{:.2f}"),
        ("environment_share", "{:.1%}"),
        ("environment_s_per_episode", "{:.3f}"),
        ("mean_generate_batch", "{:.1f}"),
        ("mean_retrieval_batch", "{:.1f}"),
        ("mean_relevance_batch", "{:.1f}"),
    ):
        print(f"{key:28}{fmt.format(sequential[key]):>24}{fmt.format(concurrent[key]):>22}")
    ratio = concurrent["trajectories_per_s"] / sequential["trajectories_per_s"]
    print(f"concurrent / sequential trajectories/s: {ratio:.1f}x (target >= 4x)")
    print(f"environment share of rollout wall time (concurrent): {concurrent['environment_share']:.1%} (target < 5%)")


if __name__ == "__main__":
    main()
