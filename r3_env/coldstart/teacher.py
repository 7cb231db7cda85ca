"""Teachers write the next step of a trajectory: an LLM behind an OpenAI-compatible chat endpoint, or a script.

Algorithm 1 asks a strong LLM (the paper: DeepSeek-V3) for one step at a time, given the question
and the steps so far as chat messages rendered by :mod:`r3_env.protocol`. :class:`OpenAITeacher`
does that through :class:`r3_env.chat_client.OpenAIChat` (rate limit, retries);
:class:`r3_env.coldstart.scripted.ScriptedTeacher` answers the same request from the synthetic
world's gold decompositions, so the embedded default has cold-start data without any API, and
:class:`r3_env.coldstart.evidence.EvidenceTeacher` from the evidence chains real datasets annotate.
"""

from __future__ import annotations

import random
import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from r3_env.chat_client import ChatEndpointError, ChatReply, OpenAIChat
from r3_env.data import Passage, QAItem
from r3_env.protocol import Step, Turn, get_format


class TeacherError(RuntimeError):
    """The teacher could not give a step (its endpoint failed for good, or answered nonsense)."""


@dataclass(frozen=True)
class TeacherConfig:
    """Which teacher writes the steps, and how to reach it."""

    kind: Literal["openai", "scripted", "evidence"] = field(
        default="scripted",
        metadata={
            "help": "openai (an OpenAI-compatible chat endpoint), scripted (world only) or evidence (the datasets' "
            "annotated evidence chains: 2Wiki, MuSiQue, HotpotQA)"
        },
    )
    base_url: str = field(default="", metadata={"help": "endpoint base URL, e.g. https://api.deepseek.com/v1"})
    model: str = field(default="", metadata={"help": "model name sent to the endpoint, e.g. deepseek-chat"})
    api_key_env: str = field(default="OPENAI_API_KEY", metadata={"help": "environment variable holding the API key"})
    max_tokens: int = field(
        default=512, metadata={"help": "new tokens per teacher step (env.max_step_tokens is the policy's)"}
    )
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling"})
    requests_per_minute: float = field(default=0.0, metadata={"help": "request rate limit (0: none)"})
    timeout_s: float = field(default=120.0, metadata={"help": "per request"})
    retries: int = field(default=4, metadata={"help": "per request, with exponential backoff (429 and 5xx)"})
    backoff_s: float = field(default=1.0, metadata={"help": "first retry delay"})
    detour_rate: float = field(
        default=0.15, metadata={"help": "scripted: share of trajectories that start with a too-broad query"}
    )
    seed: int = field(default=0, metadata={"help": "scripted: random seed of wording and detours"})
    few_shot: str = field(
        default="",
        metadata={
            "help": "openai: a trajectories.jsonl (e.g. the scripted or evidence teacher's) whose first few_shot_count "
            "trajectories the teacher sees as earlier conversations: few-shot prompting for a small teacher model"
        },
    )
    few_shot_count: int = field(default=2, metadata={"help": "openai: example trajectories shown (with few_shot)"})

    def __post_init__(self) -> None:
        if self.few_shot and self.kind != "openai":
            raise ValueError(f"teacher.few_shot prompts a model; teacher.kind {self.kind} writes its own steps")
        if self.few_shot and not Path(self.few_shot).is_file():
            raise ValueError(
                f"teacher.few_shot: {self.few_shot} does not exist; give a trajectories.jsonl of r3rag coldstart synth"
            )
        if self.few_shot_count < 1:
            raise ValueError(f"teacher.few_shot_count must be at least 1, got {self.few_shot_count}")
        if self.kind == "openai" and not (self.base_url and self.model):
            raise ValueError(
                "teacher.kind openai needs teacher.base_url (e.g. https://api.deepseek.com/v1) and teacher.model"
            )
        if self.max_tokens < 1 or self.timeout_s <= 0 or self.retries < 0 or self.requests_per_minute < 0:
            raise ValueError("max_tokens and timeout_s must be positive, retries and requests_per_minute 0 or more")
        if not 0.0 <= self.detour_rate <= 1.0:
            raise ValueError(f"detour_rate must be between 0 and 1, got {self.detour_rate}")


# The first analysis under env.question_docs, in both planning teachers: every chain opens with one
# sentence and then decides in one word, "They hold" (answer now) or "They lack" (search). With one
# shared opening the policy's choice is made at that word, at the data's own odds; with openings worded
# apart, greedy decoding took the direct answers' wording on almost every question.
READ_QUESTION_DOCS = "I read the documents shown with the question."
QUESTION_DOCS_HOLD = f"{READ_QUESTION_DOCS} They hold"  # an answer with no search follows
QUESTION_DOCS_LACK = f"{READ_QUESTION_DOCS} They lack"  # the first search follows
# The same for every step after a search's documents, in the evidence teacher under env.question_docs:
# one sentence, then "Now I have" (the answer follows) or "Next I need" (another search). With the
# step after documents worded three ways, the policy copied its first step's opening instead, and
# repeated its first query.
SEARCH_FOUND = "The search found what I looked for."  # opens every step after a search's documents
FOUND_ALL = "Now I have"  # the answer follows
FOUND_MORE = "Next I need"  # another search follows


@dataclass(frozen=True)
class TeacherRequest:
    """What a teacher sees: the chat so far, and for a scripted teacher the item and the real documents."""

    messages: list[dict[str, str]]
    temperature: float
    item: QAItem
    turns: Sequence[Turn]
    sample: int = 0
    max_steps: int = 5
    context: Sequence[Passage] = ()  # documents shown with the question (env.question_docs)


class Teacher(ABC):
    name: str

    @abstractmethod
    async def next_step(self, request: TeacherRequest) -> ChatReply:
        """The teacher's next step as text; raises TeacherError when it cannot give one."""

    async def aclose(self) -> None:  # noqa: B027 - most teachers hold nothing
        pass


class PlanningTeacher(Teacher):
    """A teacher that decides each step itself (no model), written in the episode's step format."""

    def __init__(self, config: TeacherConfig, step_format: str = "r3") -> None:
        self.config = config
        self.format = get_format(step_format)

    async def next_step(self, request: TeacherRequest) -> ChatReply:
        return ChatReply(self.format.render_step(self.format.express(self.plan(request))))

    def rng(self, request: TeacherRequest) -> random.Random:
        """The wording choices of this question, sample and step (reruns write the same trajectory)."""
        key = f"{self.config.seed}/{request.item.id}/{request.sample}/{len(request.turns)}"
        return random.Random(zlib.crc32(key.encode()))

    @abstractmethod
    def plan(self, request: TeacherRequest) -> Step:
        """The next step."""


class OpenAITeacher(Teacher):
    """A chat model behind an OpenAI-compatible endpoint (DeepSeek, OpenAI, vLLM, SGLang, ...)."""

    def __init__(self, config: TeacherConfig, max_connections: int = 64) -> None:
        self.config = config
        self.name = config.model
        self.chat = OpenAIChat(
            config.base_url,
            config.model,
            config.api_key_env,
            config.timeout_s,
            config.retries,
            config.backoff_s,
            config.requests_per_minute,
            max_connections,
        )

    async def next_step(self, request: TeacherRequest) -> ChatReply:
        try:
            return await self.chat.complete(
                request.messages, request.temperature, self.config.max_tokens, top_p=self.config.top_p
            )
        except ChatEndpointError as error:
            raise TeacherError(f"teacher {error}") from None

    async def aclose(self) -> None:
        await self.chat.aclose()


def make_teacher(config: TeacherConfig, max_connections: int = 64, step_format: str = "r3") -> Teacher:
    if config.kind == "openai":
        return OpenAITeacher(config, max_connections)
    if config.kind == "evidence":
        from r3_env.coldstart.evidence import EvidenceTeacher

        return EvidenceTeacher(config, step_format)
    from r3_env.coldstart.scripted import ScriptedTeacher

    return ScriptedTeacher(config, step_format)
