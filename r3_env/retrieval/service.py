"""The retrieval service: one FastAPI app over any :class:`Retriever`, batched for RL rollouts.

Endpoints:
- ``POST /retrieve {"queries": [...], "topk": k, "return_scores": bool}``: Search-R1's API,
  ``{"result": [[doc, ...], ...]}`` or, with scores, ``[[{"document": doc, "score": s}, ...]]``;
- ``POST /search {"query": str}``: the official R3-RAG scripts' API, a list of docs;
- ``GET /health``; ``GET /metrics`` (Prometheus text).

Concurrent requests are coalesced: while one batch is being searched (in a single worker
thread), the queries that arrive queue up and go to the retriever together as the next batch
(one encoder pass, one faiss or bm25s call). An idle service starts at once; ``batch_window_ms``
optionally holds a batch open a little longer to gather more. An LRU cache answers repeated
(query, k) pairs, and identical queries waiting in the same batch are searched once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from fastapi import Depends, FastAPI, HTTPException, Response
from pydantic import BaseModel, Field

from r3_env.retrieval.base import Hit, Retriever
from r3_env.serving import install_common

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceConfig:
    """How the service listens, batches, caches and bounds requests."""

    host: str = field(default="127.0.0.1", metadata={"help": "bind address (0.0.0.0 exposes it to the network)"})
    port: int = field(default=8000, metadata={"help": "port"})
    api_key: str = field(default="", metadata={"help": "require 'Authorization: Bearer KEY' (empty: no auth)"})
    batch_window_ms: float = field(
        default=0.0,
        metadata={"help": "extra time a batch waits for more queries (0: batches form while the last one runs)"},
    )
    max_batch_queries: int = field(default=512, metadata={"help": "queries per retriever call at most"})
    cache_size: int = field(default=20_000, metadata={"help": "LRU cache entries (0: no cache)"})
    max_queries_per_request: int = field(default=1024, metadata={"help": "limit: queries in one request"})
    max_query_chars: int = field(default=4096, metadata={"help": "limit: characters in one query"})
    max_topk: int = field(default=200, metadata={"help": "limit: topk"})
    max_body_bytes: int = field(default=8_000_000, metadata={"help": "limit: request body size"})

    def __post_init__(self) -> None:
        for name in ("max_batch_queries", "max_queries_per_request", "max_query_chars", "max_topk", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"service.{name} must be at least 1")
        if self.batch_window_ms < 0 or self.cache_size < 0:
            raise ValueError("service.batch_window_ms and service.cache_size must be 0 or more")


class RetrieveRequest(BaseModel):
    queries: list[str] = Field(description="the queries, searched as one batch")
    topk: int | None = Field(default=None, description="documents per query (default: retrieval_topk)")
    return_scores: bool = False


class SearchRequest(BaseModel):
    query: str
    topk: int | None = None


class Metrics:
    """Prometheus counters and histograms in a registry of this app's own."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter(
            "r3rag_retrieval_requests_total", "HTTP requests", ["endpoint", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "r3rag_retrieval_request_seconds",
            "request latency",
            ["endpoint"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.queries = Counter("r3rag_retrieval_queries_total", "queries received", registry=self.registry)
        self.batch_size = Histogram(
            "r3rag_retrieval_batch_queries",
            "queries per retriever call",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "r3rag_retrieval_cache_hits_total", "queries answered from the cache", registry=self.registry
        )
        self.cache_misses = Counter(
            "r3rag_retrieval_cache_misses_total", "queries sent to the retriever", registry=self.registry
        )
        self.documents = Gauge("r3rag_retrieval_documents", "documents in the index", registry=self.registry)


class HitCache:
    """An LRU map from (query, k) to hits; size 0 keeps nothing."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[str, int], list[Hit]] = OrderedDict()

    def get(self, key: tuple[str, int]) -> list[Hit] | None:
        hits = self._entries.get(key)
        if hits is not None:
            self._entries.move_to_end(key)
        return hits

    def put(self, key: tuple[str, int], hits: list[Hit]) -> None:
        if self.size == 0:
            return
        self._entries[key] = hits
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


class BatchingSearcher:
    """Coalesces concurrent searches into batched retriever calls, with an LRU cache in front."""

    def __init__(self, retriever: Retriever, config: ServiceConfig, metrics: Metrics) -> None:
        self.retriever, self.config, self.metrics = retriever, config, metrics
        self.cache = HitCache(config.cache_size)
        self._pending: dict[tuple[str, int], asyncio.Future] = {}
        self._queue: asyncio.Queue[tuple[str, int]] | None = None
        self._worker: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever")

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._spawn()

    def _spawn(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._run())
        self._worker.add_done_callback(self._restart_if_crashed)

    def _restart_if_crashed(self, worker: asyncio.Task) -> None:
        if worker.cancelled():
            return
        logger.error("the batching worker stopped (%r); starting a new one", worker.exception())
        self._spawn()

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        futures: list[asyncio.Future | list[Hit]] = []
        loop = asyncio.get_running_loop()
        for query in queries:
            key = (query, k)
            cached = self.cache.get(key)
            if cached is not None:
                self.metrics.cache_hits.inc()
                futures.append(cached)
                continue
            self.metrics.cache_misses.inc()
            future = self._pending.get(key)
            if future is None:
                future = self._pending[key] = loop.create_future()
                self._queue.put_nowait(key)
            futures.append(future)
        return [item if isinstance(item, list) else await item for item in futures]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        window = self.config.batch_window_ms / 1000
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + window
            while len(batch) < self.config.max_batch_queries:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                except asyncio.TimeoutError:
                    break
            while not self._queue.empty() and len(batch) < self.config.max_batch_queries:
                batch.append(self._queue.get_nowait())
            await self._execute(batch)

    async def _execute(self, batch: list[tuple[str, int]]) -> None:
        by_k: dict[int, list[str]] = {}
        for query, k in batch:
            by_k.setdefault(k, []).append(query)
        loop = asyncio.get_running_loop()
        for k, queries in by_k.items():
            self.metrics.batch_size.observe(len(queries))
            try:
                results = await loop.run_in_executor(self._executor, self.retriever.search, queries, k)
                if len(results) != len(queries):
                    raise RuntimeError(f"the retriever returned {len(results)} result lists for {len(queries)} queries")
            except Exception as error:  # this batch's requests learn of the failure; the service keeps serving
                logger.exception("retriever failed on a batch of %d queries", len(queries))
                self._settle(queries, k, error=error)
            else:
                self._settle(queries, k, results=results)

    def _settle(
        self, queries: list[str], k: int, results: list[list[Hit]] | None = None, error: Exception | None = None
    ) -> None:
        for index, query in enumerate(queries):
            future = self._pending.pop((query, k), None)
            if results is not None:
                self.cache.put((query, k), results[index])
            if future is None or future.done():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(results[index])


def _json(payload: Any) -> Response:
    """Serialise plain JSON data directly with orjson (FastAPI's generic encoder costs milliseconds per answer)."""
    return Response(orjson.dumps(payload), media_type="application/json")


class Searcher(Protocol):
    """What the app searches through: started and stopped with it, answering (queries, k) batches."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]: ...


def create_app(
    retriever: Retriever,
    default_topk: int,
    config: ServiceConfig,
    describe: dict[str, Any] | None = None,
    searcher_factory: Callable[[Retriever, ServiceConfig, Metrics], Searcher] = BatchingSearcher,
) -> FastAPI:
    """The service app over ``retriever``; ``describe`` is echoed by /health.

    ``searcher_factory`` decides how concurrent queries are batched: in this process by default,
    through Ray Serve's ``@serve.batch`` in a Serve replica (``r3_env.retrieval.ray_serve``).
    """
    metrics = Metrics()
    searcher = searcher_factory(retriever, config, metrics)
    started = time.time()
    if hasattr(retriever, "__len__"):
        metrics.documents.set(len(retriever))  # type: ignore[arg-type]

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        searcher.start()
        yield
        await searcher.stop()

    app = FastAPI(title="r3rag retrieval service", version="1", lifespan=lifespan)
    app.state.searcher = searcher

    authorize = install_common(
        app, config.api_key, config.max_body_bytes, metrics.requests, metrics.latency, metrics.registry
    )

    def check(queries: Sequence[str], topk: int | None) -> int:
        k = default_topk if topk is None else topk
        if not queries:
            raise HTTPException(422, "queries is empty; send at least one query")
        if len(queries) > config.max_queries_per_request:
            raise HTTPException(
                422,
                f"{len(queries)} queries exceed max_queries_per_request="
                f"{config.max_queries_per_request}; split the batch",
            )
        if not 1 <= k <= config.max_topk:
            raise HTTPException(422, f"topk must be between 1 and max_topk={config.max_topk}, got {k}")
        for i, query in enumerate(queries):
            if len(query) > config.max_query_chars:
                raise HTTPException(
                    422,
                    f"queries[{i}] has {len(query)} characters, over max_query_chars="
                    f"{config.max_query_chars}; shorten it",
                )
            if not query.strip():
                raise HTTPException(422, f"queries[{i}] is empty")
        return k

    async def _searched(queries: Sequence[str], k: int) -> list[list[Hit]]:
        try:
            return await searcher.search(queries, k)
        except Exception as error:
            raise HTTPException(500, f"the retriever failed: {type(error).__name__}: {error}") from None

    @app.post("/retrieve", dependencies=[Depends(authorize)])
    async def retrieve(body: RetrieveRequest) -> Response:
        k = check(body.queries, body.topk)
        metrics.queries.inc(len(body.queries))
        results = await _searched(body.queries, k)
        if body.return_scores:
            return _json({"result": [[hit.to_json() for hit in hits] for hits in results]})
        return _json({"result": [[hit.passage.to_json() for hit in hits] for hits in results]})

    @app.post("/search", dependencies=[Depends(authorize)])
    async def search(body: SearchRequest) -> Response:
        k = check([body.query], body.topk)
        metrics.queries.inc()
        [hits] = await _searched([body.query], k)
        return _json([hit.passage.to_json() for hit in hits])

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "uptime_s": round(time.time() - started, 1), **(describe or {})}

    return app
