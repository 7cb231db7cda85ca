"""What every episode of one process shares: the renderer, the service clients and their batchers, the scheme.

A :class:`RolloutContext` is made once per event loop (OpenRLHF's rollout actor, the local trainer)
and passed to every :func:`r3_env.rollout.run_episode`. Its retrieval and judge calls go through
:class:`r3_env.batching.Coalescer`, so episodes in flight share batched requests. It checks at
start-up that the scheme and the step format fit together and that the scheme gets what it needs
(a judge, an encoder, a clock), so a misconfigured run fails before its first episode.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r3_env.batching import BatchedSearch, Coalescer
from r3_env.config import ConfigError
from r3_env.data import JsonlWriter, Label
from r3_env.protocol import ChatRenderer, get_format
from r3_env.retrieval.base import Hit
from r3_env.retrieval.client import AsyncRetrievalClient
from r3_env.reward_client import AsyncRewardClient, Judgement, RewardServiceError
from r3_env.rewards import RewardScheme, get_scheme
from r3_env.rollout_config import RolloutConfig


@dataclass
class RolloutStats:
    """Counters for logs and the benchmark: where an episode's time goes."""

    episodes: int = 0
    generation_s: float = 0.0  # awaiting the engine
    wall_s: float = 0.0  # sum of episode wall times
    service_failures: int = 0

    @property
    def environment_s(self) -> float:
        """Parsing, retrieval, rendering, tokenizing feedback, scoring: everything but generation."""
        return self.wall_s - self.generation_s

    @property
    def environment_share(self) -> float:
        return self.environment_s / self.wall_s if self.wall_s else 0.0


class RolloutContext:
    """What every episode of one process shares: renderer, clients, batchers, the scheme and stats.

    Make it inside the event loop that runs the episodes (its batchers belong to that loop).
    ``search`` and ``judge`` may be given directly (an in-process retriever, tests); by default
    they are the HTTP clients of ``config.services``. ``clock`` is the trainer's step, where known.
    """

    def __init__(
        self,
        config: RolloutConfig,
        tokenizer: Any,
        search: Any | None = None,
        judge: AsyncRewardClient | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.config, self.tokenizer, self.clock = config, tokenizer, clock
        self.renderer = ChatRenderer(
            tokenizer,
            get_format(config.policy.step_format, **config.policy.format_options),
            config.policy.chat_template,
            doc_chars=config.env.doc_chars,
        )
        self.scheme: RewardScheme = get_scheme(config.reward.scheme, **config.reward.options)
        self._check_scheme()
        services, wait = config.services, config.services.batch_wait_ms / 1000
        self._retriever = search or AsyncRetrievalClient(
            services.retriever_url, timeout=services.timeout_s, retries=services.retries, backoff=services.backoff_s
        )
        self._judge = judge
        if judge is None and (self.scheme.needs_relevance or self.scheme.needs_correctness):
            self._judge = AsyncRewardClient(
                services.reward_url,
                timeout=services.judge_timeout_s,
                retries=services.retries,
                backoff=services.backoff_s,
            )
        judge_ = self._judge
        # one coalesced request per depth: the policy's queries (env.topk), the question's own (env.question_docs)
        self._search = BatchedSearch(self._retriever, services.max_batch, wait)
        self.search_batcher = self._search.batcher(config.env.topk)
        self.relevance_batcher: Coalescer[dict, Judgement] = Coalescer(
            lambda items: judge_.relevance(items), services.max_batch, wait, "relevance", RewardServiceError
        )
        self.correctness_batcher: Coalescer[dict, Judgement] = Coalescer(
            lambda items: judge_.correctness(items), services.max_batch, wait, "correctness", RewardServiceError
        )
        self.encoder, self.query_prefix = self._query_encoder()
        self.special_ids = set(getattr(tokenizer, "all_special_ids", []))
        self.stats = RolloutStats()
        self._log: JsonlWriter | None = None
        self.run_id = uuid.uuid4().hex[:12]  # tells a resumed run's log rows from the crashed run's
        if config.policy.trajectory_log:
            path = Path(config.policy.trajectory_log.replace("{pid}", str(os.getpid())))
            path.parent.mkdir(parents=True, exist_ok=True)
            self._log = JsonlWriter(path)

    def _check_scheme(self) -> None:
        """The scheme fits the step format and gets the training step it needs: ConfigError otherwise."""
        scheme, config = self.scheme, self.config
        if self.renderer.format.expands_from_context and (
            scheme.needs_relevance or scheme.needs_correctness or scheme.needs_query_similarity
        ):
            raise ConfigError(
                f"reward.scheme {scheme.name!r} judges answers or single queries, but policy.step_format "
                f"{config.policy.step_format!r} steers retrieval with several queries and never answers: "
                "use reward.scheme top_survivor (recipes/r2ag.yaml)"
            )
        if scheme.needs_query_similarity and not config.reward.query_encoder:
            raise ConfigError(
                f"reward scheme {scheme.name!r} compares query embeddings: set reward.query_encoder "
                "to an encoder folder (e5-base-v2, ...) or turn the scheme's diversity option off"
            )
        if scheme.needs_training_step and self.clock is None and not config.reward.episodes_per_step:
            raise ConfigError(
                f"reward scheme {scheme.name!r} changes with the training step: set reward.episodes_per_step "
                "(rollout batch x samples per prompt / number of vLLM engines)"
            )

    def _query_encoder(self) -> tuple[Any, str]:
        """The encoder and query instruction of the schemes that compare query embeddings (None, "" for others)."""
        if not self.scheme.needs_query_similarity:
            return None, ""
        from r3_env.retrieval.config import instruction_prefix
        from r3_env.retrieval.encoder import Encoder

        # a sentence-transformers folder (Qwen3-Embedding, MiniLM) brings its own pooling; plain HF
        # encoders (E5) are mean-pooled, with their family's query instruction
        path = self.config.reward.query_encoder
        encoder = Encoder(path, sentence_transformer=(Path(path) / "modules.json").is_file())
        return encoder, instruction_prefix(None, path, passage=False)

    @property
    def retrieval_busy_s(self) -> float:
        """Seconds spent in batched retrieval calls, at every depth."""
        return self._search.busy_s

    async def search(self, query: str, k: int) -> list[Hit]:
        if k not in (self.config.env.topk, self.config.env.question_docs):
            raise ValueError(f"top-{k} retrieval was asked, but episodes search only env.topk or env.question_docs")
        return await self._search(query, k)

    def query_similarity(self, queries: list[str]) -> float:
        """The mean pairwise cosine similarity of the queries' embeddings (lws's diversity term)."""
        import numpy as np

        vectors = self.encoder.encode([self.query_prefix + query for query in queries])
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        sims = vectors @ vectors.T
        n = len(queries)
        return float((sims.sum() - np.trace(sims)) / (n * (n - 1)))

    def label_problem(self, label: Label) -> str | None:
        """Why ``label`` cannot be scored by the scheme (the episode then gets a neutral reward), or None."""
        if label.problem:
            return label.problem
        if self.scheme.needs_correctness and not label.golden_answers:
            return "its label names no golden answers"
        if self.scheme.needs_gold and not label.gold_ids:
            return "its label names no gold passage ids (gold_ids or metadata.supporting_passage_ids)"
        return None

    def question_of(self, prompt: str, label: Label) -> str:
        """The question: from the label, else from a prompt the renderer made, else the prompt itself."""
        return label.question or self.renderer.question_of(prompt) or prompt.strip()

    @property
    def training_step(self) -> int:
        """The trainer's step as the staged schemes see it.

        OpenRLHF's rollout actors never learn the trainer's step, so there it is counted from the
        episodes this engine ran (``reward.episodes_per_step``, from ``reward.start_step``). A trainer
        that knows its step (the local one) sets :attr:`clock` instead.
        """
        if self.clock is not None:
            return self.clock()
        reward = self.config.reward
        return reward.start_step + (self.stats.episodes // reward.episodes_per_step if reward.episodes_per_step else 0)

    def log(self, record: dict[str, Any]) -> None:
        if self._log is not None:
            self._log.write(record)

    async def aclose(self) -> None:
        for client in (self._retriever, self._judge):
            close = getattr(client, "aclose", None)
            if close is not None:
                await close()
        if self._log is not None:
            self._log.close()
