"""Bounded retries with exponential backoff, for every HTTP call r3rag makes to a service.

Connection errors, timeouts, 429 and 5xx are retried; any other 4xx is the caller's mistake and
fails at once. The final error keeps the last status and the service's own explanation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

logger = logging.getLogger(__name__)


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


def response_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
        detail = body.get("detail", body) if isinstance(body, dict) else body
    except ValueError:
        detail = response.text
    return str(detail)[:500]


def _problem(response: httpx.Response | None, error: Exception | None, attempt: int) -> RequestFailed | None:
    if response is None:
        return RequestFailed(f"{type(error).__name__}: {error}".rstrip(": "), None, True, attempt + 1, True)
    if response.status_code < 300:
        return None
    retryable = response.status_code == 429 or response.status_code >= 500
    return RequestFailed(
        f"HTTP {response.status_code}: {response_detail(response)}", response.status_code, retryable, attempt + 1, False
    )


def send_with_retries(send: Callable[[], httpx.Response], policy: RetryPolicy, what: str) -> httpx.Response:
    """``send()`` until it succeeds, retrying what is worth retrying; raises RequestFailed."""
    for attempt in range(policy.retries + 1):
        try:
            response, error = send(), None
        except httpx.TransportError as caught:
            response, error = None, caught
        problem = _problem(response, error, attempt)
        if problem is None:
            return response
        if not problem.retryable or attempt == policy.retries:
            raise problem
        logger.warning("%s: %s; retrying in %.1f s", what, problem.detail, policy.delay(attempt))
        time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")


async def asend_with_retries(
    send: Callable[[], Awaitable[httpx.Response]], policy: RetryPolicy, what: str
) -> httpx.Response:
    """The asynchronous twin of :func:`send_with_retries`."""
    for attempt in range(policy.retries + 1):
        try:
            response, error = await send(), None
        except httpx.TransportError as caught:
            response, error = None, caught
        problem = _problem(response, error, attempt)
        if problem is None:
            return response
        if not problem.retryable or attempt == policy.retries:
            raise problem
        logger.warning("%s: %s; retrying in %.1f s", what, problem.detail, policy.delay(attempt))
        await asyncio.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")
