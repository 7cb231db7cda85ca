"""The reward server's FastAPI app.

- ``POST /relevance {"items": [{"question", "analysis", "query", "documents": [...]}, ...]}``
- ``POST /correctness {"items": [{"question", "prediction", "golden_answers": [...]}, ...]}``
- ``POST /get_reward {"query": [...], "prompts": [...], "labels": [...]}`` (OpenRLHF's remote reward)
- ``GET /health``, ``GET /metrics``

Every answer has one row per item, in order; a judge failure is a flagged row, not an error.
"""

from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel, Field

from r3_env.protocol import ChatRenderer
from r3_env.rewards import RewardScheme, get_scheme
from r3_env.serving import install_common
from reward_server.config import JudgeConfig, RewardConfig, RewardServiceConfig
from reward_server.judges import CorrectnessItem, Judge, RelevanceItem, make_judge
from reward_server.metrics import RewardMetrics
from reward_server.scoring import correctness, score_transcripts

logger = logging.getLogger(__name__)


class Document(BaseModel):
    title: str = ""
    text: str = ""
    contents: str = ""

    def as_text(self) -> str:
        return self.contents or (f"{self.title}\n{self.text}" if self.title else self.text)


class RelevanceIn(BaseModel):
    question: str
    query: str
    documents: list[str | Document] = Field(description="document texts, or {title, text} / {contents} objects")
    analysis: str = ""


class CorrectnessIn(BaseModel):
    question: str
    prediction: str
    golden_answers: list[str] = Field(min_length=1)


class RelevanceRequest(BaseModel):
    items: list[RelevanceIn] = Field(min_length=1)


class CorrectnessRequest(BaseModel):
    items: list[CorrectnessIn] = Field(min_length=1)


class RewardRequest(BaseModel):
    query: list[str] = Field(
        min_length=1, description="whole transcripts: prompt and response, decoded with special tokens"
    )
    prompts: list[str] | None = None
    labels: list[Any] | None = None


def _policy_renderer(config: RewardConfig) -> ChatRenderer | None:
    if not config.policy_tokenizer:
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.policy_tokenizer)
    return ChatRenderer(tokenizer, config.step_format, config.chat_template)


def create_app(
    judge_config: JudgeConfig,
    reward_config: RewardConfig,
    service: RewardServiceConfig,
    judge: Judge | None = None,
    renderer: ChatRenderer | None = None,
) -> FastAPI:
    """The app; ``judge`` and ``renderer`` default to what the configs describe (tests may pass their own)."""
    metrics = RewardMetrics()
    judge = judge or make_judge(judge_config, metrics)
    renderer = renderer or _policy_renderer(reward_config)
    scheme: RewardScheme = get_scheme(reward_config.scheme, **reward_config.scheme_options)
    started = time.time()

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        status = await judge.status()
        if not status.get("reachable") or status.get("model_listed") is False:
            logger.error("judge %s is not ready: %s (judgements fall back until it is)", judge.backend, status)
        yield
        await judge.close()

    app = FastAPI(title="r3rag reward server", version="1", lifespan=lifespan)
    app.state.judge = judge

    authorize = install_common(
        app, service.api_key, service.max_body_bytes, metrics.requests, metrics.latency, metrics.registry
    )

    def bound(count: int, what: str) -> None:
        if count > service.max_items:
            raise HTTPException(422, f"{count} {what} exceed max_items={service.max_items}; split the request")

    @app.post("/relevance", dependencies=[Depends(authorize)])
    async def relevance(body: RelevanceRequest) -> dict[str, Any]:
        bound(len(body.items), "items")
        items = [
            RelevanceItem(
                i.question, i.query, [d if isinstance(d, str) else d.as_text() for d in i.documents], i.analysis
            )
            for i in body.items
        ]
        results = await judge.relevance(items)
        return {"results": [r.to_json() for r in results]}

    @app.post("/correctness", dependencies=[Depends(authorize)])
    async def correct(body: CorrectnessRequest) -> dict[str, Any]:
        bound(len(body.items), "items")
        items = [CorrectnessItem(i.question, i.prediction, i.golden_answers) for i in body.items]
        return {"results": [v.to_json() for v in await correctness(judge, items, metrics)]}

    @app.post("/get_reward", dependencies=[Depends(authorize)])
    async def get_reward(body: RewardRequest) -> dict[str, Any]:
        bound(len(body.query), "transcripts")
        if renderer is None:
            raise HTTPException(
                503,
                "/get_reward needs reward.policy_tokenizer (the policy's tokenizer, whose chat "
                "template splits transcripts into steps); set it and restart",
            )
        for name in ("prompts", "labels"):
            values = getattr(body, name)
            if values is None or len(values) != len(body.query):
                raise HTTPException(422, f"{name} must list one entry per query ({len(body.query)})")
        return await score_transcripts(
            renderer, judge, scheme, metrics, body.query, body.prompts, body.labels, reward_config.max_steps
        )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "judge": judge.backend,
            "judge_status": await judge.status(),
            "scheme": scheme.name,
            "get_reward": renderer is not None,
            "uptime_s": round(time.time() - started, 1),
        }

    return app
