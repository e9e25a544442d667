"""Drain plus restart through the gateway loses no accepted request (process mode, a real vLLM of its own).

Clients keep sending through the gateway while the watchdog restarts vLLM: the gateway holds new requests
while drained, lets the in-flight ones finish, and forwards the held ones once vLLM is back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.configs import AUTH, target, write_config
from tests.support.vllm_server import ROOT, free_port
from tests.support.watchdogproc import (
    START_LIMIT,
    api_servers,
    inbound_alert,
    poll,
    start_with_process_target,
)

pytestmark = pytest.mark.vllm
MAX_REQUESTS = 40  # bounded load: at most this many requests in all


def test_drain_and_restart_lose_no_accepted_request(
    tmp_path: Path, cleanup: list[Callable[[], None]]
) -> None:
    port, vport, gport = free_port(), free_port(), free_port()
    command = ["bash", str(ROOT / "scripts" / "serve-vllm.sh"), "--port", str(vport), "--max-num-seqs", "1"]
    cfg = write_config(
        tmp_path,
        target(f"http://127.0.0.1:{vport}", name="vllm-p", command=command),
        port=port,
        rest=f"""gateway: {{listen: 127.0.0.1:{gport}, drain_mode: hold, drain_max_wait: 5m}}
routes:
  - {{match: {{alertname: VLLMEngineHung}}, actions: [restart]}}
actions:
  restart: {{type: restart, startup_grace: 0s, drain_timeout: 60s, stop_timeout: 30s, ready_timeout: 5m}}
""",
    )
    log = tmp_path / "watchdog.log"
    base, gateway = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{gport}"

    _, original = start_with_process_target(cfg, log, base, vport, cleanup)

    results: list[tuple[int, str]] = []
    stop = threading.Event()
    sent = iter(range(MAX_REQUESTS))

    def client() -> None:
        body = {"model": "tiny-llama", "prompt": "count to ten", "max_tokens": 8, "temperature": 0}
        while not stop.is_set() and next(sent, None) is not None:
            try:
                resp = httpx.post(gateway + "/v1/completions", json=body, timeout=300)
                results.append((resp.status_code, resp.text[:200]))
            except httpx.HTTPError as exc:
                results.append((0, repr(exc)))
            time.sleep(0.2)

    def wait_for(pred: Callable[[], bool], limit: float, what: str) -> None:
        """Until pred holds; a failure names every answer so far (a quick run of errors would use up the
        request budget, and "no traffic" would hide why) and the end of the watchdog's log."""
        deadline = time.monotonic() + limit
        while not pred():
            assert time.monotonic() < deadline, (
                f"{what} not within {limit}s; answers: {results}; watchdog log: {log.read_text()[-3000:]}"
            )
            time.sleep(0.3)

    workers = [threading.Thread(target=client) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        wait_for(lambda: len(results) >= 2, 120, "traffic through the gateway")
        hung = inbound_alert("VLLMEngineHung", "vllm-p")
        resp = httpx.post(base + "/api/v1/alertmanager", json=hung, headers=AUTH, timeout=10)
        assert resp.status_code == 200 and resp.json()["queued"] == 1
        poll(base + "/api/v1/gateway", lambda j: j["data"]["draining"], 60, "the gateway draining", log)
        held_from = len(results)

        def done(j: Any) -> bool:
            hist = j["data"]["history"]
            return bool(hist) and hist[0]["outcome"] not in ("running",)

        status = poll(base + "/api/v1/actions", done, START_LIMIT, "the restart", log)["data"]
        assert status["history"][0]["outcome"] == "succeeded", status["history"][0]
        poll(base + "/api/v1/gateway", lambda j: not j["data"]["draining"], 30, "the gateway undrained", log)
        after = len(results)
        wait_for(lambda: len(results) >= after + 2, 120, "traffic after the restart")
    finally:
        stop.set()
        for w in workers:
            w.join(300)
    (restarted,) = api_servers(vport)
    assert restarted != original  # vLLM really was restarted
    assert results and all(code == 200 for code, _ in results), [r for r in results if r[0] != 200]
    assert len(results) > held_from  # requests sent during the drain were held, then answered
