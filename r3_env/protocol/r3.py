"""The R3-RAG step format: labelled sections, one retrieval query or the final answer per step.

An assistant turn looks like::

    The problem analysis: <reasoning over everything gathered so far>
    The retrieval query: <exactly one query>

or, once the information suffices::

    The problem analysis: <reasoning>
    The final answer: <short answer>

Parsing is strict about structure (it is what the format reward checks) but tolerant of the
cosmetics real models add: label case, markdown bold/headers around labels, a ``Step k:`` line
or prefix, and a query or answer written on the line after its label.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from r3_env.data import Passage
from r3_env.protocol.base import (
    THINK_CLOSE,
    THINK_OPEN,
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

ANALYSIS = "The problem analysis:"
QUERY = "The retrieval query:"
ANSWER = "The final answer:"

_KIND_BY_WORDS = {"problem analysis": "analysis", "retrieval query": "query", "final answer": "answer"}

# A label at the start of a line: optional markdown header marks, an optional "Step k:" on the same
# line, optional bold around the label (closing before or after the colon, or at the end of the
# line), any case, flexible spacing. Group 1: opening bold; 2: the label words; 3/4: closing bold.
_LABEL = re.compile(
    r"^[ \t]*(?:#{1,6}[ \t]*)?(?:(?:\*\*)?[ \t]*step[ \t]*\d+[ \t]*(?:\*\*)?[ \t]*[:.][ \t]*)?"
    r"(\*\*)?[ \t]*the[ \t]+(problem[ \t]+analysis|retrieval[ \t]+query|final[ \t]+answer)[ \t]*"
    r"(?(1)(?:(\*\*)[ \t]*:|:(?:[ \t]*(\*\*))?)|:)",
    re.IGNORECASE,
)
_STEP_HEADER = re.compile(
    r"^[ \t]*(?:#{1,6}[ \t]*)?(?:\*\*)?[ \t]*step[ \t]*\d+[ \t]*(?:\*\*)?[ \t]*[:.]?[ \t]*(?:\*\*)?[ \t]*$", re.I
)
_QUESTION = re.compile(r"[^?]*\?")
_QUOTED = re.compile(r'"[^"]*"|\u201c[^\u201d]*\u201d')


def _label_kind(line: str) -> tuple[str, str] | None:
    """(kind, rest of the line) when ``line`` starts with a label."""
    match = _LABEL.match(line)
    if match is None:
        return None
    words = " ".join(match.group(2).lower().split())
    rest = line[match.end() :]
    if match.group(1) and not (match.group(3) or match.group(4)):  # the whole line is bold
        stripped = rest.rstrip()
        rest = stripped[:-2] if stripped.endswith("**") else rest
    return _KIND_BY_WORDS[words], rest


def _count_questions(query: str) -> int:
    """Questions of two or more words each, e.g. 'Who is A? Where is B?' counts 2; quoted titles are ignored."""
    unquoted = _QUOTED.sub(" quoted ", query)
    return sum(1 for part in _QUESTION.findall(unquoted) if len(re.findall(r"\w+", part)) >= 2)


class R3Format(StepFormat):
    """R3-RAG's labelled-section format (docs/recipes/r3-rag.md#trajectories)."""

    name = "r3"

    def system_prompt(self) -> str:
        return (
            "You answer questions by reasoning step by step and searching a document collection.\n"
            "Write exactly one step per reply, in one of these two layouts:\n\n"
            f"{ANALYSIS} <your reasoning>\n{QUERY} <one search query>\n\n"
            f"{ANALYSIS} <your reasoning>\n{ANSWER} <a short answer>\n\n"
            "How to work:\n"
            "- Begin every step by analysing the question and everything retrieved so far.\n"
            "- If what you have is enough, give the final answer. Otherwise say which piece of "
            "information is missing and write ONE focused query that looks for it.\n"
            "- Break a complex question into simpler ones and resolve them one after another, "
            "or side by side when they do not depend on each other.\n"
            "- If the documents returned do not match your last query, that query was too broad: "
            "split it into narrower ones.\n"
            "- If searching keeps failing, you may answer from your own knowledge.\n"
            "- Keep the final answer short (a name, a date, a number or yes/no) and write in English."
        )

    def answer_only_prompt(self, with_documents: bool) -> str:
        source = answer_source(with_documents)
        return (
            f"Answer the question from {source}. Reason step by step, then give a short answer "
            "(a name, a date, a number or yes/no), in exactly this layout:\n\n"
            f"{ANALYSIS} <your reasoning>\n{ANSWER} <a short answer>"
        )

    def render_step(self, step: Step) -> str:
        refuse_reflection(step, self.name)
        refuse_expansion(step, self.name)
        if not step.analysis:
            raise ValueError("step.analysis is empty")
        for line in step.analysis.split("\n")[1:]:
            if _label_kind(line) is not None:
                raise ValueError(f"step.analysis has a line that reads as a section label: {line!r}")
        action_label, action = (QUERY, step.query) if step.query is not None else (ANSWER, step.answer)
        field = "query" if step.query is not None else "answer"
        if not action:
            raise ValueError(f"step.{field} is empty")
        if "\n" in action:
            raise ValueError(f"step.{field} must be a single line")
        if step.query is not None and _count_questions(step.query) > 1:
            raise ValueError("step.query asks several questions; a step has exactly one query")
        return f"{ANALYSIS} {step.analysis}\n{action_label} {action}"

    def parse_step(self, text: str) -> Step:
        if not isinstance(text, str):
            raise FormatError(FormatReason.EMPTY, f"expected text, got {type(text).__name__}")
        text = strip_thinking(normalize_newlines(text))
        if not text.strip():
            raise FormatError(FormatReason.EMPTY, "the output is empty")

        preamble: list[str] = []
        sections: list[tuple[str, list[str]]] = []
        for line in text.split("\n"):
            labelled = _label_kind(line)
            if labelled is not None:
                kind, rest = labelled
                sections.append((kind, [rest]))
            elif sections:
                sections[-1][1].append(line)
            else:
                preamble.append(line)

        kinds = [kind for kind, _ in sections]
        if "analysis" not in kinds:
            raise FormatError(FormatReason.MISSING_ANALYSIS, f"no '{ANALYSIS}' section")
        if kinds[0] != "analysis":
            raise FormatError(FormatReason.ACTION_BEFORE_ANALYSIS, "the analysis must come first")
        stray = [line.strip() for line in preamble if line.strip()]
        if stray and not (len(stray) == 1 and _STEP_HEADER.match(stray[0])):
            raise FormatError(FormatReason.TEXT_BEFORE_ANALYSIS, f"text before the analysis: {stray[0][:80]!r}")
        if kinds.count("analysis") > 1:
            raise FormatError(FormatReason.DUPLICATE_ANALYSIS, "the analysis section appears more than once")

        analysis = "\n".join(sections[0][1]).strip()
        if not analysis:
            raise FormatError(FormatReason.EMPTY_ANALYSIS, "the analysis is empty")
        n_query, n_answer = kinds.count("query"), kinds.count("answer")
        if n_query == 0 and n_answer == 0:
            raise FormatError(FormatReason.MISSING_ACTION, f"neither '{QUERY}' nor '{ANSWER}'")
        if n_query and n_answer:
            raise FormatError(FormatReason.BOTH_QUERY_AND_ANSWER, "a step has a query or an answer, not both")
        if n_query > 1:
            raise FormatError(FormatReason.MULTIPLE_QUERIES, f"{n_query} query sections")
        if n_answer > 1:
            raise FormatError(FormatReason.MULTIPLE_ANSWERS, f"{n_answer} answer sections")

        kind, lines = sections[1]
        content = [line.strip() for line in lines if line.strip()]
        if kind == "query":
            if not content:
                raise FormatError(FormatReason.EMPTY_QUERY, "the query is empty")
            if len(content) > 1:
                raise FormatError(FormatReason.TEXT_AFTER_QUERY, f"text after the query: {content[1][:80]!r}")
            if _count_questions(content[0]) > 1:
                raise FormatError(FormatReason.MULTIPLE_QUERIES, f"several questions in one query: {content[0][:80]!r}")
            return Step(analysis=analysis, query=content[0])
        if not content:
            raise FormatError(FormatReason.EMPTY_ANSWER, "the final answer is empty")
        if len(content) > 1:
            raise FormatError(FormatReason.TEXT_AFTER_ANSWER, f"text after the answer: {content[1][:80]!r}")
        return Step(analysis=analysis, answer=content[0])

    def action_end(self, text: str) -> int | None:
        """The end of the first query or answer line after the analysis, when more text follows it.

        A query or answer written on the line after its label ends with that line. A think block is skipped;
        an action before any analysis, or an empty one followed by another label, is left to the parser.
        """
        start = 0
        body = text.lstrip()
        if body.startswith(THINK_OPEN):
            close = text.find(THINK_CLOSE)
            if close < 0:
                return None
            start = close + len(THINK_CLOSE)
        analysis = pending = False
        offset = start
        for line in text[start:].split("\n"):
            end = offset + len(line)
            offset = end + 1
            labelled = _label_kind(line.rstrip("\r"))
            if pending:  # the action's label stood alone: its first non-blank line is the action
                if labelled is not None:
                    return None
                if line.strip():
                    return end if text[end:].strip() else None
                continue
            if labelled is None:
                continue
            kind, rest = labelled
            if kind == "analysis":
                analysis = True
            elif not analysis:
                return None
            elif rest.strip():
                return end if text[end:].strip() else None
            else:
                pending = True
        return None

    def render_documents(self, documents: Sequence[Passage], step_number: int, doc_chars: int) -> str:
        header = f"Retrieved documents for step {step_number}:"
        if not documents:
            return f"{header}\n(no documents were found)"
        return header + "\n" + render_document_blocks(documents, doc_chars)

    def parse_documents(self, text: str) -> list[Passage]:
        _, _, body = normalize_newlines(text).strip().partition("\n")  # a header line, then the blocks
        return parse_document_blocks(body)

    def find_answer(self, text: str) -> str | None:
        lines = normalize_newlines(text).split("\n")
        for index in range(len(lines) - 1, -1, -1):
            labelled = _label_kind(lines[index])
            if labelled is None or labelled[0] != "answer":
                continue
            rest = labelled[1].strip()
            if rest:
                return rest
            following = next((line.strip() for line in lines[index + 1 :] if line.strip()), None)
            return following if following is not None and _label_kind(following) is None else None
        return None


register_format("r3", R3Format)
