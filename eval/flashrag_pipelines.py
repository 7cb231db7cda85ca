"""FlashRAG's own pipelines (FLARE, Self-ask, ITER-RETGEN, IRCoT) as evaluation methods.

The pipelines are FlashRAG's classes, unchanged, with their own prompts and answer parsing; only
their retriever and generator are replaced by adapters, so every baseline reads the same index
and runs the same model (the same engine) as the policy it is compared with:

- the retriever adapter answers ``search`` / ``batch_search`` with the run's batched search and
  records every query and its documents as a step (retrieval metrics see what the pipeline read);
- the generator adapter answers ``generate`` with the engine's raw completion of the prompt string
  FlashRAG built (with the model's chat template when FlashRAG applies one), honouring ``stop``,
  ``max_new_tokens`` and, for FLARE's confidence test, ``return_scores`` (per-token probabilities).

FlashRAG's pipelines are synchronous: each question runs in a worker thread, and the adapters
hand their calls back to the event loop, where they share batches with the other questions.
They build prompt strings with the model's tokenizer, so they need a local model: the ``hf`` and
``vllm`` engines (an ``openai`` endpoint gives no tokenizer and no token probabilities).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from eval.engines import TokenChatEngine
from eval.methods import Method, MethodContext, usage_of
from r3_env.answers import clean_answer
from r3_env.data import QAItem

DEFAULT_NEW_TOKENS = 256  # FlashRAG's generators' default when a pipeline names none


@dataclass
class _Trace:
    """What one question's pipeline did: its retrievals and its generation usage."""

    loop: asyncio.AbstractEventLoop
    ctx: MethodContext
    steps: list[dict[str, Any]] = field(default_factory=list)
    usage: Counter = field(default_factory=Counter)

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()


_TRACE: contextvars.ContextVar[_Trace] = contextvars.ContextVar("flashrag_trace")


class _Retriever:
    """FlashRAG's retriever interface over the run's search."""

    def __init__(self, topk: int) -> None:
        self.topk = topk

    def search(self, query: str, num: int | None = None, return_score: bool = False) -> Any:
        trace = _TRACE.get()
        hits = trace.call(trace.ctx.search(query, num or self.topk))
        documents = [{"id": h.passage.id, "contents": h.passage.contents} for h in hits]
        trace.steps.append({"analysis": "", "query": query, "documents": documents})
        return (documents, [h.score for h in hits]) if return_score else documents

    def batch_search(self, queries: list[str], num: int | None = None, return_score: bool = False) -> Any:
        results = [self.search(query, num, return_score) for query in queries]
        if return_score:
            return [r[0] for r in results], [r[1] for r in results]
        return results


class _Generator:
    """FlashRAG's generator interface over the engine's raw completion."""

    def __init__(self, engine: TokenChatEngine, max_new_tokens: int) -> None:
        self.engine, self.max_new_tokens = engine, max_new_tokens
        self.tokenizer, self.model_name = engine.tokenizer, engine.name

    def generate(
        self,
        input_list: str | list[str],
        return_scores: bool = False,
        stop: list[str] | None = None,
        max_new_tokens: int | None = None,
        **_: Any,
    ) -> Any:
        trace = _TRACE.get()
        prompts = [input_list] if isinstance(input_list, str) else list(input_list)
        texts, scores = [], []
        for prompt in prompts:
            reply = trace.call(
                self.engine.complete(prompt, max_new_tokens or self.max_new_tokens, stop or (), return_scores)
            )
            trace.usage.update(requests=1, prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens)
            texts.append(reply.text)
            scores.append(list(reply.token_probs or ()))
        return (texts, scores) if return_scores else texts


def _config(engine: TokenChatEngine, max_new_tokens: int) -> dict[str, Any]:
    """The FlashRAG config keys the pipelines, their prompt template and their evaluator read."""
    return {
        "device": "cpu",
        "framework": "hf",
        "generator_model_path": engine.name,
        "generator_max_input_len": max(64, engine.max_model_len - max_new_tokens),
        "save_retrieval_cache": False,
        "save_dir": tempfile.gettempdir(),
        "save_metric_score": False,
        "save_intermediate_data": False,
        "metrics": [],
        "dataset_name": "r3rag",
    }


@contextlib.contextmanager
def _adapters(retriever: _Retriever, generator: _Generator) -> Iterator[None]:
    """Make the pipelines' constructors take the adapters instead of loading FlashRAG's own models."""
    from flashrag.pipeline import active_pipeline

    saved = active_pipeline.get_retriever, active_pipeline.get_generator
    active_pipeline.get_retriever = lambda config: retriever
    active_pipeline.get_generator = lambda config: generator
    try:
        yield
    finally:
        active_pipeline.get_retriever, active_pipeline.get_generator = saved


def _build(name: str, config: dict, retriever: _Retriever, generator: _Generator, ctx: MethodContext) -> Any:
    from flashrag.pipeline import FLAREPipeline, IRCOTPipeline, IterativePipeline, SelfAskPipeline

    with _adapters(retriever, generator):
        if name == "flare":
            return FLAREPipeline(config, max_iter_num=ctx.env.max_steps)
        if name == "selfask":
            return SelfAskPipeline(config, max_iter=ctx.env.max_steps, single_hop=False)
        if name == "iter_retgen":
            return IterativePipeline(config, iter_num=3)  # ITER-RETGEN's and FlashRAG's default
        return IRCOTPipeline(config, retriever=retriever, generator=generator, max_iter=ctx.env.max_steps)


PIPELINES: dict[str, str] = {
    "flare": "FLARE: retrieve when the next sentence's tokens are not confident (FlashRAG's FLAREPipeline)",
    "selfask": "Self-ask: follow-up questions, each searched (FlashRAG's SelfAskPipeline, multi-hop prompt)",
    "iter_retgen": "ITER-RETGEN: retrieve with the question plus the last generation, 3 rounds (IterativePipeline)",
    "ircot": "IRCoT: one thought per round, each thought a query (FlashRAG's IRCOTPipeline)",
}


class FlashRAGMethod(Method):
    """One of FlashRAG's pipelines, question by question, on the run's engine and retriever."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline, self.name = pipeline, f"flashrag:{pipeline}"

    def _pipeline(self, ctx: MethodContext) -> Any:
        key = ("flashrag", self.pipeline)
        if key not in ctx.cache:
            engine = ctx.engine
            if not isinstance(engine, TokenChatEngine):
                raise ValueError(
                    f"method {self.name} builds its prompts with the model's tokenizer and reads token probabilities: "
                    "use --engine.kind hf or vllm with a local model"
                )
            new_tokens = min(ctx.env.step_budget, DEFAULT_NEW_TOKENS)
            generator, retriever = _Generator(engine, new_tokens), _Retriever(ctx.env.topk)
            ctx.cache[key] = _build(self.pipeline, _config(engine, new_tokens), retriever, generator, ctx)
        return ctx.cache[key]

    async def answer(self, ctx: MethodContext, item: QAItem) -> dict[str, Any]:
        from flashrag.dataset import Dataset, Item

        pipeline = self._pipeline(ctx)
        trace = _Trace(asyncio.get_running_loop(), ctx)
        dataset = Dataset(config={"dataset_name": "r3rag"}, data=[Item({"id": item.id, "question": item.question})])

        def run() -> Item:
            _TRACE.set(trace)
            return pipeline.run(dataset, do_eval=False).data[0]

        result = await asyncio.to_thread(contextvars.copy_context().run, run)
        raw = str(result.output.get("raw_pred", result.output.get("pred", "")))
        answer = str(result.output.get("pred", "")).strip() or None
        steps = list(trace.steps)
        fields: dict[str, Any] = {"answer": answer, "steps": steps, "num_steps": len(steps) + 1}
        if answer is None:
            fields["invalid"] = {"output": raw, "reason": "no_answer_found"}
        else:
            steps.append({"analysis": raw, "answer": answer})
        return {
            **fields,
            "format_retries": 0,
            "prediction": clean_answer(answer or ""),
            "num_retrievals": len(trace.steps),
            "num_docs": sum(len(step.get("documents", ())) for step in steps),
            "usage": usage_of(trace.usage),
        }

    def settings(self) -> dict[str, Any]:
        return {"method": self.name}


def flashrag_method(name: str) -> Method:
    if name not in PIPELINES:
        raise ValueError(f"unknown FlashRAG pipeline {name!r}; choose one of: {', '.join(sorted(PIPELINES))}")
    return FlashRAGMethod(name)
