"""A server binary run for tests (Prometheus, Alertmanager): started in its own session, ready when
`/-/ready` answers 200, stopped with SIGTERM and then SIGKILL, its log kept for failure messages."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests.support.vllm_server import free_port


class ServerProcess:
    """One process of `name` on a free 127.0.0.1 port, logging to `<workdir>/<name>.log`."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, timeout=5.0, trust_env=False)

    def command(self) -> list[str]:
        """The command line; subclasses say."""
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> None:
        """Start the server (again, on the same port) and wait until /-/ready answers 200."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get("/-/ready", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {timeout}s: {self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; the port and storage stay for a later start()."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def close(self) -> None:
        """Stop and release the HTTP client."""
        self.stop()
        self.http.close()

    def log_tail(self, n: int = 2000) -> str:
        """The end of the server's log."""
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""
