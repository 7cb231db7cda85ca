"""A trajectory as a multi-turn chat transcript, rendered with the policy tokenizer's chat template.

OpenRLHF's multi-turn executor builds a rollout by appending, in token space, the policy's action
and then the environment's feedback to the prompt. SFT data, in turn, is the whole chat rendered
at once. Both agree only if the template is *prefix-consistent*: rendering steps 1..k gives a
prefix of rendering steps 1..k+1. :class:`ChatRenderer` measures the fixed text the template puts
around each turn once (with sentinel contents), checks that consistency, and then renders every
piece (prompt, step, document turn) so that their concatenation equals ``apply_chat_template`` of
the full conversation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from r3_env.data import Passage
from r3_env.protocol.base import Step, StepFormat, Turn, get_format

logger = logging.getLogger(__name__)

# For tokenizers without a chat template. Turns are separated by a blank line and each assistant
# turn ends with the EOS token, which is what the policy learns to emit to end its step.
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ 'Assistant:\n' + message['content'] + eos_token + '\n\n' }}"
    "{% else %}"
    "{{ message['role'] | capitalize + ':\n' + message['content'] + '\n\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:\n' }}{% endif %}"
)

_SENTINELS = (
    "R3SENTINELSYSTEM",
    "R3SENTINELQUESTION",
    "R3SENTINELSTEPA",
    "R3SENTINELDOCSA",
    "R3SENTINELSTEPB",
    "R3SENTINELDOCSB",
)


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot render a prefix-consistent multi-turn transcript."""


@dataclass(frozen=True)
class ChatFrame:
    """The fixed text a chat template puts around turns.

    turn_end: closes an assistant turn; the policy generates it (it is a single stop token).
    observation_open: from after ``turn_end`` to the start of an environment turn's content.
    observation_close: from the end of that content through the next assistant generation prompt.
    system_in_user: the template has no system role, so instructions lead the first user turn.
    prompt_close: from the end of the question through the first generation prompt.
    rewrites_last_turn: the template renders a conversation's last assistant turn differently from
        how it rendered it while generating (Qwen3 adds an empty think block); SFT data must then
        come from :meth:`ChatRenderer.segments`, not from ``apply_chat_template``.
    """

    turn_end: str
    observation_open: str
    observation_close: str
    prompt_close: str = ""
    system_in_user: bool = False
    rewrites_last_turn: bool = False


@dataclass(frozen=True)
class ResponseTurn:
    """One policy action read back from a transcript, and the environment turn that followed it."""

    action: str
    observation: str | None
    closed: bool = True  # the action ended with its stop token


def opening_messages(system: str, user: str, system_in_user: bool) -> list[dict[str, str]]:
    """The system and first user turns; without a system role, the instructions lead the user turn."""
    if system_in_user:
        return [{"role": "user", "content": f"{system}\n\n{user}"}]
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _apply(tokenizer: Any, template: str | None, messages: list[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, chat_template=template
    )


def _locate(text: str, sentinels: tuple[str, ...]) -> list[tuple[int, int]]:
    spans = []
    for sentinel in sentinels:
        start = text.find(sentinel)
        if start < 0 or text.count(sentinel) != 1:
            raise ChatTemplateError(
                f"the chat template drops or repeats a turn's content ({sentinel}); pass chat_template='plain'"
            )
        spans.append((start, start + len(sentinel)))
    if [a for a, _ in spans] != sorted(a for a, _ in spans):
        raise ChatTemplateError("the chat template reorders turns; pass chat_template='plain'")
    return spans


def measure_frame(tokenizer: Any, template: str | None, observation_role: str = "user") -> ChatFrame:
    """Measure and validate the frame of ``template`` (None: the tokenizer's own)."""
    s_sys, s_q, s_a1, s_d1, s_a2, s_d2 = _SENTINELS

    def conversation(system_in_user: bool, with_docs_b: bool) -> list[dict]:
        turns = [
            {"role": "assistant", "content": s_a1},
            {"role": observation_role, "content": s_d1},
            {"role": "assistant", "content": s_a2},
        ]
        if with_docs_b:
            turns.append({"role": observation_role, "content": s_d2})
        return opening_messages(s_sys, s_q, system_in_user) + turns

    # A template without a system role either raises or silently drops the system turn.
    errors = []
    for system_in_user in (False, True):
        try:
            full = _apply(tokenizer, template, conversation(system_in_user, True), add_generation_prompt=True)
        except Exception as error:  # templates report what they cannot render by raising
            errors.append(str(error))
            continue
        if s_sys in full:
            break
        errors.append("the system turn was dropped")
    else:
        raise ChatTemplateError(
            f"the chat template cannot render a system/user/assistant/{observation_role} conversation "
            f"({'; '.join(errors)}); pass chat_template='plain'"
        )

    spans = _locate(full, _SENTINELS)
    after_step_a = full[spans[2][1] : spans[3][0]]
    after_docs_a = full[spans[3][1] : spans[4][0]]
    after_step_b = full[spans[4][1] : spans[5][0]]
    after_docs_b = full[spans[5][1] :]
    if after_step_a != after_step_b or after_docs_a != after_docs_b:
        raise ChatTemplateError(
            "the chat template renders the same kind of turn differently depending on its position "
            f"({after_step_a!r} vs {after_step_b!r}, {after_docs_a!r} vs {after_docs_b!r}), so a growing "
            "transcript is not prefix-consistent; pass chat_template='plain'"
        )
    first = conversation(system_in_user, False)[: 1 if system_in_user else 2]
    if _apply(tokenizer, template, first, add_generation_prompt=True) != full[: spans[2][0]]:
        raise ChatTemplateError(
            "the chat template renders the prompt differently once assistant turns follow it; "
            "pass chat_template='plain'"
        )

    turn_end = _leading_special_token(tokenizer, after_step_a)
    if turn_end is None:
        raise ChatTemplateError(
            f"the chat template does not end an assistant turn with a special token ({after_step_a[:40]!r}), "
            "so the policy has no stop token to end its step; pass chat_template='plain'"
        )
    final = _apply(tokenizer, template, conversation(system_in_user, False), add_generation_prompt=False)
    final_spans = _locate(final, _SENTINELS[:5])
    if not final[final_spans[4][1] :].startswith(turn_end):
        raise ChatTemplateError(
            "the chat template does not end the last assistant turn with the stop token "
            f"{turn_end!r}; pass chat_template='plain'"
        )
    return ChatFrame(
        turn_end=turn_end,
        observation_open=after_step_a[len(turn_end) :],
        observation_close=after_docs_a,
        prompt_close=full[spans[1][1] : spans[2][0]],
        system_in_user=system_in_user,
        rewrites_last_turn=final[: final_spans[4][0]] != full[: spans[4][0]],
    )


def _leading_special_token(tokenizer: Any, text: str) -> str | None:
    specials = sorted(
        set(tokenizer.all_special_tokens) | set(getattr(tokenizer, "added_tokens_encoder", {})), key=len, reverse=True
    )
    for token in specials:
        if token and text.startswith(token):
            return token
    return None


class MessageRenderer:
    """Renders an episode as chat messages, for models behind a chat API (a teacher LLM, an OpenAI endpoint).

    It offers what :class:`r3_env.env.RetrievalEnv` asks of a renderer, with the contents of turns
    instead of template text: ``prompt`` is the first user turn, ``observation`` the user turn that
    shows the documents. The endpoint applies its own chat template.
    """

    def __init__(
        self,
        step_format: str | StepFormat = "r3",
        doc_chars: int = 512,
        observation_role: str = "user",
        system_prompt: str | None = None,
    ) -> None:
        if doc_chars <= 0:
            raise ValueError(f"doc_chars must be positive, got {doc_chars}")
        self.format = get_format(step_format)
        self.doc_chars = doc_chars
        self.observation_role = observation_role
        self.system_prompt = system_prompt if system_prompt is not None else self.format.system_prompt()
        self.system_in_user = False  # a chat template without a system role: instructions lead the question

    def messages(
        self, question: str, turns: Sequence[Turn] = (), context: Sequence[Passage] = ()
    ) -> list[dict[str, str]]:
        """The conversation as chat messages (for chat endpoints and SFT files)."""
        return build_messages(
            question,
            turns,
            self.format,
            self.doc_chars,
            self.observation_role,
            self.system_prompt,
            self.system_in_user,
            context,
        )

    def prompt(self, question: str, context: Sequence[Passage] = ()) -> str:
        return self.format.render_question(question, context, self.doc_chars)

    def step(self, step: Step) -> str:
        return self.format.render_step(step)

    def observation(self, documents: Sequence[Passage], step_number: int, *, action_closed: bool = True) -> str:
        return self.format.render_documents(documents, step_number, self.doc_chars)


class ChatRenderer(MessageRenderer):
    """Renders prompts, steps and document turns for one tokenizer and one step format.

    ``chat_template``: "auto" (the tokenizer's own template, or the plain one if it has none),
    "plain" (:data:`PLAIN_CHAT_TEMPLATE`), or a Jinja template string.
    """

    def __init__(
        self,
        tokenizer: Any,
        step_format: str | StepFormat = "r3",
        chat_template: str = "auto",
        doc_chars: int = 512,
        observation_role: str = "user",
        system_prompt: str | None = None,
    ) -> None:
        super().__init__(step_format, doc_chars, observation_role, system_prompt)
        self.tokenizer = tokenizer
        if chat_template == "plain" or (chat_template == "auto" and not getattr(tokenizer, "chat_template", None)):
            if chat_template == "auto":
                logger.info("tokenizer has no chat template; using the plain template")
            if not tokenizer.eos_token:
                raise ChatTemplateError(
                    "the plain chat template ends assistant turns with the EOS token, "
                    "but the tokenizer has none: set tokenizer.eos_token"
                )
            self.template: str | None = PLAIN_CHAT_TEMPLATE
        elif chat_template == "auto":
            self.template = None
        else:
            self.template = chat_template
        self.frame = measure_frame(tokenizer, self.template, observation_role)
        self.system_in_user = self.frame.system_in_user

    @property
    def stop_token_ids(self) -> list[int]:
        """The token id(s) that end a step: give them to the engine's sampling params."""
        return [self.tokenizer.convert_tokens_to_ids(self.frame.turn_end)]

    def prompt(self, question: str, context: Sequence[Passage] = ()) -> str:
        """The first observation: instructions, question (and ``context`` documents), then the generation prompt."""
        return self.generation_prompt(self.messages(question, context=context))

    def generation_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        """Any conversation through this renderer's chat template, ending with the assistant generation prompt."""
        return _apply(self.tokenizer, self.template, list(messages), add_generation_prompt=True)

    def step(self, step: Step) -> str:
        """One assistant turn as the policy should generate it, stop token included."""
        return self.format.render_step(step) + self.frame.turn_end

    def observation(self, documents: Sequence[Passage], step_number: int, *, action_closed: bool = True) -> str:
        """The environment feedback after a query step, through the next generation prompt.

        ``action_closed=False`` when the action did not end with the stop token (for example it
        stopped on a stop string): the turn end is then supplied here.
        """
        text = self.frame.observation_open + self.format.render_documents(documents, step_number, self.doc_chars)
        text += self.frame.observation_close
        return text if action_closed else self.frame.turn_end + text

    def segments(self, question: str, turns: Sequence[Turn], context: Sequence[Passage] = ()) -> list[tuple[str, bool]]:
        """(text, is_policy_action) pieces whose concatenation is the transcript (``context``: the prompt's documents).

        A query turn is followed by its documents; the transcript of a trajectory ending on a
        query therefore ends with a generation prompt, one ending on an answer with the stop token.
        """
        pieces = [(self.prompt(question, context), False)]
        for number, turn in enumerate(turns, start=1):
            pieces.append((self.step(turn.step), True))
            if not turn.step.is_final:
                pieces.append((self.observation(turn.documents, number), False))
        return pieces

    def transcript(self, question: str, turns: Sequence[Turn], context: Sequence[Passage] = ()) -> str:
        return "".join(text for text, _ in self.segments(question, turns, context))

    def question_of(self, prompt: str) -> str | None:
        """The question in a prompt rendered by :meth:`prompt` (None if it has none)."""
        if self.frame.prompt_close and prompt.endswith(self.frame.prompt_close):
            prompt = prompt[: -len(self.frame.prompt_close)]
        return self.format.find_question(prompt)

    def split_response(self, response: str) -> list[ResponseTurn]:
        """Split what followed the prompt in a transcript into the policy's actions and the environment turns.

        The inverse of :meth:`segments` after the prompt, for transcripts decoded with their special
        tokens (OpenRLHF's remote reward protocol). An action without its stop token (a generation
        cut off by the length limit) is the last turn, with ``closed`` False; anything after the
        last environment turn that is not an action is ignored.
        """
        frame, turns, rest = self.frame, [], response
        while rest:
            end = rest.find(frame.turn_end)
            if end < 0:
                turns.append(ResponseTurn(rest, None, closed=False))
                break
            action, rest = rest[:end], rest[end + len(frame.turn_end) :]
            if not rest.startswith(frame.observation_open):
                turns.append(ResponseTurn(action, None))
                break
            rest = rest[len(frame.observation_open) :]
            close = rest.find(frame.observation_close)
            observation, rest = (
                (rest, "") if close < 0 else (rest[:close], rest[close + len(frame.observation_close) :])
            )
            turns.append(ResponseTurn(action, observation))
        return turns

    def check_tokenization(self, question: str, turns: Sequence[Turn]) -> None:
        """Raise ChatTemplateError unless tokenizing the transcript piecewise equals tokenizing it whole.

        This is what the rollout (which tokenizes prompt and feedback separately) and SFT (which
        tokenizes the whole conversation) both rely on. Run it once at start-up with a real
        trajectory; SentencePiece tokenizers that add a prefix space per call fail it.
        """
        pieces = self.segments(question, turns)
        whole = self._ids("".join(text for text, _ in pieces))
        joined = [token for text, _ in pieces for token in self._ids(text)]
        if whole != joined:
            first = next(
                (i for i, (a, b) in enumerate(zip(whole, joined, strict=False)) if a != b), min(len(whole), len(joined))
            )
            raise ChatTemplateError(
                f"tokenizing the transcript piece by piece differs from tokenizing it whole at token {first} "
                f"({self.tokenizer.decode(whole[max(0, first - 3) : first + 3])!r}); choose another chat template "
                "or a byte-level BPE tokenizer"
            )

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def build_messages(
    question: str,
    turns: Sequence[Turn],
    step_format: str | StepFormat = "r3",
    doc_chars: int = 512,
    observation_role: str = "user",
    system_prompt: str | None = None,
    system_in_user: bool = False,
    context: Sequence[Passage] = (),
) -> list[dict[str, str]]:
    """The chat messages of a (partial) trajectory, in the given step format (``context``: see render_question)."""
    fmt = get_format(step_format)
    system = system_prompt if system_prompt is not None else fmt.system_prompt()
    messages = opening_messages(system, fmt.render_question(question, context, doc_chars), system_in_user)
    for number, turn in enumerate(turns, start=1):
        messages.append({"role": "assistant", "content": fmt.render_step(turn.step)})
        if not turn.step.is_final:
            messages.append(
                {"role": observation_role, "content": fmt.render_documents(turn.documents, number, doc_chars)}
            )
    return messages
