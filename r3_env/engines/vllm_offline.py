"""vLLM's in-process async engine behind the :class:`~r3_env.engines.base.TokenEngine` contract (GPU only)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any


class VLLMOfflineEngine:
    """vLLM's ``AsyncLLMEngine`` in this process, with prefix caching; vLLM batches concurrent requests itself."""

    def __init__(
        self,
        model: str,
        *,
        dtype: str,
        tensor_parallel_size: int,
        gpu_memory_utilization: float,
        max_model_len: int,
        enforce_eager: bool,
        seed: int,
    ) -> None:
        from vllm import AsyncEngineArgs, AsyncLLMEngine

        args = AsyncEngineArgs(
            model=model,
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enable_prefix_caching=True,
            enforce_eager=enforce_eager,
            seed=seed,
        )
        self.engine = AsyncLLMEngine.from_engine_args(args)

    async def generate(self, prompt_token_ids: Sequence[int], sampling_params: Any) -> Any:
        from vllm.inputs import TokensPrompt

        final = None
        prompt = TokensPrompt(prompt_token_ids=list(prompt_token_ids))
        async for output in self.engine.generate(prompt, sampling_params, request_id=uuid.uuid4().hex):
            final = output
        return final

    def shutdown(self) -> None:
        self.engine.shutdown()
