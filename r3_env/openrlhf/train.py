"""``python -m r3_env.openrlhf.train <OpenRLHF flags>``: OpenRLHF's PPO trainer with r3rag's extension.

It connects to Ray (the job's cluster under ``ray job submit``) with a runtime env that runs
:func:`r3_env.openrlhf.step_rewards.install` in every worker process and forwards the
``R3RAG_*`` variables (the agent's config) to them, then runs ``openrlhf.cli.train_ppo_ray``
unchanged with the given flags. OpenRLHF's own ``ray.init`` defaults are kept.
"""

from __future__ import annotations

import json
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


def _job_runtime_env() -> dict:
    """The runtime env given to ``ray job submit`` (Ray refuses to merge keys it sets twice)."""
    try:
        config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    except ValueError:
        return {}
    return (config.get("runtime_env") or {}) if isinstance(config, dict) else {}


def runtime_env() -> dict:
    """What ``ray.init`` adds to the job's runtime env: the setup hook and the variables the job does not set."""
    job = _job_runtime_env()
    taken = set(job.get("env_vars") or {})
    env_vars = {key: os.environ.get(key, default) for key, default in OPENRLHF_ENV_DEFAULTS.items()}
    env_vars.update({key: value for key, value in os.environ.items() if key.startswith("R3RAG_")})
    env: dict = {"env_vars": {key: value for key, value in env_vars.items() if key not in taken}}
    hook = job.get("worker_process_setup_hook")
    if hook is None:
        env["worker_process_setup_hook"] = SETUP_HOOK
    elif hook != SETUP_HOOK:
        raise RuntimeError(
            f"the job's runtime env sets worker_process_setup_hook={hook!r}; r3rag needs {SETUP_HOOK!r} "
            "in every worker: call it from your hook and drop it from --runtime-env-json, or leave yours out"
        )
    if not env["env_vars"]:
        del env["env_vars"]
    return env


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
