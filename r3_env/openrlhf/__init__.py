"""r3rag's plugin for OpenRLHF: the multi-turn agent executor and the per-step reward extension.

- ``agent.py`` is the file given to ``--train.agent_func_path``; it defines ``AgentExecutor``.
- ``step_rewards.py`` carries each step's reward to that step's last token (OpenRLHF alone sums
  them into one scalar at the end), through registered subclasses of OpenRLHF's sample generator
  and experience maker.
- ``train.py`` launches ``openrlhf.cli.train_ppo_ray`` with that extension installed in every
  Ray worker: ``python -m r3_env.openrlhf.train <OpenRLHF flags>``.

Only the OpenRLHF versions in :data:`SUPPORTED_OPENRLHF` are tested; importing this package with
another one fails with what to install.
"""

from __future__ import annotations

import os
from importlib import metadata

SUPPORTED_OPENRLHF = ("0.11.2",)
# Set to 1 to run with an untested OpenRLHF anyway (the extension subclasses its internals).
ALLOW_UNTESTED_ENV = "R3RAG_ALLOW_UNTESTED_OPENRLHF"


class UnsupportedOpenRLHF(ImportError):
    """The installed OpenRLHF is not one r3rag's plugin is tested with."""


def check_openrlhf_version() -> str:
    try:
        installed = metadata.version("openrlhf")
    except metadata.PackageNotFoundError:
        raise UnsupportedOpenRLHF(
            f"OpenRLHF is not installed: pip install openrlhf=={SUPPORTED_OPENRLHF[-1]} "
            "(on CPU machines with --no-deps, as scripts/setup.sh does)"
        ) from None
    if installed not in SUPPORTED_OPENRLHF and os.environ.get(ALLOW_UNTESTED_ENV) != "1":
        raise UnsupportedOpenRLHF(
            f"r3rag's OpenRLHF plugin is tested with openrlhf {', '.join(SUPPORTED_OPENRLHF)}, but {installed} is "
            f"installed: pip install openrlhf=={SUPPORTED_OPENRLHF[-1]}, or set {ALLOW_UNTESTED_ENV}=1 to try anyway"
        )
    return installed


OPENRLHF_VERSION = check_openrlhf_version()
