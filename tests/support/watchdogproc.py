"""The watchdog as a real subprocess, for end-to-end tests: start it, poll its API, find vLLM servers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.apitargets import targets
from tests.support.procs import command_lines


def start_watchdog(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    """`vllm-watchdog run --config cfg`, output appended to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "vllm_watchdog", "run", "--config", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def poll(url: str, pred: Callable[[Any], bool], limit: float, what: str, log: Path) -> Any:
    """GET url (JSON) until pred holds; AssertionError with the last answer and the log's end if it never does."""
    deadline = time.monotonic() + limit
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(url, timeout=5).json()
            if pred(last):
                return last
        except (httpx.HTTPError, ValueError, KeyError, TypeError):  # not up yet, or an error document
            pass
        time.sleep(0.3)
    raise AssertionError(f"{what} not within {limit}s; last: {last}; watchdog log: {log.read_text()[-3000:]}")


def api_servers(vport: int) -> list[int]:
    """PIDs of vLLM API servers listening on vport (by command line)."""
    return [
        pid
        for pid, argv in command_lines()
        if b"vllm.entrypoints.openai.api_server" in argv and str(vport).encode() in argv
    ]


START_LIMIT = 600.0  # bounds a hang, not a speed: a vLLM start beside 5 others on 2 cores took 283 s


def start_with_process_target(
    cfg: Path, log: Path, api: str, vport: int, cleanup: list[Callable[[], None]]
) -> tuple[subprocess.Popen[bytes], int]:
    """Start a watchdog whose only target launches vLLM on vport (process mode) and wait until that vLLM is up.

    Returns the watchdog and the pid of the vLLM API server it launched; teardown stops both.
    """

    def kill_vllm() -> None:
        for pid in api_servers(vport):
            os.killpg(pid, signal.SIGKILL)

    cleanup.append(kill_vllm)
    wd = start_watchdog(cfg, log)
    cleanup.append(lambda: (wd.terminate(), wd.wait(20)))
    poll(
        api + "/api/v1/targets",
        lambda j: targets(j)[0]["up"],
        START_LIMIT,
        "vLLM launched by the watchdog",
        log,
    )
    (pid,) = api_servers(vport)
    return wd, pid


def inbound_alert(alertname: str, instance: str) -> dict[str, Any]:
    """An Alertmanager webhook (v4) body carrying one firing alert, for POST /api/v1/alertmanager."""
    alert = {"status": "firing", "labels": {"alertname": alertname, "instance": instance}}
    return {"version": "4", "status": "firing", "alerts": [alert]}


@pytest.fixture
def cleanup() -> Iterator[list[Callable[[], None]]]:
    """Callbacks run at teardown, even when the test fails: no vLLM or watchdog outlives the test."""
    todo: list[Callable[[], None]] = []
    yield todo
    for fn in reversed(todo):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            fn()


def alerting_watchdog(
    tmp_path: Path, fault: Any, cleanup: list[Callable[[], None]], rules: str, *bundled: str
) -> tuple[str, subprocess.Popen[bytes], Path, Any]:
    """A watchdog process on `fault` serving vLLM's /metrics capture, with the rule file `rules` (and these
    bundled rule files), once it has an alert: its API's base URL, the process, its log and
    GET /api/v1/alerts."""
    from tests.support.configs import FAST, write_config
    from tests.support.vllm_server import free_port

    root = Path(__file__).resolve().parents[2]
    fault.vllm_like((root / "tests" / "fixtures" / "vllm-0.32.0-metrics.txt").read_text())
    (tmp_path / "rules.yml").write_text(rules)
    port = free_port()
    files = ", ".join([str(tmp_path / "rules.yml"), *(f"'bundled:{name}'" for name in bundled)])
    target = {"name": "vllm-0", "url": fault.url}
    cfg = write_config(tmp_path, target, port=port, global_settings=FAST, rest=f"rule_files: [{files}]\n")
    log = tmp_path / "watchdog.log"
    proc = start_watchdog(cfg, log)
    cleanup.append(lambda: (proc.kill(), proc.wait(10)))
    base = f"http://127.0.0.1:{port}"
    alerts = poll(base + "/api/v1/alerts", lambda j: j["data"]["alerts"], 60.0, "an alert", log)
    return base, proc, log, alerts
