"""Seeded sampling through the offline vLLM engine (vLLM's CPU build), from .venv-vllm.

    .venv-vllm/bin/python tests/vllm_sampling_check.py MODEL

Run by tests/test_eval_vllm.py. Concurrent long prompts overflow one scheduler step, so vLLM prefills
some of them in chunks and discards the tokens sampled for the unfinished chunks: with a per-request
seed, vLLM's CPU worker then fails ("CPU Generator does not use offset"), which is how rft's sampling
died on the world. Prints one line per completion.
"""

from __future__ import annotations

import asyncio
import os
import sys

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")


async def sample(model: str) -> list[str]:
    from eval.engines import EngineConfig, GenerationConfig, make_chat_engine

    engine = make_chat_engine(
        EngineConfig(kind="vllm", model=model, dtype="float32", max_model_len=4096, enforce_eager=True),
        GenerationConfig(temperature=0.8, seed=3),
    )
    prompts = [" ".join(f"word{number}x{k}" for k in range(350)) for number in range(8)]
    try:
        completions = await asyncio.gather(*(engine.complete(prompt, 16) for prompt in prompts))
    finally:
        await engine.aclose()
    return [f"{completion.prompt_tokens} {completion.completion_tokens}" for completion in completions]


if __name__ == "__main__":
    print("\n".join(asyncio.run(sample(sys.argv[1]))))
