"""``python -m r3_env.openrlhf.train <OpenRLHF flags>``: OpenRLHF's PPO trainer with r3rag's extension.

It connects to Ray (the job's cluster under ``ray job submit``) with a runtime env that runs
:func:`r3_env.openrlhf.step_rewards.install` in every worker process and forwards the
``R3RAG_*`` variables (the agent's config) to them, then runs ``openrlhf.cli.train_ppo_ray``
unchanged with the given flags. OpenRLHF's own ``ray.init`` defaults are kept.
"""

from __future__ import annotations

import logging
import os
import runpy
import sys

from r3_env.openrlhf import OPENRLHF_VERSION, step_rewards
from r3_env.openrlhf.step_rewards import SETUP_HOOK

logger = logging.getLogger(__name__)

# What openrlhf.cli.train_ppo_ray puts in its own ray.init (which it skips once Ray is connected).
OPENRLHF_ENV_DEFAULTS = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
}


def runtime_env() -> dict:
    env_vars = {key: os.environ.get(key, default) for key, default in OPENRLHF_ENV_DEFAULTS.items()}
    env_vars.update({key: value for key, value in os.environ.items() if key.startswith("R3RAG_")})
    return {"worker_process_setup_hook": SETUP_HOOK, "env_vars": env_vars}


def main(argv: list[str] | None = None) -> None:
    import ray

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if not ray.is_initialized():
        ray.init(runtime_env=runtime_env())
    step_rewards.install()
    logger.info("r3rag: OpenRLHF %s with per-step rewards; running openrlhf.cli.train_ppo_ray", OPENRLHF_VERSION)
    sys.argv = ["openrlhf.cli.train_ppo_ray", *argv]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
