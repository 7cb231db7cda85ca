"""Local service processes: an ``r3rag`` service started on a free port, waited for, and stopped.

The demo runs the retrieval service and the reward server exactly as a user would (``r3rag
retriever serve``, ``r3rag reward serve``), each as its own process with its log in a file; the
tests start theirs with the same class.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _exit_on_sigterm(signum: int, frame: object) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second SIGTERM during the clean-up ends the process at once
    raise SystemExit(128 + signum)


def stop_services_on_sigterm() -> None:
    """Make SIGTERM unwind this process (SystemExit), so that each service's ``with`` block stops its child.

    Python's default action ends the process at once and leaves its services running, holding their ports,
    memory and (a vLLM server) every core. Installed from the main thread only, and only over the default
    action: a program's own SIGTERM handler wins.
    """
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


class ServiceProcess:
    """``r3rag ARGS --service.port PORT`` as a child process, healthy on entry and stopped on exit.

    ``script``: run this Python file with ``--port PORT`` instead (a stand-in service in tests).
    ``log``: where its output goes (default: ``$TMPDIR/r3rag-service-PORT.log``).
    """

    def __init__(
        self,
        args: list[str],
        port: int | None = None,
        timeout: float = 120.0,
        script: str | None = None,
        log: Path | None = None,
    ) -> None:
        import tempfile

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if script:
            self.command = [sys.executable, script, *args, "--port", str(self.port)]
        else:
            self.command = [sys.executable, "-m", "r3_env.cli", *args, "--service.port", str(self.port)]
        self.timeout = timeout
        self.log_path = Path(log) if log else Path(tempfile.gettempdir()) / f"r3rag-service-{self.port}.log"
        self.process: subprocess.Popen | None = None
        self.env: dict[str, str] | None = None  # the child's environment (None: this process's)

    def start(self) -> ServiceProcess:
        import httpx

        stop_services_on_sigterm()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.time() + self.timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                self._give_up(f"service exited with {self.process.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self._give_up(f"service did not become healthy in {self.timeout} s")

    def _give_up(self, reason: str) -> NoReturn:
        log = self.read_log()  # before stop() closes it
        self.stop()
        raise RuntimeError(f"{reason}: {log}")

    def read_log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()[-3000:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if hasattr(self, "_log"):
            self._log.close()

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def vllm_cpu_env() -> dict[str, str]:
    """vLLM's CPU build on this machine: every core this process may use computes (by default vLLM reserves
    one, which leaves a single core computing on two), and 2 GiB of KV cache."""
    cores = sorted(os.sched_getaffinity(0))
    contiguous = cores == list(range(cores[0], cores[-1] + 1))
    return {
        "VLLM_CPU_OMP_THREADS_BIND": f"{cores[0]}-{cores[-1]}" if contiguous else ",".join(map(str, cores)),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": "2",
    }


class VLLMServer(ServiceProcess):
    """vLLM's OpenAI-compatible server for a local model folder, run by ``python`` of an env that has vLLM
    (``bash scripts/setup_vllm.sh`` makes ``.venv-vllm``); its endpoint is ``base_url``.

    fp32 and eager mode: the CPU build is ready in about 30 s that way (compiling takes minutes and its
    cache never reloads); explicit ``VLLM_CPU_*`` settings in the environment win over :func:`vllm_cpu_env`.
    ``reloadable``: with vLLM's dev endpoints, so a trainer can reload its weights in place
    (:class:`r3_env.engines.VLLMServerEngine`).
    """

    def __init__(
        self,
        python: str,
        model: str,
        port: int | None = None,
        timeout: float = 600.0,
        log: Path | None = None,
        reloadable: bool = False,
    ) -> None:
        super().__init__([], port, timeout, log=log)
        self.command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host",
                        "127.0.0.1", "--port", str(self.port), "--max-model-len", "4096", "--dtype", "float32",
                        "--enforce-eager"]  # fmt: skip
        self.env = {**vllm_cpu_env(), **os.environ, **({"VLLM_SERVER_DEV_MODE": "1"} if reloadable else {})}
        self.base_url = f"{self.url}/v1"
