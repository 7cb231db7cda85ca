"""Algorithm 2: cold-start trajectories as SFT data for OpenRLHF's SFT trainer.

Two forms, both chat messages rendered by :mod:`r3_env.protocol` (the policy's chat template is
applied by OpenRLHF with ``--data.apply_chat_template``):

- ``transcript`` (default): one row per trajectory, ``{"messages": [...]}``, for
  ``--data.multiturn``: the loss falls on every assistant step and never on the documents. Its
  tokens are the tokens the RL environment builds for the same trajectory.
- ``per_step`` (the paper's form): one row per step, ``{"prompt": [...history...], "response":
  [step]}``, for ``--data.input_key prompt --data.output_key response``.

A format whose steps are each their own prompt (``multi_query``, R2AG's expansion step) has no
conversation: each step becomes one example whose prompt is the question with the documents the
trajectory found before it (``context``), in either form.

With ``tokenizer`` set, the chat template is checked (prefix consistency, piecewise tokenization,
no rewriting of the last turn) and examples longer than ``max_length`` tokens are dropped and
counted instead of being silently truncated by the trainer.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from r3_env.data import Passage, iter_jsonl, write_jsonl
from r3_env.protocol import ChatRenderer, FormatError, MessageRenderer, StepFormat, Turn
from r3_env.records import question_documents_of, turns_of

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTDataConfig:
    input: str = field(default="", metadata={"help": "trajectories.jsonl from r3rag coldstart synth"})
    out: str = field(default="", metadata={"help": "SFT .jsonl to write (default: sft_{form}.jsonl beside the input)"})
    form: Literal["transcript", "per_step"] = field(
        default="transcript", metadata={"help": "transcript (multi-turn, loss on every step) or per_step"}
    )
    step_format: str = field(default="r3", metadata={"help": "step format of the policy"})
    doc_chars: int = field(default=512, metadata={"help": "characters per document, as in RL (env.doc_chars)"})
    tokenizer: str = field(default="", metadata={"help": "policy tokenizer folder: check the template, measure"})
    chat_template: str = field(default="auto", metadata={"help": "auto, plain, or a Jinja template (as in RL)"})
    max_length: int = field(default=4096, metadata={"help": "with a tokenizer: drop longer examples (tokens)"})

    def __post_init__(self) -> None:
        if not self.input:
            raise ValueError("input is required: the trajectories.jsonl written by r3rag coldstart synth")
        if self.doc_chars < 1 or self.max_length < 8:
            raise ValueError("doc_chars must be positive and max_length at least 8")

    @property
    def out_path(self) -> Path:
        return Path(self.out) if self.out else Path(self.input).with_name(f"sft_{self.form}.jsonl")


def load_renderer(config: SFTDataConfig) -> MessageRenderer:
    if not config.tokenizer:
        return MessageRenderer(config.step_format, doc_chars=config.doc_chars)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)
    except (OSError, ValueError) as error:
        first = str(error).strip().split("\n")[0]
        raise ValueError(
            f"tokenizer {config.tokenizer!r} could not be loaded ({first}); give the policy's HF folder "
            "(tokenizer.json and tokenizer_config.json), or leave tokenizer empty to skip the checks"
        ) from None
    renderer = ChatRenderer(tokenizer, config.step_format, config.chat_template, doc_chars=config.doc_chars)
    if renderer.frame.rewrites_last_turn:
        raise ValueError(
            f"{config.tokenizer}: its chat template renders a conversation's last assistant turn differently "
            "from how the policy generates it, so OpenRLHF's SFT data would not match RL; set chat_template "
            "to 'plain' or to a template without that rewrite"
        )
    return renderer


def fit_format(turns: list[Turn], fmt: StepFormat, where: str) -> list[Turn]:
    """The turns as ``fmt`` writes them (reflections folded where it has none), each checked at its position."""
    fitted = fmt.express_turns(turns)
    for number, turn in enumerate(fitted, start=1):
        try:
            fmt.check_turn(turn.step, after_documents=number > 1)
        except FormatError as error:
            raise ValueError(
                f"{where}: step {number} does not fit the {fmt.name!r} format ({error}): the trajectories were "
                f"written in another step format; synthesize them with --step_format {fmt.name}"
            ) from None
    return fitted


def expansions(
    question: str, turns: list[Turn], renderer: MessageRenderer, context: Sequence[Passage] = ()
) -> list[list[dict[str, str]]]:
    """One conversation per step for formats that expand from context: the question, the documents
    shown with it (``context``) and found by the earlier steps, then the step."""
    conversations, found = [], {p.id: p for p in context}
    for turn in turns:
        messages = renderer.messages(question, context=list(found.values()))
        conversations.append([*messages, {"role": "assistant", "content": renderer.format.render_step(turn.step)}])
        found.update((p.id, p) for p in turn.documents)
    return conversations


def examples(
    question: str,
    turns: list[Turn],
    renderer: MessageRenderer,
    form: str,
    row_id: str,
    context: Sequence[Passage] = (),
) -> Iterator[dict[str, Any]]:
    """The SFT rows of one trajectory, in the given form (``context``: documents shown with the question)."""
    if renderer.format.expands_from_context:
        for number, messages in enumerate(expansions(question, turns, renderer, context), start=1):
            if form == "transcript":
                yield {"id": f"{row_id}#step{number}", "messages": messages}
            else:
                yield {"id": f"{row_id}#step{number}", "prompt": messages[:-1], "response": messages[-1:]}
        return
    messages = renderer.messages(question, turns, context=context)
    if form == "transcript":
        yield {"id": row_id, "messages": messages}
        return
    assistant = [i for i, message in enumerate(messages) if message["role"] == "assistant"]
    for number, index in enumerate(assistant, start=1):
        yield {"id": f"{row_id}#step{number}", "prompt": messages[:index], "response": [messages[index]]}


def build_sft_data(config: SFTDataConfig) -> dict[str, Any]:
    """Write the SFT file; returns counts and token lengths."""
    renderer = load_renderer(config)
    counts: Counter = Counter()
    lengths: list[int] = []
    checked = False

    def rows() -> Iterator[dict[str, Any]]:
        nonlocal checked
        for number, row in tqdm(iter_jsonl(config.input), desc="sft data", unit=" trajectories", mininterval=1.0):
            where = f"{config.input}:{number}"
            if row.get("outcome", "correct") != "correct":
                counts["skipped_not_correct"] += 1
                continue
            if not isinstance(row.get("question"), str) or not row["question"].strip():
                raise ValueError(f"{where}: field 'question' must be a non-empty string")
            turns = fit_format(turns_of(row, where), renderer.format, where)
            context = question_documents_of(row, where)
            if not turns[-1].step.is_final:
                raise ValueError(f"{where}: the last step has no final answer; SFT data needs complete trajectories")
            counts["trajectories"] += 1
            if isinstance(renderer, ChatRenderer):
                if not checked:
                    renderer.check_tokenization(row["question"], turns)
                    checked = True
                if renderer.format.expands_from_context:  # one example per step: the longest one counts
                    conversations = expansions(row["question"], turns, renderer, context)
                    texts = [
                        renderer.generation_prompt(messages[:-1]) + renderer.step(turn.step)
                        for messages, turn in zip(conversations, turns, strict=True)
                    ]
                else:
                    texts = [renderer.transcript(row["question"], turns, context)]
                tokens = max(len(renderer.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts)
                if tokens > config.max_length:
                    counts["dropped_too_long"] += 1
                    continue
                lengths.append(tokens)
            row_id = str(row.get("id", number))
            for example in examples(row["question"], turns, renderer, config.form, row_id, context):
                example["dataset"] = row.get("dataset", "")
                yield example

    written = write_jsonl(config.out_path, rows(), desc="SFT examples")
    stats: dict[str, Any] = {"out": str(config.out_path), "form": config.form, **counts, "examples": written}
    if isinstance(renderer, ChatRenderer) and renderer.template is not None:
        # OpenRLHF applies the tokenizer's own template unless given this one (--data.tokenizer_chat_template)
        template = config.out_path.with_suffix(".chat_template.jinja")
        template.write_text(renderer.template)
        stats["chat_template_file"] = str(template)
    if lengths:
        ordered = sorted(lengths)
        stats["tokens"] = {
            "mean": sum(ordered) / len(ordered),
            "p50": ordered[len(ordered) // 2],
            "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
            "max": ordered[-1],
        }
    if counts["dropped_too_long"]:
        logger.warning("dropped %d trajectories longer than %d tokens", counts["dropped_too_long"], config.max_length)
    return stats


def openrlhf_flags(form: str) -> str:
    """The OpenRLHF SFT dataset flags that read this form."""
    if form == "transcript":
        return "--data.input_key messages --data.apply_chat_template --data.multiturn"
    return "--data.input_key prompt --data.output_key response --data.apply_chat_template"


def format_stats(stats: dict[str, Any]) -> str:
    lines = [
        f"SFT data ({stats['form']}) -> {stats['out']}",
        f"  trajectories {stats.get('trajectories', 0):,}, examples {stats['examples']:,}, "
        f"skipped (not correct) {stats.get('skipped_not_correct', 0):,}, "
        f"dropped (too long) {stats.get('dropped_too_long', 0):,}",
    ]
    if "tokens" in stats:
        t = stats["tokens"]
        lines.append(f"  tokens per trajectory: mean {t['mean']:.0f}, p50 {t['p50']}, p95 {t['p95']}, max {t['max']}")
    flags = openrlhf_flags(stats["form"])
    if "chat_template_file" in stats:
        flags += f' --data.tokenizer_chat_template "$(cat {stats["chat_template_file"]})"'
    lines.append(f"  OpenRLHF: --data.dataset {stats['out']} {flags}")
    return "\n".join(lines)
