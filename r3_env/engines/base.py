"""The token-level generation contract every rollout engine honours, and the types it speaks.

OpenRLHF's agent executor calls ``await llm_engine.generate(prompt_token_ids, sampling_params)``
and reads a vLLM ``RequestOutput``: ``.outputs[0]`` has ``token_ids``, ``text``, ``finish_reason``
("stop" or "length") and, when ``sampling_params.logprobs`` is set, per-token ``logprobs``.
:class:`TokenEngine` writes that contract down; its implementations live beside it:

- :class:`r3_env.engines.hf.HFEngine`: batched ``model.generate`` on HF transformers (CPU or one GPU);
- :class:`r3_env.engines.vllm_server.VLLMServerEngine`: a vLLM OpenAI-compatible server over HTTP;
- :class:`r3_env.engines.vllm_offline.VLLMOfflineEngine`: vLLM's in-process async engine (GPU);
- vLLM's own ``AsyncLLM`` inside OpenRLHF's rollout actors.

The dataclasses below are the fields of vLLM's types that r3rag reads or writes, for callers without vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class TokenEngine(Protocol):
    """Generates one completion of a prompt given as token ids (OpenRLHF's ``llm_engine`` contract)."""

    async def generate(self, prompt_token_ids: Sequence[int], sampling_params: Any) -> Any:
        """A vLLM-shaped ``RequestOutput`` (or :class:`RequestOutput`) for ``prompt_token_ids``."""
        ...


@dataclass
class SamplingParams:
    """The fields of ``vllm.SamplingParams`` this engine reads (for callers without vLLM)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None
    skip_special_tokens: bool = False
    seed: int | None = None


@dataclass(frozen=True)
class Logprob:
    logprob: float


@dataclass
class CompletionOutput:
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[dict[int, Logprob]] | None = None


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
