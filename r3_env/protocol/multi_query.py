"""R2AG's expansion step: a reasoning block, several single-hop queries, and a stop signal.

One step of the retrieval steering model (docs/recipes/r2ag.md#the-retrieval-tree) is::

    <think>what is known, what is missing</think>
    <base-query>one single-hop query</base-query>            (0 to max_base)
    <predicted-query>a guessed later hop</predicted-query>  (0 to max_predicted, after a base query)
    <stop-retrieval>                                         (optional: no retrieval after this step)

A step writes at least one query or the stop signal. Base queries are each expected to match one
gold document; predicted ("anticipatory") queries guess a later hop from the model's own
knowledge. Each query retrieves its own top-k (k = 1 in training) and starts a branch of the
retrieval tree (:mod:`r3_env.tree`). The steering model never answers: a reader answers from
the documents the tree collected, so this format has no answer section.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from r3_env.data import Passage
from r3_env.protocol.base import (
    FormatError,
    FormatReason,
    Step,
    StepFormat,
    folded_analysis,
    normalize_newlines,
    parse_document_blocks,
    register_format,
    render_document_blocks,
    tag_blocks,
)
from r3_env.recipes import r2ag_agent

THINK, BASE, PREDICTED, STOP = "think", "base-query", "predicted-query", "<stop-retrieval>"
_BLOCK = re.compile(rf"<({THINK}|{BASE}|{PREDICTED})>(.*?)</\1>|{re.escape(STOP)}", re.DOTALL)
_AFTER = dict.fromkeys((BASE, PREDICTED, STOP), FormatReason.TEXT_AFTER_QUERY)
_ANY_TAG = re.compile(rf"</?(?:{THINK}|{BASE}|{PREDICTED})>|{re.escape(STOP)}")
_DOCUMENTS = "Documents retrieved at step {n}:"


class MultiQueryFormat(StepFormat):
    """R2AG's think / base-query / predicted-query / stop-retrieval step; limits are the format's options
    (``get_format("multi_query")`` takes those it is not given from R2AG's recipe: :func:`multi_query_format`)."""

    name = "multi_query"
    expands_from_context = True

    def __init__(self, max_base: int, max_predicted: int) -> None:
        if max_base < 1 or max_predicted < 0:
            raise ValueError(
                f"multi_query: max_base must be at least 1 and max_predicted 0 or more, got {max_base}, {max_predicted}"
            )
        self.max_base, self.max_predicted = max_base, max_predicted

    def express(self, step: Step) -> Step:
        """A single-query step as one base query; an answer as the stop signal (enough was found to answer)."""
        if step.query is None and step.answer is None:
            return step
        analysis = folded_analysis(step)
        if step.query is not None:
            return Step(analysis, queries=(step.query,))
        return Step(analysis or "The documents found so far are enough to answer.", stop=True)

    def system_prompt(self) -> str:
        predicted = (
            f"Then, optionally, up to {self.max_predicted} predicted queries inside <{PREDICTED}> and </{PREDICTED}>: "
            "later hops you can guess from what you already know, before the documents confirm them.\n"
            if self.max_predicted
            else ""
        )
        return (
            "You steer a search engine to collect every document needed to answer a multi-hop question. "
            "You do not answer it.\n"
            f"First reason inside <{THINK}> and </{THINK}> about what the documents found so far establish and "
            "what is still missing.\n"
            f"Then write up to {self.max_base} base queries, each inside <{BASE}> and </{BASE}>: one single-hop "
            "query per missing fact, each meant to find one document. Independent facts get separate queries.\n"
            f"{predicted}"
            f"When the documents found so far (with this step's queries) hold everything needed, write {STOP} "
            "at the end; write it alone, after your reasoning, when nothing more is needed.\n\n"
            "Example:\n"
            f"<{THINK}>The question needs the director of the film and the director's birthplace.</{THINK}>\n"
            f"<{BASE}>Hestolvale Tower film director</{BASE}>\n"
            + (f"<{PREDICTED}>Marta Kell birthplace</{PREDICTED}>\n" if self.max_predicted else "")
        )

    def answer_only_prompt(self, with_documents: bool) -> str:
        raise ValueError(
            "the multi_query format steers retrieval and never answers: answer with a reader in another format "
            "(eval run --reader_format r3)"
        )

    def render_step(self, step: Step) -> str:
        if step.query is not None or step.answer is not None or step.reflection is not None:
            raise ValueError("a multi_query step has queries=, predicted= and stop=: render format.express(step)")
        if not step.analysis:
            raise ValueError("a multi_query step needs an analysis (its <think> block)")
        problem = self._count_problem(len(step.queries), len(step.predicted))
        if problem is not None:
            raise ValueError(problem[1])
        for value in (step.analysis, *step.searches):
            if not value or _ANY_TAG.search(value):
                raise ValueError(f"a query or the analysis is empty or holds a tag: {value!r}")
        lines = [f"<{THINK}>{step.analysis}</{THINK}>"]
        lines += [f"<{BASE}>{query}</{BASE}>" for query in step.queries]
        lines += [f"<{PREDICTED}>{query}</{PREDICTED}>" for query in step.predicted]
        if step.stop:
            lines.append(STOP)
        return "\n".join(lines)

    def _count_problem(self, base: int, predicted: int) -> tuple[FormatReason, str] | None:
        if base > self.max_base:
            limit = f"at most {self.max_base} (format_options.max_base)"
            return FormatReason.MULTIPLE_QUERIES, f"{base} base queries; {limit}"
        if predicted > self.max_predicted:
            limit = f"at most {self.max_predicted} (format_options.max_predicted)"
            return FormatReason.MULTIPLE_QUERIES, f"{predicted} predicted queries; {limit}"
        if predicted and not base:
            return FormatReason.MISSING_ACTION, "predicted queries follow at least one base query"
        return None

    def parse_step(self, text: str) -> Step:
        blocks = tag_blocks(text, _BLOCK, _ANY_TAG, _AFTER)
        if not blocks or blocks[0][0] != THINK:
            if any(tag == THINK for tag, _ in blocks):
                raise FormatError(FormatReason.ACTION_BEFORE_ANALYSIS, f"a query or {STOP} before <{THINK}>")
            raise FormatError(FormatReason.MISSING_ANALYSIS, f"no <{THINK}> block")
        tags = [tag for tag, _ in blocks]
        if tags.count(THINK) > 1:
            raise FormatError(FormatReason.DUPLICATE_ANALYSIS, f"{tags.count(THINK)} <{THINK}> blocks")
        if tags.count(STOP) > 1 or (STOP in tags and tags[-1] != STOP):
            raise FormatError(FormatReason.TEXT_AFTER_QUERY, f"{STOP} ends the step")
        kinds = [tag for tag in tags[1:] if tag != STOP]
        if kinds != sorted(kinds, key=(BASE, PREDICTED).index):
            raise FormatError(FormatReason.STRAY_TEXT, "base queries come before predicted ones")
        for tag, value in blocks:
            if tag != STOP and not value:
                reason = FormatReason.EMPTY_ANALYSIS if tag == THINK else FormatReason.EMPTY_QUERY
                raise FormatError(reason, f"<{tag}> is empty")
        base = tuple(value for tag, value in blocks if tag == BASE)
        predicted = tuple(value for tag, value in blocks if tag == PREDICTED)
        if not base and not predicted and STOP not in tags:
            raise FormatError(FormatReason.MISSING_ACTION, f"neither a query nor {STOP}")
        problem = self._count_problem(len(base), len(predicted))
        if problem is not None:
            raise FormatError(*problem)
        return Step(blocks[0][1], queries=base, predicted=predicted, stop=STOP in tags)

    def render_documents(self, documents: Sequence[Passage], step_number: int, doc_chars: int) -> str:
        body = render_document_blocks(documents, doc_chars) if documents else "(no documents were found)"
        return f"{_DOCUMENTS.format(n=step_number)}\n\n{body}"

    def parse_documents(self, text: str) -> list[Passage]:
        head, _, body = normalize_newlines(text).strip().partition("\n\n")
        return parse_document_blocks(body if head.startswith("Documents retrieved at step") else text)

    def find_answer(self, text: str) -> str | None:
        return None  # the steering model never answers


def multi_query_format(**options: Any) -> MultiQueryFormat:
    """The format with ``options`` over R2AG's recipe's limits (recipes/r2ag.yaml: policy.format_options)."""
    return MultiQueryFormat(**{**r2ag_agent().policy.format_options, **options})


register_format("multi_query", multi_query_format)
