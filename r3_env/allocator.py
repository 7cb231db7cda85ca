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
``R3RAG_SYSTEM_MALLOC=1`` turns this off. Once a training stage is over, :func:`release_freed_memory` hands
the kept pages back, so that what runs next (the demo's vLLM evaluations) finds the memory free.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import platform
import sys

THRESHOLD = 4 << 30  # bytes: above any one buffer of a training step, so none is unmapped on free
TUNABLES = f"glibc.malloc.mmap_threshold={THRESHOLD}:glibc.malloc.trim_threshold={THRESHOLD}"
OPT_OUT = "R3RAG_SYSTEM_MALLOC"


def tuned_environment(environ: dict[str, str]) -> dict[str, str] | None:
    """``environ`` with the tunables added, or None when they should not be (set already, opted out, not glibc)."""
    if "GLIBC_TUNABLES" in environ or environ.get(OPT_OUT, "") not in ("", "0") or not _glibc():
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


def release_freed_memory() -> None:
    """Give the heap's free pages back to the kernel (glibc's ``malloc_trim``) when a training stage ends: under
    the raised thresholds the process would otherwise hold the stage's peak until it exits. On the 2-core
    machine with 23.5 GiB, the default demo's SFT left under 2 GiB free for the vLLM evaluation that follows."""
    if not _glibc():
        return
    gc.collect()  # the stage's tensors held in reference cycles, freed first
    before = _resident_gib()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    logging.getLogger(__name__).info("freed memory handed back: resident %.2f GiB -> %.2f GiB", before, _resident_gib())


def _glibc() -> bool:
    return sys.platform == "linux" and platform.libc_ver()[0] == "glibc"


def _resident_gib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
