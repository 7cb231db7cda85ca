"""What is evaluated: the step-by-step policy and the baselines, each a name in a registry.

- ``r3``: the trained policy's loop (:class:`r3_env.env.RetrievalEnv`, the RL episode itself);
- ``react``: the same loop in ReAct's Thought / Action / Observation format;
- ``direct``: chain of thought with no retrieval;
- ``naive_rag``: one retrieval with the question (top ``naive_topk``, 16 in the paper), then answer;
- ``rrt``: R2AG's Reasoning-Augmented Retrieval Tree (:mod:`r3_env.tree`) steered by the engine in the
  ``multi_query`` format, then a reader (the same engine, in ``reader_format``) answers from every
  document the tree retrieved;
- ``single_shot``: one retrieval with the question (top ``naive_topk``) and no generation: the
  single-step retrieval the tree is compared with at matched @K (documents retrieved);
- ``flashrag:<pipeline>``: FlashRAG's own pipelines (:mod:`eval.flashrag_pipelines`).

Every method returns the same record fields, so one scorer and one report serve them all. The
retrieval-only methods (``rrt``, ``single_shot``) also record ``retrieval``: Recall, Full-Recall,
AP over the retrieval order, @K, iterations and seconds (:func:`r3_env.tree.tree_metrics`'s keys).
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from eval.engines import ChatEngine
from r3_env.answers import clean_answer
from r3_env.data import Passage, QAItem, read_label
from r3_env.env import EnvConfig, RetrievalEnv
from r3_env.protocol import FormatError, FormatReason, StepFormat, get_format
from r3_env.protocol.chat import opening_messages
from r3_env.recipes import load_recipe
from r3_env.records import episode_fields, play
from r3_env.retrieval.base import Hit
from r3_env.retrieval.metrics import retrieval_quality
from r3_env.tree import Tree, TreeConfig, expand_tree, tree_metrics

Search = Callable[[str, int], Awaitable[list[Hit]]]


@dataclass
class MethodContext:
    """What a method may use: the engine, the episode rules, batched search."""

    engine: ChatEngine
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
    answers: bool = True  # False: retrieves only, no engine and no answer (single_shot)

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


async def answer_from(
    ctx: MethodContext, fmt: StepFormat, question: str, documents: Sequence[Passage] | None
) -> tuple[dict[str, Any], Counter]:
    """One answer step in ``fmt``: from ``documents`` (numbered as step 1's), or from the model's knowledge (None).

    Read leniently, as FlashRAG reads a baseline: the format's answer, else its answer section, else
    the whole output. Returns the record's answer fields (``answer``, ``answer_source`` or
    ``invalid``, and ``step``: the answer step to append, None without an answer) and the usage.
    """
    user = fmt.render_question(question)
    if documents is not None:
        user += "\n\n" + fmt.render_documents(documents, 1, ctx.env.doc_chars)
    prompt = fmt.answer_only_prompt(documents is not None)
    reply = await ctx.engine.chat(opening_messages(prompt, user, ctx.engine.system_in_user), ctx.env.step_budget)
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
    fields: dict[str, Any] = {"answer": answer, "step": None}
    if answer is None:
        fields["invalid"] = {"output": reply.text, "reason": "empty"}
    else:
        fields["step"] = {"analysis": analysis, "answer": answer}
        fields["answer_source"] = source
    usage = Counter(requests=1, prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens)
    return fields, usage


class AnswerOnce(Method):
    """One answer step: from the model's knowledge (CoT), or after one retrieval with the question (naive RAG)."""

    def __init__(self, name: str, with_documents: bool) -> None:
        self.name, self.with_documents = name, with_documents
        self.retrieves = with_documents

    async def answer(self, ctx: MethodContext, item: QAItem) -> dict[str, Any]:
        steps: list[dict[str, Any]] = []
        documents = None
        if self.with_documents:
            documents = [hit.passage for hit in await ctx.search(item.question, ctx.naive_topk)]
            steps.append({"analysis": "", "query": item.question, "documents": [p.to_json() for p in documents]})
        fields, usage = await answer_from(ctx, get_format(ctx.step_format), item.question, documents)
        step = fields.pop("step")
        fields.update(steps=steps, num_steps=len(steps) + 1)
        if step is not None:
            steps.append(step)
        return {
            **fields,
            "format_retries": 0,
            "prediction": clean_answer(fields["answer"] or ""),
            "num_retrievals": int(self.with_documents),
            "num_docs": len(documents or ()),
            "usage": usage_of(usage),
        }

    def settings(self) -> dict[str, Any]:
        return {"method": self.name}


class SingleShot(Method):
    """Single-step retrieval: the question as the one query, top ``naive_topk``, no generation.

    The baseline the retrieval tree is compared with at matched @K: run it with ``--naive_topk`` the
    tree run's documents retrieved per question. Its rows have no answer.
    """

    name = "single_shot"
    answers = False

    async def answer(self, ctx: MethodContext, item: QAItem) -> dict[str, Any]:
        started = time.perf_counter()
        documents = [hit.passage for hit in await ctx.search(item.question, ctx.naive_topk)]
        elapsed = time.perf_counter() - started
        ranked = list(dict.fromkeys(p.id for p in documents))
        retrieval = {
            **retrieval_quality(ranked, read_label(item.to_json()).gold_ids),
            "num_docs": float(len(ranked)),
            "iterations": 1.0,
            "generation_s": 0.0,
            "retrieval_s": elapsed,
            "wall_s": elapsed,
        }
        step = {"analysis": "", "query": item.question, "depth": 1, "documents": [p.to_json() for p in documents]}
        return {
            "answer": None,
            "steps": [step],
            "num_steps": 1,
            "format_retries": 0,
            "prediction": "",
            "num_retrievals": 1,
            "num_docs": len(documents),
            "usage": usage_of(Counter()),
            "retrieval": retrieval,
        }

    def settings(self) -> dict[str, Any]:
        return {"method": self.name, "answers": False}


@dataclass(frozen=True)
class TreeSettings:
    """The ``rrt`` method's settings (``eval run --rrt_*``, ``--reader_format``), recorded in run.json; their
    defaults are R2AG's recipe (:meth:`from_recipe`)."""

    topk: int  # documents per query (R2AG: 1, or 2 at inference)
    iterations: int  # L_MAX
    survivors_base: int  # Top-Survivor t for base queries
    survivors_predicted: int  # t for predicted queries
    max_base: int  # the multi_query format's limits
    max_predicted: int
    reader_format: str = "r3"  # the step format the reader answers in

    @classmethod
    def from_recipe(cls, recipe: str = "r2ag") -> TreeSettings:
        """A recipe's tree (recipes/r2ag.yaml: its tree section, its reward's survivors, its format's limits)."""
        loaded = load_recipe(recipe)
        tree, limits = loaded.tree_config(), loaded.rollout_config().policy.format_options
        return cls(
            topk=tree.topk,
            iterations=tree.max_iterations,
            survivors_base=tree.survivors_base,
            survivors_predicted=tree.survivors_predicted,
            max_base=limits["max_base"],
            max_predicted=limits["max_predicted"],
        )

    @classmethod
    def from_run(cls, config: Any) -> TreeSettings:
        """From an :class:`eval.run.EvalRunConfig` (its ``rrt_*`` and ``reader_format`` fields)."""
        names = ("topk", "iterations", "survivors_base", "survivors_predicted", "max_base", "max_predicted")
        return cls(**{name: getattr(config, f"rrt_{name}") for name in names}, reader_format=config.reader_format)

    def tree(self, max_query_chars: int = TreeConfig.max_query_chars) -> TreeConfig:
        return TreeConfig(
            topk=self.topk,
            max_iterations=self.iterations,
            survivors_base=self.survivors_base,
            survivors_predicted=self.survivors_predicted,
            max_query_chars=max_query_chars,
        )


class RetrievalTree(Method):
    """R2AG: the engine steers the retrieval tree (one ``multi_query`` step per expanded vertex), then reads.

    All queries of a question's iteration go to the retriever together (the run's batched search
    coalesces them, with the other questions' in flight, into one request). The reader is the same
    engine answering in ``reader_format`` from every document the tree retrieved, in retrieval order.
    """

    name = "rrt"

    def __init__(self, settings: TreeSettings | None = None) -> None:
        settings = settings or TreeSettings.from_recipe()
        self.options = settings
        self.step_format = get_format("multi_query", max_base=settings.max_base, max_predicted=settings.max_predicted)
        self.reader = get_format(settings.reader_format)
        self.reader.answer_only_prompt(True)  # a format that cannot answer (multi_query) fails here, not per question

    async def answer(self, ctx: MethodContext, item: QAItem) -> dict[str, Any]:
        key = ("renderer", "multi_query", self.options.max_base, self.options.max_predicted)
        renderer = ctx.cache.get(key)
        if renderer is None:  # engine.renderer takes a format name or a StepFormat (with this run's limits)
            renderer = ctx.cache[key] = ctx.engine.renderer(self.step_format, ctx.env.doc_chars)
        usage: Counter = Counter()

        async def steer(question: str, context: Sequence[Passage]) -> str:
            messages = renderer.messages(question, context=context)
            reply = await ctx.engine.chat(messages, ctx.env.step_budget, self.step_format.stop_strings())
            usage.update(requests=1, prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens)
            return reply.text

        async def search_many(queries: Sequence[str], k: int) -> list[list[Hit]]:
            return list(await asyncio.gather(*(ctx.search(query, k) for query in queries)))

        gold = read_label(item.to_json()).gold_ids
        config = self.options.tree(ctx.env.max_query_chars)
        tree = await expand_tree(item.question, steer, search_many, self.step_format, config, gold_ids=gold)
        documents = tree.retrieved()
        fields, reader_usage = await answer_from(ctx, self.reader, item.question, documents)
        usage.update(reader_usage)
        steps = tree_steps(tree)
        if fields["step"] is not None:
            steps.append(fields["step"])
        del fields["step"]
        return {
            **fields,
            "steps": steps,
            "num_steps": tree.iterations,
            "format_retries": 0,
            "prediction": clean_answer(fields["answer"] or ""),
            "num_retrievals": len(tree.vertices) - 1,
            "num_docs": len(documents),
            "usage": usage_of(usage),
            "tree": tree.to_json(),
            "retrieval": tree_metrics(tree),
        }

    def settings(self) -> dict[str, Any]:
        tree = asdict(self.options.tree())
        del tree["max_query_chars"]  # env.max_query_chars, recorded with env
        tree.update(max_base=self.options.max_base, max_predicted=self.options.max_predicted)
        return {"method": self.name, "step_format": "multi_query", "reader_format": self.options.reader_format,
                "tree": tree}  # fmt: skip


def tree_steps(tree: Tree) -> list[dict[str, Any]]:
    """The tree's retrievals as record steps, in expansion order: each vertex's query (its ``kind`` and
    ``depth``, the iteration that made it) and documents; the first child of a vertex carries the
    reasoning that wrote its queries."""
    steps: list[dict[str, Any]] = []
    told: set[int] = set()
    for vertex in tree.vertices[1:]:
        parent = tree.vertices[vertex.parent or 0]
        analysis = parent.analysis if parent.id not in told else ""
        told.add(parent.id)
        steps.append({"analysis": analysis, "query": vertex.query, "kind": vertex.kind, "depth": vertex.depth,
                      "documents": [p.to_json() for p in vertex.documents]})  # fmt: skip
    return steps


_METHODS: dict[str, Callable[[Any], Method]] = {
    "r3": lambda _: StepByStep("r3"),
    "react": lambda _: StepByStep("react", step_format="react"),
    "direct": lambda _: AnswerOnce("direct", with_documents=False),
    "naive_rag": lambda _: AnswerOnce("naive_rag", with_documents=True),
    "rrt": lambda config: RetrievalTree(TreeSettings.from_run(config) if config is not None else None),
    "single_shot": lambda _: SingleShot(),
}


def available_methods() -> list[str]:
    from eval.flashrag_pipelines import PIPELINES

    return sorted(_METHODS) + [f"flashrag:{name}" for name in sorted(PIPELINES)]


def get_method(name: str, config: Any = None) -> Method:
    """The method ``name``; ``config`` (an :class:`eval.run.EvalRunConfig`) gives the settings of those that have
    some (``rrt``: the ``rrt_*`` fields and ``reader_format``; defaults without it)."""
    if name.startswith("flashrag:"):
        from eval.flashrag_pipelines import flashrag_method

        return flashrag_method(name.removeprefix("flashrag:"))
    try:
        factory = _METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose one of: {', '.join(available_methods())}") from None
    return factory(config)
