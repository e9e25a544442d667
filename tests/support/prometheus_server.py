"""A real Prometheus (/usr/bin/prometheus 2.42) on 127.0.0.1 for tests: start, query its API, stop."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.serverproc import ServerProcess

PROMETHEUS = "/usr/bin/prometheus"
READY_TIMEOUT = 30.0


def scrape_config(jobs: dict[str, list[str]], interval: str = "1s", metrics_path: str = "/metrics") -> str:
    """A prometheus.yml scraping `host:port` targets per job at `interval` (YAML is JSON-compatible)."""
    lines = ["global:", f"  scrape_interval: {interval}", f"  evaluation_interval: {interval}"]
    lines.append("scrape_configs:")
    for job, targets in jobs.items():
        lines += [f"  - job_name: {job!r}", f"    metrics_path: {metrics_path!r}", "    static_configs:"]
        lines.append(f"      - targets: {[str(t) for t in targets]!r}")
    return "\n".join(lines) + "\n"


class PrometheusServer(ServerProcess):
    """One Prometheus process with its own storage directory under `workdir`."""

    def __init__(self, config_text: str, workdir: Path) -> None:
        super().__init__("prometheus", workdir)
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(config_text)

    def command(self) -> list[str]:
        """Prometheus on its port, storing under workdir/data."""
        return [
            PROMETHEUS,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ]

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        """Start Prometheus and wait until /-/ready answers 200."""
        super().start(timeout)

    def api_query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """The raw `data` of an instant query through the HTTP API (no watchdog code involved)."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        body = self.http.get("/api/v1/query", params=params).json()
        assert body["status"] == "success", body
        return dict(body["data"])

    def wait_for(self, expr: str, timeout: float = 30.0) -> dict[str, Any]:
        """Poll until an instant query returns a non-empty result; fail the test after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = self.api_query(expr)
            if data["result"]:
                return data
            time.sleep(0.25)
        pytest.fail(f"{expr!r} returned nothing within {timeout}s; prometheus log: {self.log_tail()}")


@contextlib.contextmanager
def running_prometheus(config_text: str, workdir: Path) -> Iterator[PrometheusServer]:
    """Run Prometheus for the duration of a with-block; skips the test if it is not installed."""
    if shutil.which(PROMETHEUS) is None:
        pytest.fail(f"{PROMETHEUS} is missing: scripts/setup.sh installs the Debian package prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    server = PrometheusServer(config_text, workdir)
    server.start()
    try:
        yield server
    finally:
        server.close()
