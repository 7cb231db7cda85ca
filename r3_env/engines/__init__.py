"""Token-level generation: the :class:`TokenEngine` contract (:mod:`r3_env.engines.base`) and its implementations."""

from r3_env.engines.base import CompletionOutput, Logprob, RequestOutput, SamplingParams, TokenEngine
from r3_env.engines.hf import HFEngine
from r3_env.engines.vllm_offline import VLLMOfflineEngine
from r3_env.engines.vllm_server import VLLMServerEngine, VLLMServerError

__all__ = [
    "CompletionOutput",
    "HFEngine",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
    "TokenEngine",
    "VLLMOfflineEngine",
    "VLLMServerEngine",
    "VLLMServerError",
]
