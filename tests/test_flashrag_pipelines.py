"""FlashRAG's pipelines as evaluation methods, end to end on a real tiny transformer and a real BM25 index.

The model's weights are random, so what it writes is noise; what is checked is the plumbing: the
pipeline is FlashRAG's own class, its searches reach the run's retriever and come back as steps
with real corpus documents, its generations go through the engine, and the record has the shape
every scorer and report reads.
"""

from __future__ import annotations

import asyncio

import pytest

from eval.engines import EngineConfig, GenerationConfig, OpenAIChatEngine, make_chat_engine
from eval.flashrag_pipelines import PIPELINES, flashrag_method
from eval.methods import MethodContext, get_method
from r3_env.env import EnvConfig
from r3_env.retrieval import load_retriever
from r3_env.runs import retriever_config


@pytest.fixture(scope="module")
def context(eval_world, eval_tiny):
    retriever = load_retriever(retriever_config(eval_world["retriever"]))
    queries: list[str] = []

    async def search(query: str, k: int):
        queries.append(query)
        return (await asyncio.to_thread(retriever.search, [query], k))[0]

    engine = make_chat_engine(EngineConfig(model=str(eval_tiny), max_model_len=4096), GenerationConfig())
    ctx = MethodContext(engine, EnvConfig(topk=3, max_steps=2, max_step_tokens=16), search)
    return ctx, queries, {p.id for p in retriever.docstore.passages()} if hasattr(retriever, "docstore") else None


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_each_pipeline_runs_end_to_end(pipeline, context, eval_world):
    ctx, queries, _ = context
    method = get_method(f"flashrag:{pipeline}")
    item = eval_world["items"][5]
    queries.clear()
    record = asyncio.run(method.answer(ctx, item))
    searched = [step for step in record["steps"] if "query" in step]
    assert [step["query"] for step in searched] == queries  # every search of the pipeline is a recorded step
    assert record["num_retrievals"] == len(searched)
    assert record["num_docs"] == sum(len(step["documents"]) for step in searched)
    if pipeline != "flare":  # FLARE searches only when the next sentence is not confident
        assert searched and searched[0]["query"].startswith(item.question[:20])
    assert len(searched[0]["documents"]) == 3 if searched else True  # noise queries may match nothing
    for step in searched:
        assert len(step["documents"]) <= 3 and all(doc["id"] and "\n" in doc["contents"] for doc in step["documents"])
    assert record["usage"]["requests"] >= 1 and record["usage"]["completion_tokens"] >= 1
    if record["answer"] is None:
        assert record["invalid"]["reason"] == "no_answer_found" and record["num_steps"] == len(searched) + 1
    else:
        assert record["steps"][-1]["answer"] == record["answer"] and record["num_steps"] == len(record["steps"])


def test_flare_reads_token_probabilities(context):
    ctx, _, _ = context
    reply = asyncio.run(ctx.engine.complete("Question: who? Answer:", 8, token_probs=True))
    assert reply.token_probs is not None and len(reply.token_probs) == reply.completion_tokens
    assert all(0.0 < p <= 1.0 for p in reply.token_probs)


def test_unknown_pipeline_and_endpoint_engine_are_refused(context, eval_world):
    with pytest.raises(ValueError, match="choose one of: flare, ircot, iter_retgen, selfask"):
        flashrag_method("nope")
    ctx, _, _ = context
    endpoint = OpenAIChatEngine(
        EngineConfig(kind="openai", model="m", base_url="http://127.0.0.1:9/v1"), GenerationConfig()
    )
    refused = MethodContext(endpoint, ctx.env, ctx.search)
    with pytest.raises(ValueError, match="use --engine.kind hf or vllm"):
        asyncio.run(get_method("flashrag:ircot").answer(refused, eval_world["items"][0]))
