"""The LLM judge: prompts, a bounded and de-duplicated flow of requests, parsing, retries, fallbacks, cache.

Per item: a cached judgement if there is one; else join an identical request already in flight;
else ask the backend (at most ``max_in_flight`` at once). A reply without a score gets one
follow-up asking for the score line; if that fails too, or the judge is unavailable, the result
is the configured fallback, flagged with its reason and counted. Nothing is raised to the caller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from reward_server.cache import JudgementCache, cache_key
from reward_server.config import JudgeConfig
from reward_server.judges.backends import ChatBackend, JudgeUnavailable
from reward_server.judges.base import CorrectnessItem, Judge, JudgeResult, RelevanceItem
from reward_server.judges.parsing import analysis_of, parse_correctness, parse_relevance
from reward_server.judges.prompts import PROMPT_VERSION, correctness_messages, reformat_messages, relevance_messages
from reward_server.metrics import RewardMetrics

logger = logging.getLogger(__name__)


class LLMJudge(Judge):
    def __init__(
        self, backend: ChatBackend, config: JudgeConfig, metrics: RewardMetrics, cache: JudgementCache | None = None
    ) -> None:
        self.chat_backend, self.config, self.metrics, self.cache = backend, config, metrics, cache
        self.backend = backend.model_id
        self._slots = asyncio.Semaphore(config.max_in_flight)
        self._in_flight: dict[str, asyncio.Future] = {}
        self._fallbacks = 0
        # what else shapes a judgement: a change to any of these must not reuse an old cached answer
        self._settings = {
            "snap_to_tenths": config.snap_to_tenths,
            "temperature": config.temperature,
            "max_tokens": config.max_tokens,
            "prompts": PROMPT_VERSION,
        }

    async def relevance(self, items: Sequence[RelevanceItem]) -> list[JudgeResult]:
        snap = self.config.snap_to_tenths

        def parse(text: str) -> float | None:
            return parse_relevance(text, snap)

        return await asyncio.gather(
            *(
                self._judge(
                    "relevance",
                    relevance_messages(i.question, i.analysis, i.query, i.documents, self.config.doc_chars),
                    parse,
                    self.config.relevance_fallback,
                )
                for i in items
            )
        )

    async def correctness(self, items: Sequence[CorrectnessItem]) -> list[JudgeResult]:
        def parse(text: str) -> float | None:
            verdict = parse_correctness(text)
            return None if verdict is None else float(verdict)

        fallback = float(self.config.correctness_fallback)
        return await asyncio.gather(
            *(
                self._judge(
                    "correctness", correctness_messages(i.question, i.prediction, i.golden_answers), parse, fallback
                )
                for i in items
            )
        )

    async def _judge(
        self, kind: str, messages: list[dict[str, str]], parse: Callable[[str], float | None], fallback: float
    ) -> JudgeResult:
        self.metrics.items.labels(kind).inc()
        key = cache_key(kind, self.backend, messages, self._settings)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self.metrics.cache_hits.labels(kind).inc()
                return JudgeResult(hit[0], self.backend, analysis=hit[1], cached=True)
        task = self._in_flight.get(key)
        if task is not None:
            self.metrics.deduplicated.labels(kind).inc()
        else:
            # its own task: a requester that goes away does not cancel it for the others waiting on it
            task = asyncio.ensure_future(self._ask_within_deadline(kind, key, messages, parse, fallback))
            self._in_flight[key] = task
            task.add_done_callback(lambda _: self._in_flight.pop(key, None))
        return await asyncio.shield(task)

    async def _ask_within_deadline(
        self, kind: str, key: str, messages: list[dict[str, str]], parse: Callable[[str], float | None], fallback: float
    ) -> JudgeResult:
        try:
            return await asyncio.wait_for(self._ask(kind, key, messages, parse, fallback), self.config.deadline_s)
        except asyncio.TimeoutError:
            return self._fall_back(kind, fallback, "deadline", f"no judgement within {self.config.deadline_s} s")
        except Exception as error:  # anything unexpected is a judge failure: flagged, never raised
            return self._fall_back(kind, fallback, "judge_error", f"{type(error).__name__}: {error}")

    async def _ask(
        self, kind: str, key: str, messages: list[dict[str, str]], parse: Callable[[str], float | None], fallback: float
    ) -> JudgeResult:
        conversation = messages
        for attempt in range(2):  # the reply, then one follow-up when it has no score
            try:
                reply = await self._call(kind, conversation)
            except JudgeUnavailable as error:
                return self._fall_back(kind, fallback, "judge_unavailable", str(error))
            score = parse(reply)
            if score is not None:
                analysis = analysis_of(reply)
                if self.cache is not None:
                    self.cache.put(key, kind, self.backend, score, analysis)
                return JudgeResult(score, self.backend, analysis=analysis, extra={"attempts": attempt + 1})
            self.metrics.parse_failures.labels(kind).inc()
            conversation = reformat_messages(messages, reply)
        return self._fall_back(kind, fallback, "unparseable", f"no score in the judge's reply: {reply[:200]!r}")

    async def _call(self, kind: str, messages: list[dict[str, str]]) -> str:
        async with self._slots:
            self.metrics.in_flight.inc()
            self.metrics.judge_calls.labels(kind, self.backend).inc()
            started = time.perf_counter()
            try:
                return await self.chat_backend.chat(messages)
            finally:
                self.metrics.judge_latency.labels(kind).observe(time.perf_counter() - started)
                self.metrics.in_flight.dec()

    def _fall_back(self, kind: str, value: float, reason: str, detail: str) -> JudgeResult:
        self.metrics.fallbacks.labels(kind, reason).inc()
        self._fallbacks += 1
        if self._fallbacks <= 5 or self._fallbacks % 100 == 0:  # a judge that is down would flood the log
            logger.warning(
                "%s judgement fell back to %s (%s, %d so far): %s", kind, value, reason, self._fallbacks, detail
            )
        return JudgeResult(value, self.backend, fallback=True, reason=f"{reason}: {detail}")

    async def status(self) -> dict:
        return await self.chat_backend.check()

    async def close(self) -> None:
        await self.chat_backend.close()
        if self.cache is not None:
            self.cache.close()
