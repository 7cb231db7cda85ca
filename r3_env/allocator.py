"""Keep glibc's malloc from handing PyTorch's large CPU buffers back to the kernel after every use.

glibc serves an allocation above its mmap threshold (128 KiB at first, rising with freed blocks to at
most 32 MiB) with a fresh ``mmap`` and unmaps it on ``free``. A training step's attention scores,
logits and gradients are larger than that, so the kernel maps and zeroes their pages again on every
step: on the 2-core development machine, half of an SFT step's CPU time was kernel time
(``bench/cpu_malloc.py`` measures it). Raising the mmap and trim thresholds keeps those pages in the
process's heap for the next step, at the cost of holding the step's peak memory between steps.

glibc reads its tunables only when a process starts, so an entry point calls :func:`keep_freed_memory`
first: it starts the same command again with them set. Everything the command starts (vLLM, Ray
workers, services) inherits them. ``GLIBC_TUNABLES`` already set (to anything) is left as it is, and
``R3RAG_SYSTEM_MALLOC=1`` turns this off.
"""

from __future__ import annotations

import os
import platform
import sys

THRESHOLD = 4 << 30  # bytes: above any one buffer of a training step, so none is unmapped on free
TUNABLES = f"glibc.malloc.mmap_threshold={THRESHOLD}:glibc.malloc.trim_threshold={THRESHOLD}"
OPT_OUT = "R3RAG_SYSTEM_MALLOC"


def tuned_environment(environ: dict[str, str]) -> dict[str, str] | None:
    """``environ`` with the tunables added, or None when they should not be (set already, opted out, not glibc)."""
    if "GLIBC_TUNABLES" in environ or environ.get(OPT_OUT, "") not in ("", "0"):
        return None
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return None
    return {**environ, "GLIBC_TUNABLES": TUNABLES}


def keep_freed_memory() -> None:
    """Start this process's command again with the tunables set (an entry point's first call; never returns
    then), or return when they are set already or do not apply."""
    environ = tuned_environment(dict(os.environ))
    if environ is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, environ)
