"""Coalesce single requests from many concurrent episodes into batched service calls.

Dozens of episodes run in one event loop (OpenRLHF's rollout actor); each wants one retrieval
per step and a few judgements at its end. :class:`Coalescer` collects what they submit for at
most ``max_wait_s`` (or until ``max_batch`` items wait) and sends one batched call, so the
services see a few large requests instead of many small ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from r3_env.retrieval.base import Hit
from r3_env.retrieval.client import RetrievalServiceError

logger = logging.getLogger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")


class Coalescer(Generic[Item, Result]):
    """``await submit(item)`` returns ``call([... item ...])[i]``; one call serves every item waiting.

    A failing call fails every item of its batch with the same exception. Must be used from one
    event loop (the one that first submits).
    """

    def __init__(
        self,
        call: Callable[[list[Item]], Awaitable[Sequence[Result]]],
        max_batch: int = 256,
        max_wait_s: float = 0.005,
        name: str = "batch",
        error: type[Exception] = RuntimeError,
    ) -> None:
        if max_batch < 1 or max_wait_s < 0:
            raise ValueError("max_batch must be at least 1 and max_wait_s 0 or more")
        self.call, self.max_batch, self.max_wait_s, self.name = call, max_batch, max_wait_s, name
        self.error = error  # what a call that answers the wrong number of results raises
        self._pending: list[tuple[Item, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self.calls = 0
        self.items = 0
        self.busy_s = 0.0  # summed duration of the batched calls (the trainer splits its time with it)

    async def submit(self, item: Item) -> Result:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((item, future))
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[Item, asyncio.Future]]) -> None:
        self.calls += 1
        self.items += len(batch)
        started = time.perf_counter()
        try:
            results = await self.call([item for item, _ in batch])
            if len(results) != len(batch):
                raise self.error(f"{self.name}: {len(results)} results for {len(batch)} items")
        except Exception as error:  # every waiter gets the failure; none is left hanging
            self.busy_s += time.perf_counter() - started
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        self.busy_s += time.perf_counter() - started
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    @property
    def mean_batch(self) -> float:
        return self.items / self.calls if self.calls else 0.0


class BatchedSearch:
    """``await search(query, k)``: one coalesced retrieval request per k among the queries in flight."""

    def __init__(self, retriever: Any, max_batch: int = 64, max_wait_s: float = 0.005) -> None:
        self.retriever, self.max_batch, self.max_wait_s = retriever, max_batch, max_wait_s
        self.batchers: dict[int, Coalescer[str, list[Hit]]] = {}

    def batcher(self, k: int) -> Coalescer[str, list[Hit]]:
        """The coalescer of top-``k`` requests (made on first use)."""
        if k not in self.batchers:
            self.batchers[k] = Coalescer(
                lambda queries: self.retriever.search(queries, k),
                self.max_batch,
                self.max_wait_s,
                "retrieval",
                RetrievalServiceError,
            )
        return self.batchers[k]

    @property
    def busy_s(self) -> float:
        """Seconds spent in batched retrieval calls, at every k."""
        return sum(batcher.busy_s for batcher in self.batchers.values())

    async def __call__(self, query: str, k: int) -> list[Hit]:
        return await self.batcher(k).submit(query)
