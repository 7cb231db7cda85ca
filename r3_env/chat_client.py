"""A client for OpenAI-compatible chat endpoints: the cold-start teacher and the evaluation engine share it.

``POST {base_url}/chat/completions`` (DeepSeek, OpenAI, vLLM, SGLang, ...) with a request rate
limit, retries with backoff on transport errors, 429 and 5xx, and token usage read off each reply.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from r3_env.http_retry import AsyncHTTP, RequestFailed, RetryPolicy, asend_with_retries, bearer_headers


class ChatEndpointError(RuntimeError):
    """The endpoint failed for good, or answered something that is not a chat completion."""


@dataclass(frozen=True)
class ChatReply:
    """One generated turn. ``finished`` is False when the token limit cut it off."""

    text: str
    finished: bool = True
    prompt_tokens: int = 0
    completion_tokens: int = 0


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


class OpenAIChat:
    """Chat completions from one model at one endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 120.0,
        retries: int = 4,
        backoff_s: float = 1.0,
        requests_per_minute: float = 0.0,
        max_connections: int = 64,
        api_key: str = "",
    ) -> None:
        """``api_key``: the key itself; when empty, read from the variable ``api_key_env``."""
        self.model, self.api_key_env = model, api_key_env
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.policy = RetryPolicy(retries=retries, backoff=backoff_s)
        self.limiter = RateLimiter(requests_per_minute / 60.0)
        self.http = AsyncHTTP(timeout_s, bearer_headers(api_key or None, api_key_env), max_connections)

    async def complete(
        self,
        messages: Sequence[dict[str, str]],
        temperature: float,
        max_tokens: int,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
    ) -> ChatReply:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "temperature": temperature,
            "top_p": top_p,
            "max_tokens": max_tokens,
        }
        if stop:
            body["stop"] = list(stop)
        if seed is not None:
            body["seed"] = seed

        async def send():
            await self.limiter.wait()
            return await self.http.post(self.url, body)

        try:
            reply = await asend_with_retries(send, self.policy, self.url)
        except RequestFailed as failure:
            verb = f"failed after {failure.attempts} attempts" if failure.retryable else "rejected the request"
            hint = f" (is the endpoint up and the key in ${self.api_key_env}?)"
            raise ChatEndpointError(
                f"{self.url} {verb}: {failure.detail}"
                + (hint if failure.transport or failure.status in (401, 403) else "")
            ) from None
        return self._parse(reply.body)

    def _parse(self, body: bytes) -> ChatReply:
        try:
            payload: Any = orjson.loads(body)
            choice = payload["choices"][0]
            text = choice["message"]["content"]
            if not isinstance(text, str):
                raise TypeError(text)
            usage = payload.get("usage") or {}
            return ChatReply(
                text,
                finished=choice.get("finish_reason") != "length",
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
            )
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise ChatEndpointError(f"{self.url} sent a malformed chat completion: {body[:200]!r}") from None

    async def aclose(self) -> None:
        await self.http.close()
