"""Teachers write the next step of a trajectory: an LLM behind an OpenAI-compatible chat endpoint, or a script.

Algorithm 1 asks a strong LLM (the paper: DeepSeek-V3) for one step at a time, given the question
and the steps so far as chat messages rendered by :mod:`r3_env.protocol`. :class:`OpenAITeacher`
does that over ``POST {base_url}/chat/completions`` with a request rate limit and retries;
:class:`r3_env.coldstart.scripted.ScriptedTeacher` answers the same request from the synthetic
world's gold decompositions, so the embedded default has cold-start data without any API.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from r3_env.data import QAItem
from r3_env.http_retry import AsyncHTTP, RequestFailed, RetryPolicy, asend_with_retries, bearer_headers
from r3_env.protocol import Turn


class TeacherError(RuntimeError):
    """The teacher could not give a step (its endpoint failed for good, or answered nonsense)."""


@dataclass(frozen=True)
class TeacherConfig:
    """Which teacher writes the steps, and how to reach it."""

    kind: Literal["openai", "scripted"] = field(
        default="scripted", metadata={"help": "openai (an OpenAI-compatible chat endpoint) or scripted (world only)"}
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

    def __post_init__(self) -> None:
        if self.kind == "openai" and not (self.base_url and self.model):
            raise ValueError(
                "teacher.kind openai needs teacher.base_url (e.g. https://api.deepseek.com/v1) and teacher.model"
            )
        if self.max_tokens < 1 or self.timeout_s <= 0 or self.retries < 0 or self.requests_per_minute < 0:
            raise ValueError("max_tokens and timeout_s must be positive, retries and requests_per_minute 0 or more")
        if not 0.0 <= self.detour_rate <= 1.0:
            raise ValueError(f"detour_rate must be between 0 and 1, got {self.detour_rate}")


@dataclass(frozen=True)
class TeacherRequest:
    """What a teacher sees: the chat so far, and for a scripted teacher the item and the real documents."""

    messages: list[dict[str, str]]
    temperature: float
    item: QAItem
    turns: Sequence[Turn]
    sample: int = 0
    max_steps: int = 5


@dataclass(frozen=True)
class TeacherReply:
    text: str
    finished: bool = True  # False: cut off by the token limit
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Teacher(ABC):
    name: str

    @abstractmethod
    async def next_step(self, request: TeacherRequest) -> TeacherReply:
        """The teacher's next step as text; raises TeacherError when it cannot give one."""

    async def aclose(self) -> None:  # noqa: B027 - most teachers hold nothing
        pass


class RateLimiter:
    """Spaces calls at least ``1 / rate`` seconds apart (``rate`` per second; 0: no limit)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        if not self.interval:
            return
        async with self._lock:
            now = time.monotonic()
            slot = max(now, self._next)
            self._next = slot + self.interval
        if slot > now:
            await asyncio.sleep(slot - now)


class OpenAITeacher(Teacher):
    """A chat model behind ``POST {base_url}/chat/completions`` (DeepSeek, OpenAI, vLLM, SGLang, ...)."""

    def __init__(self, config: TeacherConfig, max_connections: int = 64) -> None:
        self.config = config
        self.name = config.model
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self.policy = RetryPolicy(retries=config.retries, backoff=config.backoff_s)
        self.limiter = RateLimiter(config.requests_per_minute / 60.0)
        self._http = AsyncHTTP(config.timeout_s, bearer_headers(None, config.api_key_env), max_connections)

    async def next_step(self, request: TeacherRequest) -> TeacherReply:
        body = {
            "model": self.config.model,
            "messages": request.messages,
            "temperature": request.temperature,
            "top_p": self.config.top_p,
            "max_tokens": self.config.max_tokens,
        }

        async def send():
            await self.limiter.wait()
            return await self._http.post(self.url, body)

        try:
            reply = await asend_with_retries(send, self.policy, f"teacher {self.url}")
        except RequestFailed as failure:
            hint = " (is the endpoint up and the key in $" + self.config.api_key_env + "?)"
            raise TeacherError(
                f"teacher {self.url} failed after {failure.attempts} attempts: {failure.detail}"
                + (hint if failure.transport or failure.status in (401, 403) else "")
            ) from None
        return self._parse(reply.body)

    def _parse(self, body: bytes) -> TeacherReply:
        try:
            payload: Any = orjson.loads(body)
            choice = payload["choices"][0]
            text = choice["message"]["content"]
            if not isinstance(text, str):
                raise TypeError(text)
            usage = payload.get("usage") or {}
            return TeacherReply(
                text,
                finished=choice.get("finish_reason") != "length",
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
            )
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise TeacherError(f"teacher {self.url} sent a malformed chat completion: {body[:200]!r}") from None

    async def aclose(self) -> None:
        await self._http.close()


def make_teacher(config: TeacherConfig, max_connections: int = 64, step_format: str = "r3") -> Teacher:
    if config.kind == "openai":
        return OpenAITeacher(config, max_connections)
    from r3_env.coldstart.scripted import ScriptedTeacher

    return ScriptedTeacher(config, step_format)
