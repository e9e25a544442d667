"""Phase (c) of bench/isolation.py: a catastrophic regex over every series, back to back, and the same
query timed against Prometheus 2.42 scraping the same targets."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from gateway import free_port, stop, wait_http
from scrape import PROMETHEUS

PATHOLOGICAL = '{__name__=~"(.+)+Q"}'  # exponential on a backtracking engine, linear on RE2


def hammer(api: int, stop_event: threading.Event, timings: list[float]) -> None:
    """Pathological API requests back to back until told to stop (each bounded by a 60 s timeout)."""
    with httpx.Client(timeout=60) as client:
        while not stop_event.is_set():
            t0 = time.perf_counter()
            with contextlib.suppress(httpx.HTTPError):
                client.get(f"http://127.0.0.1:{api}/api/v1/series", params={"match[]": PATHOLOGICAL})
            timings.append(time.perf_counter() - t0)


def prometheus_query(tmp: Path, tports: list[int]) -> dict[str, Any]:
    """Prometheus 2.42 scraping the same targets; the time of the same series query (median of 5)."""
    if not Path(PROMETHEUS).exists():
        return {"error": f"{PROMETHEUS} missing (scripts/setup.sh installs it)"}
    port = free_port()
    static = [{"targets": [f"127.0.0.1:{p}" for p in tports]}]
    cfg = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "vllm", "static_configs": static}],
    }
    (tmp / "prometheus.yml").write_text(json.dumps(cfg))
    argv = [
        PROMETHEUS, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/tsdb",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
    ]  # fmt: skip
    with (tmp / "prometheus.log").open("ab") as out:
        prom = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 60, prom)
        time.sleep(4)  # a few scrapes
        return {"seconds": _median_query(f"http://127.0.0.1:{port}")}
    finally:
        stop(prom)


def _median_query(base: str) -> float:
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        resp = httpx.get(base + "/api/v1/series", params={"match[]": PATHOLOGICAL}, timeout=120)
        times.append(time.perf_counter() - t0)
        resp.raise_for_status()
    return sorted(times)[len(times) // 2]
