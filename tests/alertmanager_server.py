"""A real Alertmanager (/usr/bin/prometheus-alertmanager 0.25) on 127.0.0.1 for tests.

It can be stopped and started again on the same port and storage, and can forward what it receives to a
webhook on 127.0.0.1 (group_wait 0s, group_interval 1s), so tests see resolved alerts too: its
`GET /api/v2/alerts` stops listing an alert once its endsAt has passed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from vllm_server import free_port

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
READY_TIMEOUT = 30.0


def am_config(webhook_url: str | None) -> str:
    """An alertmanager.yml with one receiver: a webhook on 127.0.0.1, or none (alerts go nowhere)."""
    receiver: dict[str, Any] = {"name": "test"}
    if webhook_url is not None:
        receiver["webhook_configs"] = [{"url": webhook_url, "send_resolved": True}]
    config = {
        "route": {"receiver": "test", "group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [receiver],
    }
    return json.dumps(config, indent=2) + "\n"  # YAML is a superset of JSON


class AlertmanagerServer:
    """One Alertmanager process with its own config and storage under `workdir`, on a fixed port."""

    def __init__(self, workdir: Path, webhook_url: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.config_path = workdir / "alertmanager.yml"
        self.config_path.write_text(am_config(webhook_url))
        self.log_path = workdir / "alertmanager.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, timeout=5.0, trust_env=False)

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        """Start Alertmanager (again, on the same port) and wait until /-/ready answers 200."""
        cmd = [
            ALERTMANAGER,
            f"--config.file={self.config_path}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"alertmanager exited with {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get("/-/ready", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"alertmanager not ready after {timeout}s: {self.log_tail()}")

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

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """What `GET /api/v2/alerts` lists now (active, silenced, inhibited and unprocessed alerts)."""
        params = [("filter", f"{k}={json.dumps(v)}") for k, v in filters.items()]
        resp = self.http.get("/api/v2/alerts", params=params)
        resp.raise_for_status()
        body = resp.json()
        assert isinstance(body, list), body
        return body

    def wait_for_alerts(
        self, check: Callable[[list[dict[str, Any]]], bool], timeout: float = 10.0, **filters: str
    ) -> list[dict[str, Any]]:
        """Poll GET /api/v2/alerts until `check` holds for the list; fail the test after `timeout`."""
        deadline = time.monotonic() + timeout
        got: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            got = self.alerts(**filters)
            if check(got):
                return got
            time.sleep(0.1)
        pytest.fail(f"alertmanager never showed the expected alerts within {timeout}s; last: {got}")

    def log_tail(self, n: int = 2000) -> str:
        """The end of Alertmanager's log."""
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""


@contextlib.contextmanager
def running_alertmanager(workdir: Path, webhook_url: str | None = None) -> Iterator[AlertmanagerServer]:
    """Run Alertmanager for the duration of a with-block."""
    if not os.access(ALERTMANAGER, os.X_OK):
        pytest.fail(f"{ALERTMANAGER} is missing: install the Debian package prometheus-alertmanager")
    workdir.mkdir(parents=True, exist_ok=True)
    server = AlertmanagerServer(workdir, webhook_url)
    server.start()
    try:
        yield server
    finally:
        server.close()
