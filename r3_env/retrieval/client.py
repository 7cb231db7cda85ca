"""HTTP clients of the retrieval service (sync and async): the only way the environment reaches it.

Both batch queries into ``/retrieve`` calls of at most ``max_batch`` queries, time out, and retry
a bounded number of times with exponential backoff when the service is unreachable, overloaded
(429) or failing (5xx). A 4xx answer is the caller's mistake and is raised at once with the
service's explanation. The bearer token defaults to ``$R3RAG_RETRIEVER_API_KEY``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from r3_env.data import Passage
from r3_env.retrieval.base import Hit, Retriever, check_k

logger = logging.getLogger(__name__)

# The bearer token of the retrieval service, read by the service and the clients alike.
API_KEY_ENV = "R3RAG_RETRIEVER_API_KEY"


class RetrievalServiceError(RuntimeError):
    """The retrieval service could not answer (unreachable, failing, or the request was rejected)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 8.0

    def delay(self, attempt: int) -> float:
        return min(self.max_backoff, self.backoff * 2**attempt)


def _parse(payload: dict[str, Any], expected: int) -> list[list[Hit]]:
    result = payload.get("result")
    if not isinstance(result, list) or len(result) != expected:
        raise RetrievalServiceError(f"malformed /retrieve answer: expected {expected} result lists")
    return [
        [Hit(Passage(str(item["document"]["id"]), item["document"]["contents"]), float(item["score"])) for item in hits]
        for hits in result
    ]


def _retryable(response: httpx.Response) -> bool:
    return response.status_code == 429 or response.status_code >= 500


def _rejection(url: str, response: httpx.Response) -> RetrievalServiceError:
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    return RetrievalServiceError(
        f"retrieval service at {url} rejected the request ({response.status_code}): {detail}", response.status_code
    )


class _Base:
    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        api_key: str | None = None,
        max_batch: int = 512,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.policy = RetryPolicy(retries=retries, backoff=backoff)
        api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.max_batch = max_batch

    def _chunks(self, queries: Sequence[str]) -> list[list[str]]:
        return [list(queries[i : i + self.max_batch]) for i in range(0, len(queries), self.max_batch)]

    def _outcome(self, response: httpx.Response | None, error: Exception | None) -> tuple[Any, str | None]:
        """(payload, None) on success, (None, why) when worth retrying; raises when the request was rejected."""
        if response is None:
            return None, str(error)
        if response.status_code == 200:
            return response.json(), None
        if not _retryable(response):
            raise _rejection(self.url, response)
        return None, f"HTTP {response.status_code}"

    def _unreachable(self, attempts: int, error: Exception | str) -> RetrievalServiceError:
        return RetrievalServiceError(
            f"retrieval service at {self.url} did not answer after {attempts} attempts "
            f"({error}); is `r3rag retriever serve` running there?"
        )


class RetrievalClient(_Base, Retriever):
    """Synchronous client; implements :class:`Retriever`, so it stands in for an in-process retriever."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._http = httpx.Client(timeout=self.timeout, headers=self.headers)

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        why = "no attempt"
        for attempt in range(self.policy.retries + 1):
            try:
                response, error = self._http.post(self.url + path, json=body), None
            except httpx.TransportError as caught:
                response, error = None, caught
            payload, why = self._outcome(response, error)
            if why is None:
                return payload
            if attempt < self.policy.retries:
                logger.warning(
                    "retrieval service %s: %s; retrying in %.1f s", self.url, why, self.policy.delay(attempt)
                )
                time.sleep(self.policy.delay(attempt))
        raise self._unreachable(self.policy.retries + 1, why)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_k(k)
        hits: list[list[Hit]] = []
        for chunk in self._chunks(queries):
            payload = self._post("/retrieve", {"queries": chunk, "topk": k, "return_scores": True})
            hits.extend(_parse(payload, len(chunk)))
        return hits

    def health(self) -> dict[str, Any]:
        try:
            response = self._http.get(self.url + "/health")
        except httpx.TransportError as error:
            raise self._unreachable(1, error) from None
        if response.status_code != 200:
            raise _rejection(self.url, response)
        return response.json()

    def close(self) -> None:
        self._http.close()


class AsyncRetrievalClient(_Base):
    """Asynchronous client for many episodes in flight (one shared connection pool)."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._http = httpx.AsyncClient(
            timeout=self.timeout,
            headers=self.headers,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        why = "no attempt"
        for attempt in range(self.policy.retries + 1):
            try:
                response, error = await self._http.post(self.url + path, json=body), None
            except httpx.TransportError as caught:
                response, error = None, caught
            payload, why = self._outcome(response, error)
            if why is None:
                return payload
            if attempt < self.policy.retries:
                logger.warning(
                    "retrieval service %s: %s; retrying in %.1f s", self.url, why, self.policy.delay(attempt)
                )
                await asyncio.sleep(self.policy.delay(attempt))
        raise self._unreachable(self.policy.retries + 1, why)

    async def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_k(k)
        chunks = self._chunks(queries)
        payloads = await asyncio.gather(
            *(self._post("/retrieve", {"queries": c, "topk": k, "return_scores": True}) for c in chunks)
        )
        return [hits for chunk, payload in zip(chunks, payloads, strict=True) for hits in _parse(payload, len(chunk))]

    async def aclose(self) -> None:
        await self._http.aclose()
