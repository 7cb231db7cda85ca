"""Judges behind one interface: an OpenAI-compatible endpoint, a local transformers model, a sentence encoder, or
lexical rules."""

from __future__ import annotations

from reward_server.config import JudgeConfig
from reward_server.judges.base import CorrectnessItem, Judge, JudgeResult, RelevanceItem
from reward_server.metrics import RewardMetrics


def make_judge(config: JudgeConfig, metrics: RewardMetrics) -> Judge:
    """The judge a config describes; LLM judges get the persistent cache when ``cache_path`` is set."""
    if config.backend == "lexical":
        from reward_server.judges.lexical import LexicalJudge

        return LexicalJudge(snap_to_tenths=config.snap_to_tenths)
    if config.backend == "dense":
        from r3_env.model_registry import offline_minilm_path
        from reward_server.judges.dense import DenseJudge

        return DenseJudge(
            config.encoder_path or offline_minilm_path(),
            config.device,
            config.dense_weight,
            config.question_weight,
            snap_to_tenths=config.snap_to_tenths,
        )
    from reward_server.cache import JudgementCache
    from reward_server.judges.backends import LocalHFBackend, OpenAIChatBackend
    from reward_server.judges.llm import LLMJudge

    if config.backend == "openai":
        backend = OpenAIChatBackend(
            config.base_url,
            config.model,
            config.api_key,
            config.timeout_s,
            config.retries,
            config.backoff_s,
            config.temperature,
            config.max_tokens,
            config.max_in_flight,
        )
    else:
        backend = LocalHFBackend(config.model_path, config.device, config.max_tokens)
    cache = JudgementCache(config.cache_path) if config.cache_path else None
    return LLMJudge(backend, config, metrics, cache)


__all__ = ["CorrectnessItem", "Judge", "JudgeResult", "RelevanceItem", "make_judge"]
