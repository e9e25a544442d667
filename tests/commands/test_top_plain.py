"""`vllm-watchdog top` off a terminal (a pipe, a log): plain frames one after another, no screen escapes; each
target's last errors (why it is down) under the table; exit 4 when `--once` cannot read the API."""

from __future__ import annotations

import io
import sys

import pytest

from tests.support.faultserver import FaultServer
from tests.support.vllm_server import free_port
from vllm_watchdog.commands.top import Snapshot, render, run_top
from vllm_watchdog.exitcodes import EXIT_OK, EXIT_UNREACHABLE

NOW = 1_700_000_100.0
REFUSED = "ConnectError: [Errno 111] Connect call failed ('127.0.0.1', 8000)"


def down_target() -> dict[str, object]:
    """A vLLM target of /api/v1/targets that is down: the scrape and the health probe refused alike."""
    return {
        "labels": {"instance": "vllm-0", "job": "vllm"},
        "scrapePool": "vllm",
        "health": "down",
        "lastError": REFUSED,
        "watchdog": {
            "name": "vllm-0",
            "url": "http://127.0.0.1:8000",
            "healthProbe": {"up": False, "latency": 0.001, "lastError": REFUSED},
            "canary": {"success": False, "latency": 0.001, "lastError": "timeout after 10s"},
        },
    }


def test_a_down_target_shows_why_each_error_once() -> None:
    snap = Snapshot("http://127.0.0.1:9460", [down_target()], [], {"history": []}, None)
    lines = render(snap, NOW).splitlines()
    errors = [ln.split(None, 1) for ln in lines if ln.startswith("  vllm-0")]
    assert errors == [["vllm-0", f"scrape, health: {REFUSED}"], ["vllm-0", "canary: timeout after 10s"]]


def test_plain_frames_follow_each_other_without_escapes(fault: FaultServer) -> None:
    fault.set("/api/v1/targets", {"status": "success", "data": {"activeTargets": [down_target()]}})
    fault.set("/api/v1/alerts", {"status": "success", "data": {"alerts": []}})
    fault.set("/api/v1/actions", {"status": "success", "data": {"history": []}})
    out = io.StringIO()
    status = run_top(fault.url, interval=1.0, once=False, out=out, plain=True, sleep=lambda _: None, frames=2)
    assert status == EXIT_OK
    text = out.getvalue()
    assert "\x1b" not in text
    assert text.count("vllm-watchdog top  ") == 2 and "\n\nvllm-watchdog top  " in text
    assert f"scrape, health: {REFUSED}" in text


def test_once_without_an_api_exits_4(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert run_top(url, interval=1.0, once=True, out=sys.stdout) == EXIT_UNREACHABLE
    assert url in capsys.readouterr().err
