"""How a trajectory looks as text: one module serves training, cold start, evaluation and the reward server.

- :class:`Step` is a typed step; :func:`parse_step` turns a model output into one or raises
  :class:`FormatError` with a machine-readable :class:`FormatReason`.
- A step format (``"r3"``: R3-RAG's labelled sections; ``"tags"``: Search-R1's tags with a
  reflection, as "Learning when to search" uses them; ``"multi_query"``: R2AG's several
  queries per step and stop signal; ``"react"``) is a named object behind the
  :class:`StepFormat` interface; :func:`get_format` selects it by the config key's value.
- :class:`ChatRenderer` renders prompts, steps and document turns through a tokenizer's chat
  template, prefix-consistently, for OpenRLHF's multi-turn executor and for SFT data.
"""

from collections.abc import Sequence
from typing import Any

from r3_env.answers import clean_answer
from r3_env.data import Passage
from r3_env.protocol import multi_query as _multi_query  # noqa: F401  (registers the "multi_query" format)
from r3_env.protocol import r3 as _r3  # noqa: F401  (registers the "r3" format)
from r3_env.protocol import react as _react  # noqa: F401  (registers the "react" format)
from r3_env.protocol import tags as _tags  # noqa: F401  (registers the "tags" format)
from r3_env.protocol.base import (
    FormatError,
    FormatReason,
    Step,
    StepFormat,
    Turn,
    available_formats,
    get_format,
    register_format,
)
from r3_env.protocol.chat import (
    PLAIN_CHAT_TEMPLATE,
    ChatFrame,
    ChatRenderer,
    ChatTemplateError,
    MessageRenderer,
    ResponseTurn,
    build_messages,
)

DEFAULT_FORMAT = "r3"


def parse_step(text: str, step_format: str | StepFormat = DEFAULT_FORMAT) -> Step:
    """Parse one assistant turn; raises only FormatError."""
    return get_format(step_format).parse_step(text)


def extract_answer(text: str, step_format: str | StepFormat = DEFAULT_FORMAT) -> str | None:
    """The short answer in a model output: the final step's answer, else any answer section found leniently.

    None when the text holds no answer (a query step, or free text without an answer label).
    """
    fmt = get_format(step_format)
    try:
        step = fmt.parse_step(text)
    except FormatError:
        found = fmt.find_answer(text)
        return clean_answer(found) if found else None
    return clean_answer(step.answer) if step.is_final else None


def render_step(step: Step, step_format: str | StepFormat = DEFAULT_FORMAT) -> str:
    """One assistant turn's text (without the chat template's turn end)."""
    return get_format(step_format).render_step(step)


def render_documents(
    documents: Sequence[Passage], step_number: int, doc_chars: int = 512, step_format: str | StepFormat = DEFAULT_FORMAT
) -> str:
    """The numbered document block shown after query step ``step_number``."""
    return get_format(step_format).render_documents(documents, step_number, doc_chars)


def render_prompt(
    question: str, tokenizer: Any, step_format: str | StepFormat = DEFAULT_FORMAT, chat_template: str = "auto"
) -> str:
    """The chat-templated prompt (instructions + question + generation prompt) for ``tokenizer``.

    A one-off convenience: it measures the template each call. Loops hold a :class:`ChatRenderer`.
    """
    return ChatRenderer(tokenizer, step_format, chat_template).prompt(question)


__all__ = [
    "DEFAULT_FORMAT",
    "PLAIN_CHAT_TEMPLATE",
    "ChatFrame",
    "ChatRenderer",
    "ChatTemplateError",
    "FormatError",
    "FormatReason",
    "MessageRenderer",
    "ResponseTurn",
    "Step",
    "StepFormat",
    "Turn",
    "available_formats",
    "build_messages",
    "extract_answer",
    "get_format",
    "parse_step",
    "register_format",
    "render_documents",
    "render_prompt",
    "render_step",
]
