"""Process mode end to end: the watchdog launches a real vLLM, restarts it on an inbound alert (the stop takes
the API server's whole session, EngineCore and worker included), and a watchdog killed with SIGKILL
mid-restart comes back, adopts the child, finishes the action and undrains.

The runtime's own tests (tests/actions/test_process_runtime.py) show adoption and whole-session stops with a
small stand-in child; this is the one real vLLM they are proved on."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.chaos.test_engine import session_members
from tests.support.configs import AUTH, target, write_config
from tests.support.vllm_server import ROOT, free_port
from tests.support.watchdogproc import (
    START_LIMIT,
    api_servers,
    inbound_alert,
    poll,
    start_watchdog,
    start_with_process_target,
)

pytestmark = pytest.mark.vllm


def _config(tmp_path: Path, port: int, vport: int) -> Path:
    command = ["bash", str(ROOT / "scripts" / "serve-vllm.sh"), "--port", str(vport), "--max-num-seqs", "1"]
    return write_config(
        tmp_path,
        target(f"http://127.0.0.1:{vport}", name="vllm-p", command=command),
        port=port,
        rest="""
routes:
  - {match: {alertname: VLLMEngineHung}, actions: [restart]}
actions:
  restart: {type: restart, startup_grace: 0s, drain_timeout: 5s, stop_timeout: 30s, ready_timeout: 5m}
""",
    )


def test_kill_9_mid_restart_reconciles(tmp_path: Path, cleanup: list[Callable[[], None]]) -> None:
    port, vport = free_port(), free_port()
    cfg, log = _config(tmp_path, port, vport), tmp_path / "watchdog.log"
    base = f"http://127.0.0.1:{port}"

    first, original = start_with_process_target(cfg, log, base, vport, cleanup)
    members = session_members(original)
    assert len(members) >= 3, members  # the API server, its EngineCore and the worker
    hung = inbound_alert("VLLMEngineHung", "vllm-p")
    assert httpx.post(base + "/api/v1/alertmanager", json=hung, timeout=10).status_code == 401
    resp = httpx.post(base + "/api/v1/alertmanager", json=hung, headers=AUTH, timeout=10)
    assert resp.status_code == 200 and resp.json()["queued"] == 1

    def mid_restart(j: Any) -> bool:
        hist = j["data"]["history"]
        return bool(hist) and hist[0]["outcome"] == "running" and hist[0]["step"] == "wait_ready"

    poll(base + "/api/v1/actions", mid_restart, 120, "the restart reaching wait_ready", log)
    assert httpx.get(base + "/api/v1/actions", timeout=5).json()["data"]["drained"]  # drained while it runs
    first.send_signal(signal.SIGKILL)
    first.wait(10)

    second = start_watchdog(cfg, log)
    cleanup.append(lambda: (second.terminate(), second.wait(20)))

    def settled(j: Any) -> bool:
        hist = j["data"]["history"]
        return bool(hist) and hist[0]["outcome"] != "running"

    status = poll(base + "/api/v1/actions", settled, START_LIMIT, "the reconciled action", log)["data"]
    rec = status["history"][0]
    assert rec["outcome"] == "succeeded", rec
    assert "after a watchdog restart" in rec["reason"]
    assert status["drained"] == {}
    servers = api_servers(vport)
    assert len(servers) == 1 and servers[0] != original  # restarted once, adopted, never started twice
    assert session_members(original) == []  # the stop took the engine core and the worker with the server
    body = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 4}
    assert httpx.post(f"http://127.0.0.1:{vport}/v1/completions", json=body, timeout=60).status_code == 200
    state = json.loads((tmp_path / "state" / "process-vllm-p.json").read_text())
    assert state["child"]["pid"] == servers[0]  # the adopted child is the one on record
