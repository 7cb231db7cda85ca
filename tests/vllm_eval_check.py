"""Run ``r3rag eval run``'s code with the offline vLLM engine (vLLM's CPU build), from .venv-vllm.

    .venv-vllm/bin/python tests/vllm_eval_check.py DATA OUT MODEL RETRIEVER_URL

Run by tests/test_eval_vllm.py. .venv-vllm holds r3rag without its dependencies (setup_vllm.sh), so
the run is called directly, with the retrieval service's URL, rather than through the ``r3rag``
command, whose other subcommands import packages only .venv has.
"""

from __future__ import annotations

import asyncio
import os
import sys

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")


def main() -> None:
    from eval.engines import EngineConfig, GenerationConfig
    from eval.run import EvalRunConfig, format_stats, run_eval
    from r3_env.env import EnvConfig
    from r3_env.runs import RetrievalSource

    data, out, model, retriever_url = sys.argv[1:5]
    engine = EngineConfig(kind="vllm", model=model, dtype="float32", max_model_len=4096, enforce_eager=True)
    config = EvalRunConfig(data=data, out=out, max_questions=4, concurrency=4)
    stats = asyncio.run(
        run_eval(config, EnvConfig(max_steps=3, max_step_tokens=48), engine, GenerationConfig(),
                 RetrievalSource(url=retriever_url))
    )  # fmt: skip
    print(format_stats(stats, out))


if __name__ == "__main__":
    main()
