"""Session breakers end: a real watchdog (subprocess) with its real gateway process in front of a loopback
upstream, the bundled gateway rules and a short breaker. A looping session is broken, its alert resolves while
the breaker is open, the session is admitted once the breaker's time is up, and looping again breaks it again
for twice as long.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.configs import target, write_config
from tests.support.gateway_upstream import Upstream
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import cleanup, poll, start_watchdog  # noqa: F401  (cleanup is a fixture)

BREAKER = 3.0  # seconds: the first offence; the second gets twice that


def _step(tool: str, args: str) -> dict[str, Any]:
    """An agent step whose newest assistant message calls `tool` with `args`."""
    call = {"id": "call_1", "type": "function", "function": {"name": tool, "arguments": args}}
    return {
        "model": "m",
        "messages": [
            {"role": "user", "content": "find it"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "nothing found"},
        ],
    }


LOOP = _step("search", '{"q": "vllm"}')


def _send(gateway: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        gateway + "/v1/chat/completions", json=body, headers={"X-Session-ID": "looper"}, timeout=10
    )


def _firing(doc: Any) -> bool:
    return any(
        a["labels"].get("alertname") == "GatewaySessionToolCallLoop" and a["state"] == "firing"
        for a in doc["data"]["alerts"]
    )


@pytest.fixture
def upstream() -> Any:
    up = Upstream()  # unknown paths echo the request: every completion answers 200
    yield up
    up.close()


def test_a_breaker_ends_and_a_repeat_offence_gets_a_longer_one(
    tmp_path: Path,
    upstream: Upstream,
    cleanup: list[Callable[[], None]],  # noqa: F811
) -> None:
    port, gport = free_port(), free_port()
    api, gateway = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{gport}"
    log = tmp_path / "watchdog.log"
    cfg = write_config(
        tmp_path,
        target(upstream.url),
        port=port,
        rest=f"""
rule_files: ["bundled:gateway.rules.yml"]
gateway: {{listen: 127.0.0.1:{gport}}}
actions:
  breaker: {{type: throttle_session, duration: {BREAKER:g}s, max_duration: 1m, reset_after: 1h}}
routes:
  - {{match: {{alertname: GatewaySessionToolCallLoop}}, actions: [breaker]}}
""",
    )
    wd = start_watchdog(cfg, log)
    cleanup.append(lambda: (wd.terminate(), wd.wait(20)))
    status = poll(api + "/api/v1/gateway", lambda j: "pid" in j["data"], 60, "the gateway", log)
    gateway_pid = int(status["data"]["pid"])
    cleanup.append(lambda: os.kill(gateway_pid, signal.SIGKILL))  # it may outlive the daemon

    def broken(offence: int) -> dict[str, Any]:
        doc = poll(
            api + "/api/v1/gateway",
            lambda j: (
                j["data"]["offences"].get("looper", {}).get("offences") == offence
                and "looper" in j["data"]["breakers"]
            ),
            30,
            f"offence {offence}'s breaker",
            log,
        )
        return dict(doc["data"]["breakers"]["looper"])

    # Loop: the same tool call 5 times in a row; the bundled rule fires and the breaker opens.
    for _ in range(5):
        assert _send(gateway, LOOP).status_code == 200
    first = broken(1)
    opened = time.monotonic() - (BREAKER - first["seconds_left"])  # when the breaker opened
    assert 0 < first["seconds_left"] <= BREAKER
    refused = _send(gateway, LOOP)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "session_breaker"

    # The breaker settled the session's signals: the alert resolves while it is still open.
    poll(api + "/api/v1/alerts", lambda j: not _firing(j), 15, "the loop alert to resolve", log)

    # The session behaves: it is admitted once the breaker's time is up, and not broken again.
    behave = _step("read", '{"path": "/etc/motd"}')
    deadline = time.monotonic() + 15
    while (resp := _send(gateway, behave)).status_code != 200 and time.monotonic() < deadline:
        assert resp.status_code == 429 and float(resp.headers["retry-after"]) <= BREAKER
        time.sleep(0.2)
    assert resp.status_code == 200, resp.text
    assert time.monotonic() - opened >= BREAKER - 0.5
    for i in range(4):
        assert _send(gateway, _step("read", f'{{"path": "/f{i}"}}')).status_code == 200
    time.sleep(2.5)  # two evaluations: a resolved alert opens nothing
    assert _send(gateway, behave).status_code == 200

    # Loops again: a new episode, a second offence within the clean period: twice as long.
    for _ in range(5):
        assert _send(gateway, LOOP).status_code == 200
    second = broken(2)
    assert BREAKER < second["seconds_left"] <= 2 * BREAKER
    assert _send(gateway, LOOP).status_code == 429
    history = httpx.get(api + "/api/v1/actions", timeout=5).json()["data"]["history"]
    reasons = [h["reason"] for h in history if h["action"] == "breaker"]
    assert reasons == [
        "breaker of session looper open for 6s (repeat offence 2)",
        "breaker of session looper open for 3s",
    ], reasons
