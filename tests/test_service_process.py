"""demo.services.ServiceProcess: a service started on a free port is stopped however its owner ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The owner: starts the stand-in judge as a service, prints its pid, then waits to be killed.
OWNER = """
import sys, time
sys.path.insert(0, {root!r})
from demo.services import ServiceProcess
with ServiceProcess([], script={script!r}) as service:
    print(service.process.pid, flush=True)
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie (exited, not yet reaped) is not alive
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_sigterm_to_the_owner_stops_its_services():
    """Python's default SIGTERM ends the owner at once and orphans the service (the demo's retriever, reward
    server and vLLM server kept running after a killed bench); the owner now unwinds and stops it."""
    script = str(ROOT / "tests" / "standin_judge.py")
    owner = subprocess.Popen([sys.executable, "-c", OWNER.format(root=str(ROOT), script=script)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    service_pid = 0
    try:
        service_pid = int(owner.stdout.readline())
        assert alive(service_pid)
        owner.send_signal(signal.SIGTERM)
        assert owner.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.time() + 10
        while alive(service_pid) and time.time() < deadline:
            time.sleep(0.1)
        assert not alive(service_pid), "the service outlived its owner"
    finally:
        owner.kill()
        owner.wait()
        if service_pid and alive(service_pid):  # the failing case: leave no orphan behind
            os.kill(service_pid, signal.SIGKILL)


def test_a_service_that_never_gets_healthy_is_stopped_and_its_log_reported(tmp_path):
    """The timeout's error carries the service's own output (it once closed the log first and raised a ValueError)."""
    from demo.services import ServiceProcess

    silent = tmp_path / "silent.py"
    silent.write_text("import time\nprint('listening nowhere', flush=True)\ntime.sleep(600)\n")
    service = ServiceProcess([], script=str(silent), timeout=10.0, log=tmp_path / "silent.log")
    with pytest.raises(RuntimeError, match="did not become healthy in 10.0 s: listening nowhere"):
        service.start()
    assert service.process.poll() is not None  # stopped
