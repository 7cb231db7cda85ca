"""OpenRLHF's trainer code on a machine without CUDA: import stand-ins for flash-attn and vLLM.

OpenRLHF imports two CUDA-only packages at import time:

- ``openrlhf.models`` imports ``flash_attn.bert_padding`` (for packed samples). flash-attn cannot
  install without CUDA, so ``import_standins/flash_attn`` holds pure-torch versions of the
  helpers it imports (``index_first_axis``, ``pad_input``, ``unpad_input``, ``rearrange``, and
  ``flash_attn.utils.distributed.all_gather``). ``log_probs_from_logits`` looks for flash-attn's
  Triton cross-entropy and, not finding it in the stand-in, uses its own torch path.
- ``openrlhf.trainer.ppo_utils`` (the experience maker and sample generator) imports
  ``vllm.SamplingParams``, ``vllm.inputs.TokensPrompt`` and ``vllm.utils.random_uuid``. vLLM's CPU
  build cannot share the main environment (it pins numba and fastapi below what bm25s and the
  services are tested with), so ``import_standins/vllm`` gives those names only: ``SamplingParams``
  is r3rag's engine-neutral one (what :class:`r3_env.engines.HFEngine` honours).

:func:`enable` appends the stand-ins' folder to the *end* of ``sys.path`` when either package is
missing, so an installed flash-attn or vLLM always wins. The local trainer calls it; the tests
that import OpenRLHF's trainer modules do too.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

STANDINS = Path(__file__).resolve().parent / "import_standins"


def _installed(name: str) -> bool:
    """Whether a real ``name`` is importable (the stand-in does not count)."""
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin is not None and STANDINS not in Path(spec.origin).parents


def enable() -> list[str]:
    """Make OpenRLHF's trainer modules importable here; returns the packages stood in for."""
    missing = [name for name in ("flash_attn", "vllm") if not _installed(name)]
    if missing and str(STANDINS) not in sys.path:
        sys.path.append(str(STANDINS))
        logger.info("import stand-ins for %s (not installed: OpenRLHF runs its torch paths)", ", ".join(missing))
    return missing
