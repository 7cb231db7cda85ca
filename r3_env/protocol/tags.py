"""The tag format of Search-R1 and "Learning when to search": think, search, information, reflect, answer.

A trajectory has one of two shapes (docs/recipes/lws.md#rollout-format)::

    <think>...</think> <reflect>...</reflect> <answer>...</answer>              (no retrieval)

    <think>...</think> <search>...</search>                                     (first turn)
    <information>...</information>                                              (the environment)
    <reflect>...</reflect> <think>...</think> <search>...</search>              (more rounds)
    <information>...</information>
    <reflect>...</reflect> <answer>...</answer>                                 (the last turn)

So a search turn is ``[reflect] think search`` and an answer turn ``[think] [reflect] answer``;
:meth:`TagsFormat.check_turn` adds what depends on the position: after documents a turn opens with
a reflection, and an answer always follows one. A :class:`Step`'s analysis is its think block, its
reflection the reflect block. A reasoning model (Qwen3 with thinking) writes its thinking in the
think block itself, so here thinking is the analysis rather than something stripped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from r3_env.data import Passage
from r3_env.protocol.base import (
    FormatError,
    FormatReason,
    Step,
    StepFormat,
    answer_source,
    normalize_newlines,
    parse_document_blocks,
    refuse_expansion,
    register_format,
    render_document_blocks,
    tag_blocks,
)

TAGS = "think|reflect|search|answer|information"
_BLOCK = re.compile(rf"<({TAGS})>(.*?)</\1>", re.DOTALL)
_ANY_TAG = re.compile(rf"</?(?:{TAGS})>")
_EMPTY_REASON = {
    "think": FormatReason.EMPTY_ANALYSIS,
    "reflect": FormatReason.EMPTY_ANALYSIS,
    "search": FormatReason.EMPTY_QUERY,
    "answer": FormatReason.EMPTY_ANSWER,
}


_AFTER = {"search": FormatReason.TEXT_AFTER_QUERY, "answer": FormatReason.TEXT_AFTER_ANSWER}


class TagsFormat(StepFormat):
    """Search-R1's tags plus a reflect block, as "Learning when to search" uses them."""

    name = "tags"

    def express(self, step: Step) -> Step:
        return step

    def check_turn(self, step: Step, after_documents: bool) -> None:
        if after_documents and step.reflection is None:
            raise FormatError(FormatReason.MISSING_REFLECTION, "after <information> a turn opens with <reflect>")
        if step.is_final and step.reflection is None:
            raise FormatError(FormatReason.MISSING_REFLECTION, "an <answer> follows a <reflect>")
        if step.query is not None and step.reflection is not None and not after_documents:
            raise FormatError(FormatReason.MISPLACED_REFLECTION, "nothing was retrieved to reflect on")
        if step.is_final and after_documents and step.analysis:
            raise FormatError(FormatReason.MISPLACED_REFLECTION, "after <information> the <reflect> comes first")
        if step.is_final and not after_documents and not step.analysis:
            raise FormatError(FormatReason.MISSING_ANALYSIS, "an answer without retrieval opens with <think>")

    def system_prompt(self) -> str:
        return (
            "You answer questions by reasoning and, when you need to, searching a document collection.\n"
            "Think inside <think> and </think>. To search, write one query inside <search> and </search>; "
            "the results come back inside <information> and </information>. After reading them, reflect on "
            "what they tell you inside <reflect> and </reflect>, then think and search again, or answer.\n"
            "Write the final answer inside <answer> and </answer>, after a reflection.\n\n"
            "Each reply is one of:\n"
            "<think> ... </think>\n<search> one query </search>\n"
            "<reflect> ... </reflect>\n<think> ... </think>\n<search> one query </search>\n"
            "<reflect> ... </reflect>\n<answer> a short answer </answer>\n"
            "(and, when you answer without searching: <think> ... </think>\n<reflect> ... </reflect>\n"
            "<answer> ... </answer>)\n\n"
            "Search only for what you do not know, one piece of information per query, in a few keywords. "
            "Keep the answer short (a name, a date, a number or yes/no)."
        )

    def stop_strings(self) -> tuple[str, ...]:
        return ("<information>",)  # tag-prompted models go on to imagine the search results

    def answer_only_prompt(self, with_documents: bool) -> str:
        source = answer_source(with_documents)
        return (
            f"Answer the question from {source}, in exactly this layout:\n\n"
            "<think> your reasoning </think>\n<reflect> what you conclude </reflect>\n<answer> a short answer </answer>"
        )

    def render_step(self, step: Step) -> str:
        refuse_expansion(step, self.name)
        for name in ("analysis", "reflection", "query", "answer"):
            value = getattr(step, name)
            if value is not None and _ANY_TAG.search(value):
                raise ValueError(f"step.{name} holds a tag")
        if not (step.query or step.answer):
            raise ValueError("the step's query or answer is empty")
        if step.query is not None:
            if not step.analysis:
                raise ValueError("a search step needs an analysis (its <think> block)")
            parts = [("reflect", step.reflection), ("think", step.analysis), ("search", step.query)]
        else:
            if not step.analysis and step.reflection is None:
                raise ValueError("an answer step needs an analysis or a reflection")
            parts = [("think", step.analysis or None), ("reflect", step.reflection), ("answer", step.answer)]
        return "\n".join(f"<{tag}>{value}</{tag}>" for tag, value in parts if value is not None)

    def parse_step(self, text: str) -> Step:
        blocks = tag_blocks(text, _BLOCK, _ANY_TAG, _AFTER)
        tags = [tag for tag, _ in blocks]
        if not tags:
            raise FormatError(FormatReason.MISSING_ANALYSIS, "no <think> block")
        if "information" in tags:
            raise FormatError(FormatReason.STRAY_TEXT, "<information> is written by the environment")
        searches, answers = tags.count("search"), tags.count("answer")
        if searches and answers:
            raise FormatError(FormatReason.BOTH_QUERY_AND_ANSWER, "a turn searches or answers, not both")
        if searches > 1:
            raise FormatError(FormatReason.MULTIPLE_QUERIES, f"{searches} <search> blocks")
        if answers > 1:
            raise FormatError(FormatReason.MULTIPLE_ANSWERS, f"{answers} <answer> blocks")
        if not searches and not answers:
            raise FormatError(FormatReason.MISSING_ACTION, "neither <search> nor <answer>")
        action = "search" if searches else "answer"
        if tags[-1] != action:
            reason = FormatReason.TEXT_AFTER_QUERY if searches else FormatReason.TEXT_AFTER_ANSWER
            raise FormatError(reason, f"<{tags[-1]}> after </{action}>")
        before = tags[:-1]
        if before.count("think") > 1 or before.count("reflect") > 1:
            raise FormatError(FormatReason.DUPLICATE_ANALYSIS, "one <think> and at most one <reflect> per turn")
        allowed = (["think"], ["reflect", "think"]) if searches else (["think"], ["reflect"], ["think", "reflect"])
        if before not in allowed:
            if not before:
                raise FormatError(FormatReason.MISSING_ANALYSIS, f"<{action}> without a <think> or <reflect> first")
            if searches and "think" not in before:
                raise FormatError(FormatReason.MISSING_ANALYSIS, "a <search> follows a <think>")
            raise FormatError(FormatReason.MISPLACED_REFLECTION, f"the blocks come in the order {before + [action]}")
        content = dict(blocks)
        for tag, value in blocks:
            if not value:
                raise FormatError(_EMPTY_REASON[tag], f"<{tag}> is empty")
        analysis, reflection = content.get("think", ""), content.get("reflect")
        if searches:
            return Step(analysis, query=content["search"], reflection=reflection)
        return Step(analysis, answer=content["answer"], reflection=reflection)

    def render_documents(self, documents: Sequence[Passage], step_number: int, doc_chars: int) -> str:
        body = render_document_blocks(documents, doc_chars) if documents else "(no documents were found)"
        return f"<information>\n{body}\n</information>"

    def parse_documents(self, text: str) -> list[Passage]:
        body = normalize_newlines(text).strip().removeprefix("<information>").removesuffix("</information>")
        return parse_document_blocks(body.strip())

    def find_answer(self, text: str) -> str | None:
        found = re.findall(r"<answer>(.*?)</answer>", normalize_newlines(text), re.DOTALL)
        return found[-1].strip() or None if found else None


register_format("tags", TagsFormat)
