"""r3_env/allocator.py: entry points start again with glibc's malloc keeping large freed buffers."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from r3_env.allocator import OPT_OUT, TUNABLES, tuned_environment

GLIBC = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"
needs_glibc = pytest.mark.skipif(not GLIBC, reason="glibc's malloc tunables exist on Linux with glibc only")

# a 64 MiB buffer taken and freed 20 times, as a training step's attention scores are: the page faults it costs
FAULTS = """
import resource
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    block = bytearray(64 << 20)
    del block
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def plain_environment(**extra: str) -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in ("GLIBC_TUNABLES", OPT_OUT)} | extra


@needs_glibc
def test_the_tunables_are_added_unless_set_already_or_turned_off():
    assert tuned_environment({"PATH": "/bin"}) == {"PATH": "/bin", "GLIBC_TUNABLES": TUNABLES}
    assert tuned_environment({OPT_OUT: "0"}) == {OPT_OUT: "0", "GLIBC_TUNABLES": TUNABLES}
    assert tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) is None  # the user's own
    assert tuned_environment({OPT_OUT: "1"}) is None


@needs_glibc
def test_the_process_starts_again_with_them_and_freed_buffers_stop_costing_page_faults():
    code = "from r3_env.allocator import keep_freed_memory; keep_freed_memory()\nimport os\n"
    code += "print(os.environ.get('GLIBC_TUNABLES'))" + FAULTS
    tuned = subprocess.run([sys.executable, "-c", code], env=plain_environment(), capture_output=True, text=True)
    assert tuned.returncode == 0, tuned.stderr
    seen, tuned_faults = tuned.stdout.split()
    assert seen == TUNABLES
    default = subprocess.run([sys.executable, "-c", code], env=plain_environment(**{OPT_OUT: "1"}),
                             capture_output=True, text=True)  # fmt: skip
    seen, default_faults = default.stdout.split()
    assert seen == "None"
    # glibc's defaults map the buffer afresh each time (16,384 pages of 4 KiB); tuned, the heap keeps it
    assert int(tuned_faults) * 5 < int(default_faults), (tuned_faults, default_faults)


@needs_glibc
def test_a_finished_stage_hands_the_kept_memory_back():
    """Tuned, 1 GiB of freed buffers stays resident until release_freed_memory, as a finished SFT stage's peak
    would stay while the demo's vLLM evaluation needs the memory."""
    code = """
from r3_env.allocator import keep_freed_memory, release_freed_memory, _resident_gib
keep_freed_memory()
blocks = [bytearray(64 << 20) for _ in range(16)]
for block in blocks:
    block[::4096] = b"x" * len(block[::4096])  # touch every page
del blocks, block
kept = _resident_gib()
release_freed_memory()
print(kept, _resident_gib())
"""
    result = subprocess.run([sys.executable, "-c", code], env=plain_environment(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    kept, released = map(float, result.stdout.split())
    assert kept > 1.0 and released < kept - 0.9, (kept, released)


def test_the_r3rag_executable_and_python_m_both_tune_before_anything_runs():
    (script,) = [entry for entry in entry_points(group="console_scripts") if entry.name == "r3rag"]
    assert script.value == "r3_env.cli:run"
    version = subprocess.run([sys.executable, "-m", "r3_env.cli", "--version"], env=plain_environment(),
                             capture_output=True, text=True)  # fmt: skip
    assert version.returncode == 0 and version.stdout.startswith("r3rag "), version.stderr
