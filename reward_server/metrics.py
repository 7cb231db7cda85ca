"""The reward server's Prometheus metrics, in a registry of its own (one per app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class RewardMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("r3rag_reward_requests_total", "HTTP requests", ["endpoint", "status"], registry=r)
        self.latency = Histogram(
            "r3rag_reward_request_seconds", "request latency", ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.items = Counter("r3rag_reward_items_total", "items judged", ["kind"], registry=r)
        self.judge_calls = Counter(
            "r3rag_reward_judge_calls_total", "requests sent to the judge", ["kind", "backend"], registry=r
        )
        self.judge_latency = Histogram(
            "r3rag_reward_judge_seconds", "judge request latency", ["kind"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.cache_hits = Counter(
            "r3rag_reward_cache_hits_total", "judgements read from the cache", ["kind"], registry=r
        )
        self.deduplicated = Counter(
            "r3rag_reward_deduplicated_total",
            "items that joined an identical judgement already in flight",
            ["kind"],
            registry=r,
        )
        self.parse_failures = Counter(
            "r3rag_reward_parse_failures_total", "judge replies without a score", ["kind"], registry=r
        )
        self.fallbacks = Counter(
            "r3rag_reward_fallbacks_total", "configured fallback values used", ["kind", "reason"], registry=r
        )
        self.match_answers = Counter(
            "r3rag_reward_match_answers_total", "correctness settled by string match", registry=r
        )
        self.in_flight = Gauge("r3rag_reward_judge_in_flight", "judge requests in flight", registry=r)
