"""A real Alertmanager (/usr/bin/prometheus-alertmanager 0.25) on 127.0.0.1 for tests.

It can be stopped and started again on the same port and storage, and can forward what it receives to a
webhook on 127.0.0.1 (group_wait 0s, group_interval 1s), so tests see resolved alerts too: its
`GET /api/v2/alerts` stops listing an alert once its endsAt has passed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.serverproc import ServerProcess

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


class AlertmanagerServer(ServerProcess):
    """One Alertmanager process with its own config and storage under `workdir`, on a fixed port."""

    def __init__(self, workdir: Path, webhook_url: str | None = None) -> None:
        super().__init__("alertmanager", workdir)
        self.config_path = workdir / "alertmanager.yml"
        self.config_path.write_text(am_config(webhook_url))

    def command(self) -> list[str]:
        """Alertmanager on its port, clustering off, storing under workdir/data."""
        return [
            ALERTMANAGER,
            f"--config.file={self.config_path}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        """Start Alertmanager (again, on the same port) and wait until /-/ready answers 200."""
        super().start(timeout)

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
