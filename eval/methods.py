"""What is evaluated: the step-by-step policy and the baselines, each a name in a registry.

- ``r3``: the trained policy's loop (:class:`r3_env.env.RetrievalEnv`, the RL episode itself);
- ``react``: the same loop in ReAct's Thought / Action / Observation format;
- ``direct``: chain of thought with no retrieval;
- ``naive_rag``: one retrieval with the question (top ``naive_topk``, 16 in the paper), then answer;
- ``flashrag:<pipeline>``: FlashRAG's own pipelines (:mod:`eval.flashrag_pipelines`).

Every method returns the same record fields, so one scorer and one report serve them all.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from eval.engines import Engine
from r3_env.answers import clean_answer
from r3_env.data import QAItem
from r3_env.env import EnvConfig, RetrievalEnv
from r3_env.protocol import FormatError, FormatReason, get_format
from r3_env.protocol.chat import opening_messages
from r3_env.records import episode_fields, play
from r3_env.retrieval.base import Hit

Search = Callable[[str, int], Awaitable[list[Hit]]]


@dataclass
class MethodContext:
    """What a method may use: the engine, the episode rules, batched search."""

    engine: Engine
    env: EnvConfig
    search: Search
    step_format: str = "r3"
    naive_topk: int = 16
    cache: dict[str, Any] = field(default_factory=dict)  # per-run state a method builds once (renderers, pipelines)


def usage_of(counter: Counter) -> dict[str, int]:
    return {key: int(counter[key]) for key in ("requests", "prompt_tokens", "completion_tokens")}


class Method(ABC):
    name: str
    retrieves: bool = True  # False: needs no retriever (direct CoT)

    @abstractmethod
    async def answer(self, ctx: MethodContext, item: QAItem) -> dict[str, Any]:
        """Record fields: steps, answer, prediction, num_steps, num_retrievals, num_docs, usage (and invalid)."""

    def settings(self) -> dict[str, Any]:
        """What changes this method's rows, for the run manifest."""
        return {"method": self.name}


class StepByStep(Method):
    """The RL episode, one generated step at a time."""

    def __init__(self, name: str, step_format: str | None = None) -> None:
        self.name, self.step_format = name, step_format

    async def answer(self, ctx: MethodContext, item: QAItem) -> dict[str, Any]:
        step_format = self.step_format or ctx.step_format
        renderer = ctx.cache.get(("renderer", step_format))
        if renderer is None:
            renderer = ctx.cache[("renderer", step_format)] = ctx.engine.renderer(step_format, ctx.env.doc_chars)
        env = RetrievalEnv(ctx.env, renderer, ctx.search, item.question)
        stop = renderer.format.stop_strings()
        usage = await play(env, renderer, lambda messages, _turns: ctx.engine.chat(messages, ctx.env.step_budget, stop))
        return {
            **episode_fields(env),
            "prediction": clean_answer(env.answer or ""),
            "num_retrievals": env.retrievals,
            "num_docs": env.num_docs,
            "usage": usage_of(usage),
        }

    def settings(self) -> dict[str, Any]:
        return {"method": self.name, "step_format": self.step_format}


class AnswerOnce(Method):
    """One answer step: from the model's knowledge (CoT), or after one retrieval with the question (naive RAG)."""

    def __init__(self, name: str, with_documents: bool) -> None:
        self.name, self.with_documents = name, with_documents
        self.retrieves = with_documents

    async def answer(self, ctx: MethodContext, item: QAItem) -> dict[str, Any]:
        fmt = get_format(ctx.step_format)
        user = fmt.render_question(item.question)
        steps: list[dict[str, Any]] = []
        documents = []
        if self.with_documents:
            documents = [hit.passage for hit in await ctx.search(item.question, ctx.naive_topk)]
            user += "\n\n" + fmt.render_documents(documents, 1, ctx.env.doc_chars)
            steps.append({"analysis": "", "query": item.question, "documents": [p.to_json() for p in documents]})
        messages = opening_messages(fmt.answer_only_prompt(self.with_documents), user, ctx.engine.system_in_user)
        reply = await ctx.engine.chat(messages, ctx.env.step_budget)
        try:
            step = fmt.parse_step(reply.text)
            if not step.is_final:  # asked to answer, it searched: nothing final to read
                raise FormatError(FormatReason.MISSING_ACTION, "a query where an answer was asked for")
            analysis, answer, source = step.analysis, step.answer, "format"
        except FormatError:  # read leniently, as FlashRAG reads a baseline: the answer section, else the output
            analysis, answer = reply.text.strip(), fmt.find_answer(reply.text)
            source = "format" if answer is not None else "whole_output"
            if answer is None:  # the whole output is the answer; it is not repeated as the analysis
                answer, analysis = analysis or None, ""
        fields: dict[str, Any] = {"answer": answer, "steps": steps, "num_steps": len(steps) + 1}
        if answer is None:
            fields["invalid"] = {"output": reply.text, "reason": "empty"}
        else:
            steps.append({"analysis": analysis, "answer": answer})
            fields["answer_source"] = source
        usage = Counter(requests=1, prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens)
        return {
            **fields,
            "format_retries": 0,
            "prediction": clean_answer(answer or ""),
            "num_retrievals": int(self.with_documents),
            "num_docs": len(documents),
            "usage": usage_of(usage),
        }

    def settings(self) -> dict[str, Any]:
        return {"method": self.name}


_METHODS: dict[str, Callable[[], Method]] = {
    "r3": lambda: StepByStep("r3"),
    "react": lambda: StepByStep("react", step_format="react"),
    "direct": lambda: AnswerOnce("direct", with_documents=False),
    "naive_rag": lambda: AnswerOnce("naive_rag", with_documents=True),
}


def available_methods() -> list[str]:
    from eval.flashrag_pipelines import PIPELINES

    return sorted(_METHODS) + [f"flashrag:{name}" for name in sorted(PIPELINES)]


def get_method(name: str) -> Method:
    if name.startswith("flashrag:"):
        from eval.flashrag_pipelines import flashrag_method

        return flashrag_method(name.removeprefix("flashrag:"))
    try:
        return _METHODS[name]()
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose one of: {', '.join(available_methods())}") from None
