"""The trajectory record (one JSON line per cold-start sample or evaluated question), and the loop that makes it.

:func:`play` runs an episode against anything that writes the next step from chat messages (a
teacher, an evaluation engine); :func:`episode_fields` is what both records keep of it.

A record keeps each step's analysis (and reflection, in formats that have one), its query or
answer, and the full documents shown after it, so SFT data can be rendered later at any
``doc_chars`` in any chat template. Example::

    {"id": "hotpotqa/q17#2", "question_id": "q17", "dataset": "hotpotqa", "sample": 2,
     "temperature": 1.0, "question": "...", "golden_answers": ["..."], "outcome": "correct",
     "verdict": "match", "answer": "...", "num_steps": 3,
     "steps": [{"analysis": "...", "query": "...", "documents": [{"id": "..", "contents": "title\\ntext"}]},
               ..., {"analysis": "...", "answer": "..."}],
     "usage": {"requests": 3, "prompt_tokens": 2310, "completion_tokens": 180}, "teacher": "deepseek-chat"}

A step's row is :meth:`r3_env.protocol.Step.to_json` (a ``multi_query`` step's are its ``queries``,
``predicted`` and ``stop``), so a record reads back in every step format. An episode that retrieved
with the question first (``env.question_docs``) also keeps those documents, shown with the question,
as ``question_documents``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from r3_env.chat_client import ChatReply
from r3_env.data import Passage
from r3_env.env import RetrievalEnv, StepKind
from r3_env.protocol import MessageRenderer, Step, Turn

# Writes the next step: given the chat so far (rendered by the episode's renderer) and its turns.
StepWriter = Callable[[list[dict[str, str]], list[Turn]], Awaitable[ChatReply]]


def env_turns(env: RetrievalEnv) -> list[Turn]:
    """The well-formed steps of an episode so far, each query with the documents retrieved for it."""
    turns, documents = [], iter(env.documents)
    for record in env.steps:
        if record.kind is StepKind.QUERY:
            turns.append(Turn(record.step, tuple(next(documents))))
        elif record.step is not None:
            turns.append(Turn(record.step))
    return turns


def steps_json(env: RetrievalEnv) -> list[dict[str, Any]]:
    """A finished episode's steps as record rows (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    for turn in env_turns(env):
        row = turn.step.to_json()
        if not turn.step.is_final:
            row["documents"] = [p.to_json() for p in turn.documents]
        rows.append(row)
    return rows


async def play(env: RetrievalEnv, renderer: MessageRenderer, write: StepWriter) -> Counter:
    """Run ``env`` to its end, one written step at a time; returns requests and token usage."""
    usage: Counter = Counter()
    await env.start()
    while not env.done:
        turns = env_turns(env)
        messages = renderer.messages(env.question, turns, context=env.context)
        if env.answer_prefix:  # the searches ran out: the assistant turn is started, the engine continues it
            messages.append({"role": "assistant", "content": env.answer_prefix})
        reply = await write(messages, turns)
        usage.update(requests=1, prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens)
        await env.step(reply.text, closed=reply.finished)
    return usage


def episode_fields(env: RetrievalEnv) -> dict[str, Any]:
    """A finished episode as record fields: steps, answer, step count and, when the last step did not parse,
    ``invalid`` (its output and the reason)."""
    steps = steps_json(env)
    last = env.steps[-1] if env.steps else None
    fields: dict[str, Any] = {"answer": env.answer, "steps": steps, "num_steps": len(steps)}
    if last is not None and last.format_error is not None:
        fields["invalid"] = {"output": last.action, "reason": last.format_error}
        fields["num_steps"] += 1
    fields["format_retries"] = sum(step.format_retries for step in env.steps)
    if env.question_documents:  # shown with the question before the first step (env.question_docs)
        fields["question_documents"] = [p.to_json() for p in env.question_documents]
    return fields


def _passages(documents: Any, where: str) -> tuple[Passage, ...]:
    try:
        return tuple(Passage(str(doc["id"]), str(doc["contents"])) for doc in documents or ())
    except (KeyError, TypeError) as error:
        raise ValueError(f"{where}: documents must be {{'id', 'contents'}} objects ({error!r})") from None


def question_documents_of(row: dict[str, Any], where: str = "trajectory") -> tuple[Passage, ...]:
    """The documents a record's episode showed with its question (``question_documents``; none when absent)."""
    return _passages(row.get("question_documents"), f"{where}: question_documents")


def turns_of(row: dict[str, Any], where: str = "trajectory") -> list[Turn]:
    """The turns of a record's ``steps``; ValueError naming the step and field when malformed."""
    steps = row.get("steps")
    if not isinstance(steps, list) or not steps:
        raise ValueError(f"{where}: 'steps' must be a non-empty list of steps")
    turns = []
    for number, step in enumerate(steps, start=1):
        try:
            parsed = Step.from_json(step)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"{where}: step {number} is malformed ({error}); expected analysis and query, answer or queries"
            ) from None
        turns.append(Turn(parsed, _passages(step.get("documents"), f"{where}: step {number}")))
    if any(turn.step.is_final for turn in turns[:-1]):
        raise ValueError(f"{where}: only the last step may hold the final answer")
    return turns
