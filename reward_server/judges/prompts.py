"""The judge's prompts (r3rag's own wording) for document relevance and answer correctness."""

from __future__ import annotations

from collections.abc import Sequence

from r3_env.protocol.base import truncate_text

RELEVANCE_SYSTEM = (
    "You grade retrieval for a question-answering agent. The agent reasons step by step and, at each step, "
    "searches for one missing piece of information. Judge whether the documents it got back supply that "
    "piece. Write one or two sentences of justification, then end with a line of the form "
    "'Relevance: x.xx', a number from 0.00 to 1.00."
)

CORRECTNESS_SYSTEM = (
    "You check answers to questions. Decide whether the predicted answer means the same as at least one "
    "reference answer: the same entity, date, number or yes/no, whatever the wording. Extra correct detail "
    "is fine; a different or only partly matching answer is not. Write one sentence of justification, then "
    "end with a line of the form 'Correct: True' or 'Correct: False'."
)

# Bump when a prompt changes, so cached judgements of the old prompts are not reused.
PROMPT_VERSION = 1

REFORMAT = "Your reply did not end with the required line. Reply with that line only."


def relevance_messages(
    question: str, analysis: str, query: str, documents: Sequence[str], doc_chars: int
) -> list[dict[str, str]]:
    shown = "\n".join(f"[{i}] {truncate_text(doc, doc_chars)}" for i, doc in enumerate(documents, start=1))
    user = (
        f"Question: {question}\n"
        f"The agent's reasoning at this step: {analysis or '(none given)'}\n"
        f"The agent's search query: {query}\n"
        f"Documents returned:\n{shown or '(none)'}\n\n"
        "Scale: 1.00 = the documents give exactly the information the query asks for; 0.50 = partly, or "
        "closely related background; 0.00 = nothing useful. End with 'Relevance: x.xx'."
    )
    return [{"role": "system", "content": RELEVANCE_SYSTEM}, {"role": "user", "content": user}]


def correctness_messages(question: str, prediction: str, golden_answers: Sequence[str]) -> list[dict[str, str]]:
    user = (
        f"Question: {question}\n"
        f"Reference answers: {' | '.join(golden_answers)}\n"
        f"Predicted answer: {prediction}\n\n"
        "Is the predicted answer correct? End with 'Correct: True' or 'Correct: False'."
    )
    return [{"role": "system", "content": CORRECTNESS_SYSTEM}, {"role": "user", "content": user}]


def reformat_messages(messages: list[dict[str, str]], reply: str) -> list[dict[str, str]]:
    """The conversation asking once more for the missing score line."""
    return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": REFORMAT}]
