"""ReAct's Thought / Action / Observation format, so the ReAct baseline runs in the same episode loop.

A step is a thought and one action, ``Search[query]`` or ``Finish[answer]``; documents come back
as an observation. Parsing is lenient where ReAct prompts usually are (``Thought 2:`` numbering,
``Action: search[...]`` in any case) and strict about what the loop needs: one thought, one action.
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
    refuse_reflection,
    register_format,
    render_document_blocks,
    strip_thinking,
)

_THOUGHT = re.compile(r"^\s*thought(?:\s*\d+)?\s*:\s*(.*)$", re.IGNORECASE)
_ACTION = re.compile(r"^\s*action(?:\s*\d+)?\s*:\s*(.*)$", re.IGNORECASE)
_CALL = re.compile(r"^(search|finish)\s*\[([^\[\]]*)\]\s*$", re.IGNORECASE)  # no brackets inside: render agrees


class ReActFormat(StepFormat):
    """Thought, then Action: Search[...] or Finish[...] (Yao et al., 2023)."""

    name = "react"

    def system_prompt(self) -> str:
        return (
            "Solve a question-answering task with interleaving Thought, Action and Observation steps.\n"
            "Write exactly one Thought and one Action per reply:\n\n"
            "Thought: <reason about the current situation>\n"
            "Action: Search[<one search query>]   (returns documents as an Observation)\n"
            "or\n"
            "Action: Finish[<a short answer>]   (ends the task)\n\n"
            "Search for one missing piece of information at a time. Keep the answer short "
            "(a name, a date, a number or yes/no)."
        )

    def stop_strings(self) -> tuple[str, ...]:
        return ("\nObservation:",)  # ReAct-prompted models go on to imagine the observation

    def answer_only_prompt(self, with_documents: bool) -> str:
        source = answer_source(with_documents)
        return (
            f"Answer the question from {source}. Think step by step, then finish, in exactly this layout:\n\n"
            "Thought: <your reasoning>\nAction: Finish[<a short answer>]"
        )

    def render_step(self, step: Step) -> str:
        refuse_reflection(step, self.name)
        refuse_expansion(step, self.name)
        if not step.analysis:
            raise ValueError("step.analysis is empty")
        action = step.query if step.query is not None else step.answer
        if "\n" in action or "[" in action or "]" in action:
            raise ValueError("a ReAct action argument must be one line without brackets")
        if any(_THOUGHT.match(line) or _ACTION.match(line) for line in step.analysis.split("\n")):
            raise ValueError("step.analysis has a line that reads as a Thought or Action label")
        verb = "Search" if step.query is not None else "Finish"
        return f"Thought: {step.analysis}\nAction: {verb}[{action}]"

    def parse_step(self, text: str) -> Step:
        if not isinstance(text, str) or not text.strip():
            raise FormatError(FormatReason.EMPTY, "the output is empty")
        text = strip_thinking(normalize_newlines(text))
        if not text.strip():
            raise FormatError(FormatReason.EMPTY, "the output holds only a think block")
        lines = text.strip().split("\n")
        thoughts = [i for i, line in enumerate(lines) if _THOUGHT.match(line)]
        actions = [i for i, line in enumerate(lines) if _ACTION.match(line)]
        if not thoughts:
            raise FormatError(FormatReason.MISSING_ANALYSIS, "no 'Thought:' line")
        if len(thoughts) > 1:
            raise FormatError(FormatReason.DUPLICATE_ANALYSIS, "more than one Thought")
        if not actions:
            raise FormatError(FormatReason.MISSING_ACTION, "no 'Action:' line")
        if len(actions) > 1:
            raise FormatError(FormatReason.MULTIPLE_QUERIES, f"{len(actions)} actions")
        first, action_at = thoughts[0], actions[0]
        if action_at < first:
            raise FormatError(FormatReason.ACTION_BEFORE_ANALYSIS, "the Thought must come first")
        if any(line.strip() for line in lines[:first]):
            raise FormatError(FormatReason.TEXT_BEFORE_ANALYSIS, f"text before the Thought: {lines[0][:80]!r}")
        thought = "\n".join([_THOUGHT.match(lines[first]).group(1), *lines[first + 1 : action_at]]).strip()
        if not thought:
            raise FormatError(FormatReason.EMPTY_ANALYSIS, "the Thought is empty")
        if any(line.strip() for line in lines[action_at + 1 :]):
            raise FormatError(FormatReason.TEXT_AFTER_QUERY, "text after the Action (Observations come from search)")
        call = _CALL.match(_ACTION.match(lines[action_at]).group(1).strip())
        if call is None:
            raise FormatError(
                FormatReason.MISSING_ACTION,
                "the Action is neither Search[...] nor Finish[...] (without inner brackets)",
            )
        verb, argument = call.group(1).lower(), " ".join(call.group(2).split())
        if not argument:
            reason = FormatReason.EMPTY_QUERY if verb == "search" else FormatReason.EMPTY_ANSWER
            raise FormatError(reason, f"{verb.title()}[] is empty")
        return Step(thought, query=argument) if verb == "search" else Step(thought, answer=argument)

    def render_documents(self, documents: Sequence[Passage], step_number: int, doc_chars: int) -> str:
        if not documents:
            return "Observation: no documents were found."
        return "Observation:\n" + render_document_blocks(documents, doc_chars)

    def parse_documents(self, text: str) -> list[Passage]:
        _, _, body = normalize_newlines(text).strip().partition("\n")
        return parse_document_blocks(body)

    def find_answer(self, text: str) -> str | None:
        found = re.findall(r"finish\s*\[([^\]\n]*)\]", normalize_newlines(text), re.IGNORECASE)
        return found[-1].strip() or None if found else None


register_format("react", ReActFormat)
