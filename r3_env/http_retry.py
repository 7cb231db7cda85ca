"""HTTP calls to r3rag's services and the judge: bounded retries with backoff, sync (httpx) and async (aiohttp).

Connection errors, timeouts, 429 and 5xx are retried; any other 4xx is the caller's mistake and
fails at once. The final error keeps the last status and the service's own explanation.

The async side uses aiohttp: with dozens of requests in flight (rollouts, judging) httpx's async
pool costs several times more per request than the server spends answering it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import orjson

logger = logging.getLogger(__name__)

TRANSPORT_ERRORS = (httpx.TransportError, aiohttp.ClientError, asyncio.TimeoutError)


def bearer_headers(api_key: str | None, env_var: str) -> dict[str, str]:
    """The Authorization header for ``api_key``, or ``$env_var`` when it is None; none without a key."""
    api_key = api_key if api_key is not None else os.environ.get(env_var)
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 8.0

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff < 0 or self.max_backoff < 0:
            raise ValueError("retries, backoff and max_backoff must be 0 or more")

    def delay(self, attempt: int) -> float:
        return min(self.max_backoff, self.backoff * 2**attempt)


@dataclass(frozen=True)
class Reply:
    """An HTTP answer, whichever client fetched it."""

    status: int
    body: bytes

    @classmethod
    def of(cls, response: httpx.Response) -> Reply:
        return cls(response.status_code, response.content)

    def json(self) -> Any:
        return orjson.loads(self.body)

    def detail(self) -> str:
        try:
            body = self.json()
            detail = body.get("detail", body) if isinstance(body, dict) else body
        except orjson.JSONDecodeError:
            detail = self.body.decode("utf-8", "replace")
        return str(detail)[:500]


class RequestFailed(Exception):
    """The request failed for good. ``retryable`` is False for a rejection (a 4xx other than 429)."""

    def __init__(self, detail: str, status: int | None, retryable: bool, attempts: int, transport: bool) -> None:
        super().__init__(detail)
        self.detail, self.status, self.retryable, self.attempts, self.transport = (
            detail,
            status,
            retryable,
            attempts,
            transport,
        )


def _problem(reply: Reply | None, error: BaseException | None, attempt: int) -> RequestFailed | None:
    if reply is None:
        return RequestFailed(f"{type(error).__name__}: {error}".rstrip(": "), None, True, attempt + 1, True)
    if reply.status < 300:
        return None
    retryable = reply.status == 429 or reply.status >= 500
    return RequestFailed(f"HTTP {reply.status}: {reply.detail()}", reply.status, retryable, attempt + 1, False)


def send_with_retries(send: Callable[[], Reply], policy: RetryPolicy, what: str) -> Reply:
    """``send()`` until it succeeds, retrying what is worth retrying; raises RequestFailed."""
    for attempt in range(policy.retries + 1):
        try:
            reply, error = send(), None
        except TRANSPORT_ERRORS as caught:
            reply, error = None, caught
        problem = _problem(reply, error, attempt)
        if problem is None:
            return reply
        if not problem.retryable or attempt == policy.retries:
            raise problem
        logger.warning("%s: %s; retrying in %.1f s", what, problem.detail, policy.delay(attempt))
        time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")


async def asend_with_retries(send: Callable[[], Awaitable[Reply]], policy: RetryPolicy, what: str) -> Reply:
    """The asynchronous twin of :func:`send_with_retries`."""
    for attempt in range(policy.retries + 1):
        try:
            reply, error = await send(), None
        except TRANSPORT_ERRORS as caught:
            reply, error = None, caught
        problem = _problem(reply, error, attempt)
        if problem is None:
            return reply
        if not problem.retryable or attempt == policy.retries:
            raise problem
        logger.warning("%s: %s; retrying in %.1f s", what, problem.detail, policy.delay(attempt))
        await asyncio.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")


class AsyncHTTP:
    """An aiohttp session opened lazily in the running event loop (one pool for many requests in flight).

    ``timeout`` bounds connecting and each read; waiting for a free pooled connection is not counted.
    """

    def __init__(self, timeout: float, headers: dict[str, str], max_connections: int) -> None:
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        self.headers, self.max_connections = headers, max_connections
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self.timeout, headers=self.headers, connector=aiohttp.TCPConnector(limit=self.max_connections)
            )
        return self._session

    async def post(self, url: str, payload: Any, timeout: float | None = None) -> Reply:
        extra = {"timeout": aiohttp.ClientTimeout(total=timeout)} if timeout else {}
        async with self._open().post(
            url, data=orjson.dumps(payload), headers={"Content-Type": "application/json"}, **extra
        ) as response:
            return Reply(response.status, await response.read())

    async def get(self, url: str, timeout: float | None = None) -> Reply:
        extra = {"timeout": aiohttp.ClientTimeout(total=timeout)} if timeout else {}
        async with self._open().get(url, **extra) as response:
            return Reply(response.status, await response.read())

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
