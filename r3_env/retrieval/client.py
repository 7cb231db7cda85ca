"""HTTP clients of the retrieval service (sync and async): the only way the environment reaches it.

Both batch queries into ``/retrieve`` calls of at most ``max_batch`` queries, time out, and retry
a bounded number of times with exponential backoff (``r3_env.http_retry``) when the service is
unreachable, overloaded (429) or failing (5xx). A 4xx answer is the caller's mistake and is
raised at once with the service's explanation. The bearer token defaults to
``$R3RAG_RETRIEVER_API_KEY``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import orjson

from r3_env.data import Passage
from r3_env.http_retry import (
    AsyncHTTP,
    Reply,
    RequestFailed,
    RetryPolicy,
    asend_with_retries,
    bearer_headers,
    send_with_retries,
)
from r3_env.retrieval.base import Hit, Retriever, check_k

# The bearer token of the retrieval service, read by the service and the clients alike.
API_KEY_ENV = "R3RAG_RETRIEVER_API_KEY"


class RetrievalServiceError(RuntimeError):
    """The retrieval service could not answer (unreachable, failing, or the request was rejected)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _parse(payload: Any, expected: int) -> list[list[Hit]]:
    result = payload.get("result") if isinstance(payload, dict) else None
    if not isinstance(result, list) or len(result) != expected:
        raise RetrievalServiceError(f"malformed /retrieve answer: expected {expected} result lists")
    try:
        return [
            [
                Hit(Passage(str(item["document"]["id"]), item["document"]["contents"]), float(item["score"]))
                for item in hits
            ]
            for hits in result
        ]
    except (KeyError, TypeError, ValueError):
        raise RetrievalServiceError("malformed /retrieve answer: a row lacks document.id, contents or score") from None


class _Base:
    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        api_key: str | None = None,
        max_batch: int = 512,
        max_connections: int = 64,
    ) -> None:
        if timeout <= 0 or max_batch < 1 or max_connections < 1:
            raise ValueError("timeout must be positive, max_batch and max_connections at least 1")
        self.url = url.rstrip("/")
        self.timeout_s = timeout
        self.policy = RetryPolicy(retries=retries, backoff=backoff)
        self.headers = bearer_headers(api_key, API_KEY_ENV)
        self.max_batch = max_batch
        self.max_connections = max_connections

    def _chunks(self, queries: Sequence[str]) -> list[list[str]]:
        return [list(queries[i : i + self.max_batch]) for i in range(0, len(queries), self.max_batch)]

    def _error(self, failure: RequestFailed) -> RetrievalServiceError:
        if not failure.retryable:
            return RetrievalServiceError(
                f"retrieval service at {self.url} rejected the request: {failure.detail}", failure.status
            )
        if failure.transport:
            return RetrievalServiceError(
                f"retrieval service at {self.url} did not answer after {failure.attempts} "
                f"attempts ({failure.detail}); is `r3rag retriever serve` running there?"
            )
        return RetrievalServiceError(
            f"retrieval service at {self.url} kept failing after {failure.attempts} attempts: {failure.detail}",
            failure.status,
        )

    @contextmanager
    def _failures(self) -> Iterator[None]:
        """Raise a failed request as RetrievalServiceError."""
        try:
            yield
        except RequestFailed as failure:
            raise self._error(failure) from None

    def _decode(self, reply: Reply, what: str) -> Any:
        try:
            return reply.json()
        except orjson.JSONDecodeError:
            raise RetrievalServiceError(f"retrieval service at {self.url} sent {what} that is not JSON") from None

    @staticmethod
    def _body(chunk: list[str], k: int) -> dict[str, Any]:
        return {"queries": chunk, "topk": k, "return_scores": True}


class RetrievalClient(_Base, Retriever):
    """Synchronous client; implements :class:`Retriever`, so it stands in for an in-process retriever."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        # waiting for a pooled connection does not count against the request timeout
        self._http = httpx.Client(
            timeout=httpx.Timeout(self.timeout_s, pool=None),
            headers=self.headers,
            limits=httpx.Limits(max_connections=self.max_connections),
        )

    def _get_json(self, send, what: str) -> Any:
        with self._failures():
            reply = send_with_retries(lambda: Reply.of(send()), self.policy, f"retrieval service {self.url}")
        return self._decode(reply, what)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_k(k)
        hits: list[list[Hit]] = []
        for chunk in self._chunks(queries):
            payload = self._get_json(
                lambda c=chunk: self._http.post(self.url + "/retrieve", json=self._body(c, k)), "an answer"
            )
            hits.extend(_parse(payload, len(chunk)))
        return hits

    def health(self) -> dict[str, Any]:
        return self._get_json(lambda: self._http.get(self.url + "/health"), "a health report")

    def close(self) -> None:
        self._http.close()


class AsyncRetrievalClient(_Base):
    """Asynchronous client for many episodes in flight (one shared connection pool)."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._http = AsyncHTTP(self.timeout_s, self.headers, self.max_connections)

    async def _get_json(self, send, what: str) -> Any:
        with self._failures():
            reply = await asend_with_retries(send, self.policy, f"retrieval service {self.url}")
        return self._decode(reply, what)

    async def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_k(k)
        chunks = self._chunks(queries)
        payloads = await asyncio.gather(
            *(
                self._get_json(lambda c=c: self._http.post(self.url + "/retrieve", self._body(c, k)), "an answer")
                for c in chunks
            )
        )
        return [hits for chunk, payload in zip(chunks, payloads, strict=True) for hits in _parse(payload, len(chunk))]

    async def health(self) -> dict[str, Any]:
        return await self._get_json(lambda: self._http.get(self.url + "/health"), "a health report")

    async def aclose(self) -> None:
        await self._http.close()

    async def __aenter__(self) -> AsyncRetrievalClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncInProcess:
    """An in-process retriever behind the async client's interface (searches run in a worker thread)."""

    def __init__(self, retriever: Retriever) -> None:
        self.retriever = retriever

    async def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return await asyncio.to_thread(self.retriever.search, queries, k)

    async def aclose(self) -> None:
        self.retriever.close()

    async def __aenter__(self) -> AsyncInProcess:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
