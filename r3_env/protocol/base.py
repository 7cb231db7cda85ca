"""What every step format shares: the typed step, the format error, the format interface, the registry.

A step format owns its textual markers; nothing outside ``r3_env.protocol`` knows them. Training,
cold start, evaluation and the reward server select a format by name (``get_format("r3")``).
"""

from __future__ import annotations

import enum
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from r3_env.data import Passage


def normalize_newlines(text: str) -> str:
    """Windows and old-Mac line ends as \\n (the only line separator the formats use)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _clean(text: str | None) -> str | None:
    return None if text is None else normalize_newlines(text).strip()


@dataclass(frozen=True)
class Step:
    """One step of a trajectory: an analysis, then one action.

    The single-query formats (``r3``, ``tags``, ``react``) write one retrieval ``query`` or the final
    ``answer``. The ``multi_query`` format (R2AG) writes several base ``queries`` and ``predicted``
    (anticipatory) ones, and may signal ``stop`` (no more retrieval), alone or after its queries.
    ``reflection`` is what the step makes of the documents just read, for formats that give it a
    section of its own (``tags``); formats without one fold it into the analysis
    (:meth:`StepFormat.express`). Surrounding whitespace is stripped on construction (an empty
    reflection is None), so a rendered-then-parsed step compares equal to the original.
    """

    analysis: str
    query: str | None = None
    answer: str | None = None
    reflection: str | None = None
    queries: tuple[str, ...] = ()
    predicted: tuple[str, ...] = ()
    stop: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "analysis", _clean(self.analysis))
        object.__setattr__(self, "query", _clean(self.query))
        object.__setattr__(self, "answer", _clean(self.answer))
        object.__setattr__(self, "reflection", _clean(self.reflection) or None)
        for name in ("queries", "predicted"):
            values = getattr(self, name)
            if isinstance(values, str):
                raise ValueError(f"Step.{name} is a sequence of queries, not one string")
            object.__setattr__(self, name, tuple(_clean(v) for v in values))
        expands = bool(self.queries or self.predicted or self.stop)
        if (self.query is not None) + (self.answer is not None) + expands != 1:
            raise ValueError("a Step has exactly one of query=, answer=, or queries=/predicted=/stop=")

    def to_json(self, every_field: bool = False) -> dict[str, Any]:
        """The step as a record's row, in any format: the analysis, any reflection, and the action's fields.

        ``every_field``: every field, unset ones included (the trajectory log's flat rows).
        """
        if every_field:
            values = {f.name: getattr(self, f.name) for f in fields(self)}
            return {**values, "queries": list(self.queries), "predicted": list(self.predicted)}
        row: dict[str, Any] = {"analysis": self.analysis}
        if self.reflection is not None:
            row["reflection"] = self.reflection
        if self.query is not None:
            row["query"] = self.query
        elif self.answer is not None:
            row["answer"] = self.answer
        else:
            row.update(queries=list(self.queries), predicted=list(self.predicted), stop=self.stop)
        return row

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Step:
        """The step of :meth:`to_json`'s row; KeyError, TypeError or ValueError when it is malformed."""
        return cls(
            row["analysis"],
            query=row.get("query"),
            answer=row.get("answer"),
            reflection=row.get("reflection"),
            queries=row.get("queries") or (),
            predicted=row.get("predicted") or (),
            stop=bool(row.get("stop", False)),
        )

    @property
    def searches(self) -> tuple[str, ...]:
        """Every query this step retrieves for, in order (base queries before predicted ones)."""
        return (self.query,) if self.query is not None else self.queries + self.predicted

    @property
    def is_final(self) -> bool:
        """The step retrieves nothing: an answer, or a stop signal on its own."""
        return not self.searches


class FormatReason(str, enum.Enum):
    """Why a model output is not a well-formed step (machine-readable, used in logs and rewards)."""

    EMPTY = "empty"
    MISSING_ANALYSIS = "missing_analysis"
    EMPTY_ANALYSIS = "empty_analysis"
    DUPLICATE_ANALYSIS = "duplicate_analysis"
    TEXT_BEFORE_ANALYSIS = "text_before_analysis"
    ACTION_BEFORE_ANALYSIS = "action_before_analysis"
    MISSING_ACTION = "missing_action"
    BOTH_QUERY_AND_ANSWER = "both_query_and_answer"
    MULTIPLE_QUERIES = "multiple_queries"
    EMPTY_QUERY = "empty_query"
    TEXT_AFTER_QUERY = "text_after_query"
    MULTIPLE_ANSWERS = "multiple_answers"
    EMPTY_ANSWER = "empty_answer"
    TEXT_AFTER_ANSWER = "text_after_answer"
    UNCLOSED_TAG = "unclosed_tag"  # a tag (or a reasoning model's think block) opened and never closed
    STRAY_TEXT = "stray_text"  # text or a tag the format has no place for
    MISSING_REFLECTION = "missing_reflection"  # tags: after documents, and before an answer, comes a reflection
    MISPLACED_REFLECTION = "misplaced_reflection"  # tags: a reflection with nothing retrieved, or not first
    TRUNCATED = "truncated"  # generation hit its token limit before the step ended


class FormatError(ValueError):
    """A model output that does not parse as a step. ``reason`` is a :class:`FormatReason`."""

    def __init__(self, reason: FormatReason, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)


@dataclass(frozen=True)
class Turn:
    """One step and, when it was a query, the documents retrieved for it."""

    step: Step
    documents: Sequence[Passage] = field(default_factory=tuple)


# The analysis of the final step the environment starts for the policy when its searches run out.
OUT_OF_SEARCHES = "No searches are left, so I answer from the documents found so far."


def folded_analysis(step: Step) -> str:
    """A step's reflection and analysis as one analysis, in the order the tags format writes them.

    A search step reflects on the documents before it, then plans; an answer step reasons, then concludes.
    So an answer given before any search opens with its analysis ("I read the documents shown with the
    question. They hold ..."), which is where the teachers put the choice between answering and searching.
    """
    parts = (step.analysis, step.reflection) if step.is_final else (step.reflection, step.analysis)
    return " ".join(part for part in parts if part)


class StepFormat(ABC):
    """How one step, the question and a block of documents look as text.

    Implementations must guarantee ``parse_step(render_step(s)) == s`` for every step that
    ``render_step`` accepts, and that ``parse_step`` raises nothing but :class:`FormatError`.
    """

    name: str
    # Each step is its own prompt: the question plus the documents found so far (R2AG's expansion
    # step), not the next turn of a conversation. SFT data then has one example per step.
    expands_from_context: bool = False

    def express(self, step: Step) -> Step:
        """``step`` as this format can write it: a format without a reflection section folds it into the analysis."""
        if step.reflection is None:
            return step
        return Step(folded_analysis(step), query=step.query, answer=step.answer)

    def express_turns(self, turns: Sequence[Turn]) -> list[Turn]:
        """A trajectory as this format writes it (:meth:`express` on every step, documents kept)."""
        return [Turn(self.express(turn.step), turn.documents) for turn in turns]

    def check_turn(self, step: Step, after_documents: bool) -> None:  # noqa: B027 (a hook that accepts by default)
        """Raise FormatError when a well-formed step is out of place (``after_documents``: a retrieval came before).

        Formats whose steps look the same at every position accept everything.
        """

    def read_turn(self, text: str, after_documents: bool) -> Step:
        """The step in one assistant turn at its position (parse_step, then check_turn); raises only FormatError."""
        step = self.parse_step(text)
        self.check_turn(step, after_documents)
        return step

    @abstractmethod
    def system_prompt(self) -> str:
        """The instructions given to the policy as the system message."""

    def stop_strings(self) -> tuple[str, ...]:
        """Text that ends a step early when a model writes on past it (given to the engine as stop strings)."""
        return ()

    def action_end(self, text: str) -> int | None:
        """Where a step ends when the model wrote on past its first action (``EnvConfig.stop_after_action``).

        The index in ``text`` just past the first complete query or answer, when more text follows it; None
        when nothing follows, or when the format cannot tell (then the whole output is parsed as it is).
        Formats whose stop strings already end a step after its action keep this default.
        """
        return None

    def answer_prefix(self) -> str:
        """A final step up to where its answer goes, with :data:`OUT_OF_SEARCHES` as its analysis.

        The environment writes it for the policy once its searches run out (``EnvConfig.answer_at_limit``),
        so the next tokens can only be the answer. ValueError for a format whose steps cannot answer.
        """
        marker = "\x00"
        try:
            text = self.render_step(Step(OUT_OF_SEARCHES, answer=marker))
        except ValueError as error:
            raise ValueError(f"the {self.name} format cannot write an answer step ({error})") from None
        return text[: text.index(marker)].rstrip(" ")  # the answer's first token carries its own space

    @abstractmethod
    def answer_only_prompt(self, with_documents: bool) -> str:
        """Instructions for answering in one final step with no retrieval (the CoT and naive-RAG baselines)."""

    question_prefix = "Question: "
    context_heading = "Documents found so far:"

    def render_question(self, question: str, context: Sequence[Passage] = (), doc_chars: int = 512) -> str:
        """The first user turn: the question on one line after ``question_prefix``.

        ``context``: documents the episode starts from (R2AG's later rounds start from the gold
        documents found so far), numbered under ``context_heading``.
        """
        text = render_prefixed(self.question_prefix, question)
        if context:
            text += f"\n\n{self.context_heading}\n\n{render_document_blocks(context, doc_chars)}"
        return text

    @abstractmethod
    def render_step(self, step: Step) -> str:
        """One assistant turn. Raises ValueError for a step this format cannot express."""

    @abstractmethod
    def parse_step(self, text: str) -> Step:
        """The step in one assistant turn, or FormatError with the reason."""

    @abstractmethod
    def render_documents(self, documents: Sequence[Passage], step_number: int, doc_chars: int) -> str:
        """The environment turn that shows the documents retrieved for step ``step_number``."""

    @abstractmethod
    def parse_documents(self, text: str) -> list[Passage]:
        """The documents of an environment turn rendered by :meth:`render_documents` (ids are their numbers)."""

    def find_question(self, text: str) -> str | None:
        """The question in a rendered prompt (the last one, if several), or None."""
        text = normalize_newlines(text)
        heading = text.rfind(f"\n\n{self.context_heading}\n")
        return find_prefixed(text if heading < 0 else text[:heading], self.question_prefix)

    @abstractmethod
    def find_answer(self, text: str) -> str | None:
        """A lenient search for a final answer in free text (baselines, malformed outputs)."""


_FORMATS: dict[str, Callable[..., StepFormat]] = {}


def register_format(name: str, factory: Callable[..., StepFormat]) -> None:
    """Make a step format available to every config key that selects one."""
    if name in _FORMATS:
        raise ValueError(f"step format {name!r} is already registered")
    _FORMATS[name] = factory


def available_formats() -> list[str]:
    return sorted(_FORMATS)


def get_format(name: str | StepFormat, **options: Any) -> StepFormat:
    """The step format registered under ``name`` (a StepFormat passes through).

    ``options`` are the format's settings (``multi_query``: max_base, max_predicted), from
    ``policy.format_options``.
    """
    if isinstance(name, StepFormat):
        if options:
            raise ValueError("format options go with a format name, not with a StepFormat instance")
        return name
    try:
        factory = _FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown step format {name!r}; choose one of: {', '.join(available_formats())}") from None
    try:
        return factory(**options)
    except TypeError as error:  # an option the format does not have
        raise ValueError(f"step format {name!r} does not take the options {sorted(options)}: {error}") from None


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def strip_thinking(text: str) -> str:
    """``text`` without a reasoning model's leading think block (Qwen3 style), which is not part of the step.

    A think block that never closes (the step's token budget ran out while thinking) is a FormatError.
    """
    body = text.lstrip()
    if not body.startswith(THINK_OPEN):
        return text
    end = body.find(THINK_CLOSE)
    if end < 0:
        raise FormatError(FormatReason.UNCLOSED_TAG, "the think block never closes (raise env.think_tokens?)")
    return body[end + len(THINK_CLOSE) :]


def refuse_reflection(step: Step, name: str) -> None:
    """render_step's check for formats without a reflection section."""
    if step.reflection is not None:
        raise ValueError(f"the {name} format has no reflection section: render format.express(step)")


def refuse_expansion(step: Step, name: str) -> None:
    """render_step's check for the single-query formats: several queries or a stop signal need ``multi_query``."""
    if step.queries or step.predicted or step.stop:
        raise ValueError(f"the {name} format writes one query or an answer per step; use the multi_query format")


def truncate_text(text: str, limit: int) -> str:
    """Cut ``text`` to at most ``limit`` characters plus an ellipsis, at a word boundary if one is near."""
    if limit <= 0:
        raise ValueError(f"doc_chars must be positive, got {limit}")
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ")
    if space >= limit * 0.8:
        cut = cut[:space]
    return cut.rstrip() + " ..."


_DOC_HEADER = re.compile(r"^\[(\d+)\] (.*)$")


def render_document_blocks(documents: Sequence[Passage], doc_chars: int) -> str:
    """Numbered documents, ``[i] title`` then the text cut to ``doc_chars``, separated by blank lines."""
    blocks = []
    for i, doc in enumerate(documents, start=1):
        text = truncate_text(doc.text, doc_chars) if doc.text.strip() else ""
        blocks.append(f"[{i}] {' '.join(doc.title.split()) or '(untitled)'}" + (f"\n{text}" if text else ""))
    return "\n\n".join(blocks)


def parse_document_blocks(body: str) -> list[Passage]:
    """The documents of :func:`render_document_blocks` (their ids are their numbers)."""
    documents: list[Passage] = []
    for block in normalize_newlines(body).split("\n\n"):
        head, _, rest = block.partition("\n")
        match = _DOC_HEADER.match(head)
        if match:
            documents.append(Passage.from_title_text(match.group(1), match.group(2).strip(), rest.strip()))
    return documents


def tag_blocks(
    text: str, block: re.Pattern, any_tag: re.Pattern, after: dict[str, FormatReason]
) -> list[tuple[str, str]]:
    """The (tag, content) blocks of a tag format's turn; FormatError for empty text and for anything between,
    around or inside the blocks.

    ``block`` matches one block with the tag name in group 1 and the content in group 2, or a bare
    marker (group 1 unset: the marker itself is the tag, its content empty). ``any_tag`` matches
    any of the format's tags. ``after`` names the reason for text after a given tag (an action).
    """
    if not isinstance(text, str):
        raise FormatError(FormatReason.EMPTY, f"expected text, got {type(text).__name__}")
    text = normalize_newlines(text)
    if not text.strip():
        raise FormatError(FormatReason.EMPTY, "the output is empty")
    blocks: list[tuple[str, str]] = []
    position = 0
    for match in block.finditer(text):
        _check_gap(text[position : match.start()], blocks, any_tag, after)
        tag, content = match.group(1) or match.group(0), match.group(2) or ""
        if any_tag.search(content):
            raise FormatError(FormatReason.STRAY_TEXT, f"a tag inside <{tag}>: {content.strip()[:80]!r}")
        blocks.append((tag, content.strip()))
        position = match.end()
    _check_gap(text[position:], blocks, any_tag, after)
    return blocks


def _check_gap(gap: str, before: list[tuple[str, str]], any_tag: re.Pattern, after: dict[str, FormatReason]) -> None:
    if not gap.strip():
        return
    tag = any_tag.search(gap)
    if tag is not None and not tag.group(0).startswith("</"):
        raise FormatError(FormatReason.UNCLOSED_TAG, f"{tag.group(0)} is never closed")
    if not before:
        raise FormatError(FormatReason.TEXT_BEFORE_ANALYSIS, f"text before the first tag: {gap.strip()[:80]!r}")
    last = before[-1][0]
    reason = after.get(last, FormatReason.STRAY_TEXT)
    where = f"after {last if last.startswith('<') else f'</{last}>'}" if last in after else "outside the tags"
    raise FormatError(reason, f"text {where}: {gap.strip()[:80]!r}")


def answer_source(with_documents: bool) -> str:
    """What an answer-only prompt tells the model to answer from."""
    return "the documents below and your own knowledge" if with_documents else "your own knowledge"


def render_prefixed(prefix: str, question: str) -> str:
    """``prefix`` then the question on one line (its whitespace collapsed)."""
    question = " ".join(question.split())
    if not question:
        raise ValueError("question is empty")
    return f"{prefix}{question}"


def find_prefixed(text: str, prefix: str) -> str | None:
    """The rest of the last line that starts with ``prefix`` (None if none, or if it is empty)."""
    found = None
    for line in normalize_newlines(text).split("\n"):
        if line.startswith(prefix):
            found = line[len(prefix) :].strip() or None
    return found
