"""Asynchronous client of the reward server's judge endpoints: the only way the environment reaches the judge.

``relevance`` and ``correctness`` send one batched request (``max_batch`` items at most each);
transient failures are retried with backoff (``r3_env.http_retry``). A judge that fails inside
the server comes back as a flagged fallback row, not an error; :class:`RewardServiceError` means
the server itself could not be used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from r3_env.answers import settled_by_string
from r3_env.http_retry import AsyncHTTP, RequestFailed, RetryPolicy, asend_with_retries, bearer_headers

# The bearer token of the reward server, read by the server and this client alike.
API_KEY_ENV = "R3RAG_REWARD_API_KEY"


class RewardServiceError(RuntimeError):
    """The reward server could not answer (unreachable, failing, or it rejected the request)."""


@dataclass(frozen=True)
class Judgement:
    """One row of the reward server's answer: a score and whether it is a fallback for a failed judge."""

    score: float
    fallback: bool = False
    method: str = "judge"  # correctness: "match", "judge", "fallback" or "empty"

    @classmethod
    def of(cls, row: dict[str, Any]) -> Judgement:
        return cls(float(row["score"]), bool(row.get("fallback", False)), str(row.get("method", "judge")))


class AsyncRewardClient:
    """``POST /relevance`` and ``POST /correctness`` of ``r3rag reward serve`` (one shared connection pool)."""

    def __init__(
        self,
        url: str,
        timeout: float = 180.0,
        retries: int = 3,
        backoff: float = 0.5,
        api_key: str | None = None,
        max_batch: int = 512,
        max_connections: int = 16,
    ) -> None:
        if timeout <= 0 or max_batch < 1 or max_connections < 1:
            raise ValueError("timeout must be positive, max_batch and max_connections at least 1")
        self.url = url.rstrip("/")
        self.policy = RetryPolicy(retries=retries, backoff=backoff)
        self.max_batch = max_batch
        self._http = AsyncHTTP(timeout, bearer_headers(api_key, API_KEY_ENV), max_connections)

    async def relevance(self, items: Sequence[dict[str, Any]]) -> list[Judgement]:
        """Items: ``{"question", "analysis", "query", "documents": [text, ...]}``; a score in [0, 1] each."""
        return await self._judge("/relevance", items)

    async def correctness(self, items: Sequence[dict[str, Any]]) -> list[Judgement]:
        """Items: ``{"question", "prediction", "golden_answers"}``; 1.0 (correct) or 0.0 each."""
        return await self._judge("/correctness", items)

    async def _judge(self, path: str, items: Sequence[dict[str, Any]]) -> list[Judgement]:
        chunks = [list(items[i : i + self.max_batch]) for i in range(0, len(items), self.max_batch)]
        answers = await asyncio.gather(*(self._post(path, chunk) for chunk in chunks))
        return [row for answer in answers for row in answer]

    async def _post(self, path: str, items: list[dict[str, Any]]) -> list[Judgement]:
        url = self.url + path
        try:
            reply = await asend_with_retries(
                lambda: self._http.post(url, {"items": items}), self.policy, f"reward server {url}"
            )
        except RequestFailed as failure:
            hint = "; is `r3rag reward serve` running there?" if failure.transport else ""
            raise RewardServiceError(
                f"reward server {url} failed after {failure.attempts} attempts: {failure.detail}{hint}"
            ) from None
        try:
            rows = reply.json()["results"]
            judgements = [Judgement.of(row) for row in rows]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise RewardServiceError(f"reward server {url} sent a malformed answer: {reply.body[:200]!r}") from None
        if len(judgements) != len(items):
            raise RewardServiceError(f"reward server {url} answered {len(judgements)} rows for {len(items)} items")
        return judgements

    async def aclose(self) -> None:
        await self._http.close()


async def check_answer(
    question: str,
    answer: str | None,
    golden_answers: Sequence[str],
    judge: Callable[[dict[str, Any]], Awaitable[Judgement]] | None = None,
) -> Judgement:
    """Is ``answer`` correct? A string match first (free); the judge only for what does not match.

    ``judge`` takes one ``/correctness`` item (a coalesced call to the reward server); without one a
    mismatch is simply wrong. An empty answer is wrong without asking anyone.
    """
    prediction, settled = settled_by_string(answer, golden_answers)
    if settled is not None:
        return Judgement(float(settled), method="match" if settled else "empty")
    if judge is None:
        return Judgement(0.0, method="match")
    return await judge({"question": question, "prediction": prediction, "golden_answers": list(golden_answers)})
