"""One episode of step-by-step reasoning and retrieval: the policy writes a step, the environment answers.

``reset()`` renders the prompt; ``step(action_text)`` parses the policy's step and

- retrieves top-k documents for a query (optionally dropping already-seen ids, keeping a few new
  ones per step and capping the total, as R3-RAG's official code does) and returns them as the
  rendered document turn;
- ends the episode on an answer;
- ends it on a step that does not parse (a format failure), or asks for the step again, up to
  ``format_retries`` times, when regeneration is on (the official code regenerates up to 3 times).

A ``multi_query`` step (R2AG) retrieves for each of its queries in one batched call and shows the
union of what they found; its stop signal ends the episode after that retrieval, or on its own
(a STOP step). An episode may start from ``context`` documents (R2AG's later rounds), which count
as already shown. With ``question_docs``, :meth:`RetrievalEnv.start` also retrieves with the question
itself before the policy's first step and shows those documents with it, as FlashRAG's iterative
pipelines retrieve with the question first: the policy's own queries then only have to find what the
question's retrieval missed, and gold it found is not new to any step.

Reaching ``max_steps`` retrievals without an answer ends the episode with no answer, or, with
``answer_at_limit``, shows the last documents and starts the final step for the policy (the format's
:meth:`answer_prefix`), so that its next words are the answer: how FlashRAG's iterative pipelines
answer once their iterations run out. With ``stop_after_action``, a step ends with its first query or
answer, as a tool call ends a model's turn, and what the policy wrote after it is dropped. With
``query_with_question``, each search runs the step's query followed by the question, as Query2doc joins
the original query to generated text for BM25; the record keeps the policy's query. Every step leaves a
:class:`StepRecord` (the parsed step, document ids and titles, later the judge's relevance): the record is
what rewards, logs and evaluation read.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from r3_env.data import Passage
from r3_env.episode import BranchHit, GoldProgress
from r3_env.protocol import FormatError, FormatReason, MessageRenderer, Step
from r3_env.retrieval.base import Hit

# One query in, its top-k hits out (a coalesced call to the retrieval service, or an in-process retriever).
SearchFn = Callable[[str, int], Awaitable[list[Hit]]]


@dataclass(frozen=True)
class EnvConfig:
    """The episode's rules. Defaults follow the paper's evaluation; ``recipes/r3.yaml`` has the RL ones."""

    max_steps: int = 5  # retrieval steps before the episode ends with no answer
    topk: int = 5  # documents asked of the retriever per query
    docs_per_step: int = 0  # documents kept per step (0: all top-k); the official RL code keeps 2 new ones
    dedup_docs: bool = False  # drop documents already shown in earlier steps
    max_total_docs: int = 0  # stop adding documents once this many were shown (0: no cap); official RL: 10
    doc_chars: int = 512  # characters of each document shown to the policy
    format_retries: int = 0  # regenerate a step that does not parse up to this many times (official: 3)
    max_step_tokens: int = 512  # new tokens per step
    # extra new tokens per step for a reasoning model's think block (Qwen3 with thinking); a think
    # block still open when the budget runs out makes the step a format error
    think_tokens: int = 0
    max_query_chars: int = 1024  # longer queries are cut before retrieval (the service rejects huge ones)
    # at max_steps, show the documents and write the start of an answer step for the policy instead of
    # ending unanswered: a policy that searches once too often still answers from what it found
    answer_at_limit: bool = False
    # documents retrieved with the question itself and shown with it before the first step (0: none)
    question_docs: int = 0
    # a step ends with its first query or answer line, as a tool call ends a model's turn: what the policy
    # wrote after it (an answer after its query, say) is dropped, not a format error, and never trained on
    stop_after_action: bool = False
    # each search runs the step's query followed by the question (as Query2doc joins the original query to
    # generated text for BM25): the question's words keep a short entity query on the question's passages
    query_with_question: bool = False

    def __post_init__(self) -> None:
        for name in ("max_steps", "topk", "doc_chars", "max_step_tokens", "max_query_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("docs_per_step", "max_total_docs", "format_retries", "think_tokens", "question_docs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)}")
        if self.max_total_docs and self.question_docs >= self.max_total_docs:
            raise ValueError(
                f"question_docs ({self.question_docs}) must be below max_total_docs ({self.max_total_docs}): the cap "
                "counts the question's documents, so no step would show any"
            )

    @property
    def step_budget(self) -> int:
        """New tokens one step may take: the step itself plus any thinking."""
        return self.max_step_tokens + self.think_tokens


def env_defaults() -> dict[str, Any]:
    """Every episode rule at its default: what a run recorded before a rule existed ran under."""
    return {item.name: item.default for item in fields(EnvConfig)}


class StepKind(str, enum.Enum):
    QUERY = "query"
    ANSWER = "answer"
    STOP = "stop"  # multi_query: the stop signal on its own (no retrieval, no answer)
    FORMAT_ERROR = "format_error"


# A step that did not parse, in the trajectory log's flat row (Step.to_json(every_field=True)'s keys).
_UNPARSED = {
    "analysis": "",
    "query": None,
    "answer": None,
    "reflection": None,
    "queries": [],
    "predicted": [],
    "stop": False,
}


@dataclass
class StepRecord:
    """What one policy step did: the parsed ``step`` (None when it did not parse), what it retrieved, and
    what scoring later adds (``relevance``, ``new_gold``).

    ``hits`` holds each of the step's queries' own top-k ids (a multi_query step's base queries first)
    as the retriever returned them; ``doc_ids`` are the documents the step kept to show.
    """

    kind: StepKind
    action: str
    step: Step | None = None
    hits: list[list[str]] = field(default_factory=list)
    doc_ids: list[str] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)
    format_error: str | None = None
    format_retries: int = 0  # unparseable attempts regenerated before this one
    relevance: float | None = None
    relevance_fallback: bool = False
    new_gold: int = 0

    def to_json(self) -> dict[str, Any]:
        """The trajectory log's row: every field of the step flat beside the record's (empty when it did not parse)."""
        step = self.step.to_json(every_field=True) if self.step is not None else dict(_UNPARSED)
        row = {"kind": self.kind.value, "action": self.action, **step}
        row.update((f.name, getattr(self, f.name)) for f in fields(self) if f.name not in ("kind", "action", "step"))
        return row


@dataclass(frozen=True)
class StepResult:
    """What the executor does next: append ``feedback`` and continue, stop (``done``), or regenerate (``retry``)."""

    feedback: str = ""
    done: bool = False
    retry: bool = False
    documents: tuple[Passage, ...] = ()


async def question_documents(
    config: EnvConfig, search: SearchFn, question: str, seen: Collection[str] = ()
) -> list[Passage]:
    """The question's own top ``config.question_docs`` documents not in ``seen`` (the given context): what an
    episode starts from beside that context (none when ``question_docs`` is 0)."""
    if not config.question_docs:
        return []
    hits = await search(question[: config.max_query_chars], config.question_docs)
    return list({hit.passage.id: hit.passage for hit in hits if hit.passage.id not in seen}.values())


class RetrievalEnv:
    """One episode. Not reusable: make one per rollout.

    With a :class:`ChatRenderer` the prompt and feedback are template text for a token-space policy;
    with a :class:`MessageRenderer` they are the contents of chat turns for a chat API.
    """

    def __init__(
        self,
        config: EnvConfig,
        renderer: MessageRenderer,
        search: SearchFn,
        question: str,
        context: Sequence[Passage] = (),
    ) -> None:
        self.config, self.renderer, self.search, self.question = config, renderer, search, question
        self.context = tuple(context)  # the prompt's documents: the given ones, then the question's (start())
        self.question_documents: list[Passage] = []  # what start() retrieved with the question
        self.steps: list[StepRecord] = []
        self.documents: list[list[Passage]] = []  # per retrieval step, as shown to the policy
        self.done = False
        self._seen: set[str] = {p.id for p in self.context}
        self._shown = 0
        self._retries = 0
        self._started = False
        self._limit_prefix = renderer.format.answer_prefix() if config.answer_at_limit else ""
        # the start of the policy's next step that the environment wrote (answer_at_limit), else ""
        self.answer_prefix = ""

    async def start(self) -> str:
        """Retrieve with the question (``question_docs``), then the prompt: call once, before the first step."""
        if self._started:
            raise RuntimeError("the episode has started; make a new RetrievalEnv")
        self._started = True
        self.question_documents = await question_documents(self.config, self.search, self.question, self._seen)
        self.context += tuple(self.question_documents)
        self._seen.update(p.id for p in self.question_documents)
        self._shown += len(self.question_documents)
        return self.reset()

    def reset(self) -> str:
        """The prompt: instructions, question and any context documents through the first generation prompt."""
        return self.renderer.prompt(self.question, self.context)

    @property
    def retrievals(self) -> int:
        return sum(step.kind is StepKind.QUERY for step in self.steps)

    @property
    def answer(self) -> str | None:
        last = self.steps[-1] if self.steps else None
        return last.step.answer if last is not None and last.kind is StepKind.ANSWER else None

    @property
    def format_error(self) -> str | None:
        last = self.steps[-1] if self.steps else None
        return last.format_error if last is not None else None

    @property
    def num_docs(self) -> int:
        """Documents shown to the policy, the question's included (a last retrieval that ran out of steps is
        recorded, not shown)."""
        return self._shown

    def action_end(self, action_text: str) -> int | None:
        """With ``stop_after_action``: where the policy's output ends, when it wrote on past its first query or
        answer (an index into ``action_text``); None otherwise. The rollout cuts the step's tokens there too."""
        if not self.config.stop_after_action:
            return None
        end = self.renderer.format.action_end(self.answer_prefix + action_text)
        return None if end is None else max(0, end - len(self.answer_prefix))

    async def step(self, action_text: str, closed: bool = True, turn_ended: bool | None = None) -> StepResult:
        """Act on one policy output.

        ``closed``: the output finished (False: cut off by a length limit). ``turn_ended``: it ended
        with the chat template's end-of-turn token (default ``closed``); when it finished on
        another stop, the document turn supplies that token so the transcript stays well formed.
        """
        if self.done:
            raise RuntimeError("the episode is over; make a new RetrievalEnv")
        if self.config.question_docs and not self._started:
            raise RuntimeError("env.question_docs retrieves before the first step: await start() first")
        cut = self.action_end(action_text)
        if cut is not None:  # the step ended with its action; the rest is dropped, as a stop string would
            action_text, closed, turn_ended = action_text[:cut], True, False
        action_text = self.answer_prefix + action_text  # the step as a whole, with what the environment wrote
        try:
            if not closed:
                raise FormatError(FormatReason.TRUNCATED, "the step hit the token limit before its end")
            parsed = self.renderer.format.read_turn(action_text, after_documents=self.retrievals > 0)
        except FormatError as error:
            if self._retries < self.config.format_retries and error.reason is not FormatReason.TRUNCATED:
                self._retries += 1
                return StepResult(retry=True)  # the step is written again after the same prefix
            self.answer_prefix = ""
            return self._finish(StepRecord(StepKind.FORMAT_ERROR, action_text, format_error=error.reason.value))
        self.answer_prefix = ""
        if parsed.is_final:
            kind = StepKind.ANSWER if parsed.answer is not None else StepKind.STOP
            return self._finish(StepRecord(kind, action_text, parsed))
        return await self._retrieve(action_text, parsed, closed if turn_ended is None else turn_ended)

    async def _retrieve(self, action_text: str, parsed: Step, turn_ended: bool) -> StepResult:
        limit, k = self.config.max_query_chars, self.config.topk
        suffix = f" {self.question}" if self.config.query_with_question else ""
        found = await asyncio.gather(*(self.search(f"{query}{suffix}"[:limit], k) for query in parsed.searches))
        passages = list({hit.passage.id: hit.passage for hits in found for hit in hits}.values())
        kept = self._select(passages)
        record = StepRecord(
            StepKind.QUERY,
            action_text,
            parsed,
            hits=[[hit.passage.id for hit in hits] for hits in found],
            doc_ids=[p.id for p in kept],
            titles=[p.title for p in kept],
            format_retries=self._take_retries(),
        )
        self.steps.append(record)
        self.documents.append(kept)
        limit = self.config.max_steps + (1 if self._limit_prefix else 0)
        if parsed.stop or self.retrievals >= limit:  # the documents are never shown (nor read)
            self._shown -= len(kept)
            self.done = True
            return StepResult(done=True, documents=tuple(kept))
        feedback = self.renderer.observation(kept, self.retrievals, action_closed=turn_ended)
        if self.retrievals == self.config.max_steps:  # answer_at_limit: the policy's next words are its answer
            self.answer_prefix = self._limit_prefix
        return StepResult(feedback=feedback + self.answer_prefix, documents=tuple(kept))

    def gold_progress(self, gold_ids: Sequence[str]) -> GoldProgress:
        """The gold passages this finished episode found, step by step; sets each query record's ``new_gold``.

        A step finds what it showed; a multi-query step's queries also each find their top-1 (R2AG's
        vertices), which the document limits may not have shown. Each query's top-1 is a branch hit,
        new when neither the starting context nor an earlier query or step found it.
        """
        gold = set(gold_ids)
        seen = {p.id for p in self.context} & gold
        before, new, branches = len(seen), [], []
        for record in [record for record in self.steps if record.kind is StepKind.QUERY]:
            hits, found, base = [], set(seen), len(record.step.queries)
            for number, ids in enumerate(record.hits):
                top = ids[0] if ids else None
                hits.append(BranchHit(top in gold, top in gold and top not in found, number >= base))
                found.add(top)
            branches.append(hits)
            tops = [ids[0] for ids in record.hits if ids] if record.step.query is None else []
            fresh = {i for i in [*record.doc_ids, *tops] if i in gold} - seen
            record.new_gold = len(fresh)
            new.append(record.new_gold)
            seen |= fresh
        return GoldProgress(len(gold), before, new, branches)

    def _select(self, passages: Sequence[Passage]) -> list[Passage]:
        config, kept = self.config, []
        for passage in passages:
            if config.dedup_docs and passage.id in self._seen:
                continue
            if config.docs_per_step and len(kept) >= config.docs_per_step:
                break
            if config.max_total_docs and self._shown + len(kept) >= config.max_total_docs:
                break
            kept.append(passage)
            self._seen.add(passage.id)
        self._shown += len(kept)
        return kept

    def _take_retries(self) -> int:
        retries, self._retries = self._retries, 0
        return retries

    def _finish(self, record: StepRecord) -> StepResult:
        record.format_retries = self._take_retries()
        self.steps.append(record)
        self.done = True
        return StepResult(done=True)
