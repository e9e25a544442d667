"""GET /api/v1/incidents through a running daemon: a restart of a systemd-mode target (systemctl is a stub
that names a stand-in process as the unit's main process) leaves an incident, listed and shown by id with its
stacks and summary, named in the webhook's action events; bad ids and limits are refused, bounded; a hostile
bundle (a manifest nested 200k deep, zero-filled members, escape sequences) fails alone, without a token."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.test_daemon import PAYLOAD, wait_for
from tests.support.apitargets import targets
from tests.support.configs import AUTH, FAST, target, write_config
from tests.support.faultserver import FaultServer
from tests.support.incidents import hostile_bundle
from tests.support.vllm_server import free_port
from vllm_watchdog.service.daemon import Daemon, DaemonOptions

pytestmark = pytest.mark.anyio
SERVER = "import time\ndef engine_step():\n    while True:\n        time.sleep(0.01)\nengine_step()\n"
SYSTEMCTL = """#!/bin/sh
case "$1" in
  is-active) echo active ;;
  show) printf 'Id=vllm-test.service\\nNames=vllm-test.service\\nLoadState=loaded\\nMainPID={pid}\\n' ;;
esac
"""


@pytest.fixture
def stand_in() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
async def daemon(tmp_path: Path, fault: FaultServer, stand_in: int) -> AsyncIterator[tuple[str, FaultServer]]:
    fault.vllm_like(PAYLOAD)
    fault.set("/hook", b"ok")
    stub = tmp_path / "systemctl"
    stub.write_text(SYSTEMCTL.format(pid=stand_in))
    stub.chmod(0o755)
    port = free_port()
    cfg = write_config(
        tmp_path,
        target(fault.url, unit="vllm-test.service"),
        port=port,
        global_settings={**FAST, "keep_unreferenced": True},  # no rules here: the store keeps every family
        rest=f"""actions:
  restart: {{type: restart, startup_grace: 0s, cooldown: 0s, drain_timeout: 0s}}
notifiers:
  - {{type: webhook, url: "{fault.url}/hook"}}
incidents: {{budget: 10s, keep: 5}}
""",
    )
    d = Daemon.load(DaemonOptions(str(cfg), env={}, systemctl=(str(stub),)))
    ready = asyncio.Event()
    task = asyncio.create_task(d.run(ready))
    await asyncio.wait([task, asyncio.create_task(ready.wait())], timeout=20, return_when="FIRST_COMPLETED")
    if task.done():
        task.result()
    yield f"http://127.0.0.1:{port}", fault
    d.stop()
    await asyncio.wait_for(task, 10)


async def test_a_restart_is_listed_and_shown_with_its_evidence(
    daemon: tuple[str, FaultServer], stand_in: int
) -> None:
    base, fault = daemon
    async with httpx.AsyncClient(timeout=30) as c:
        assert (await c.get(base + "/api/v1/incidents")).json()["data"] == {"enabled": True, "incidents": []}
        await wait_for(c, base + "/api/v1/targets", lambda j: targets(j)[0]["up"])  # series in the store
        run = await c.post(base + "/api/v1/actions/restart/run", json={"wait": True}, headers=AUTH)
        result = run.json()["result"]
        assert result["outcome"] == "succeeded", result
        listed = (await c.get(base + "/api/v1/incidents")).json()["data"]["incidents"]
        (entry,) = listed
        assert (entry["target"], entry["action"], entry["trigger"]) == ("vllm-0", "restart", "manual")
        assert entry["action_id"] == result["action_id"] and entry["bytes"] > 0
        assert entry["parts"]["processes"] == entry["parts"]["stacks"] == entry["parts"]["metrics"] == "ok"
        shown = (await c.get(f"{base}/api/v1/incidents/{entry['id']}")).json()["data"]
        history = (await c.get(base + "/api/v1/actions")).json()["data"]["history"]
        assert history[0]["details"]["incident"] == entry["id"]
        assert (await c.get(base + "/api/v1/incidents/no-such-incident")).status_code == 404
        assert (await c.get(base + "/api/v1/incidents/..%2Fx")).status_code == 404
        assert (await c.get(base + "/api/v1/incidents?limit=0")).status_code == 400
        assert (await c.get(base + "/api/v1/incidents?limit=x")).status_code == 400
    assert shown["outcome"] == {"outcome": "succeeded", "reason": "restarted and ready"}
    assert shown["manifest"]["action"]["plan"] == "restart vllm-0 (systemd)"
    (stack,) = shown["stacks"]
    assert stack["pid"] == stand_in
    assert [f["name"] for f in stack["threads"][0]["frames"]] == ["engine_step", "<module>"]
    assert shown["processes"][0]["pid"] == stand_in
    assert "metrics.om" in shown["files"] and "metrics" not in shown  # named, not inlined
    assert "engine_step" in shown["summary"] and "outcome: succeeded" in shown["summary"]

    def started() -> list[dict[str, Any]]:
        events = [json.loads(b) for _, path, b in fault.requests if path == "/hook"]
        return [e for e in events if e.get("type") == "action" and e["event"]["outcome"] == "started"]

    for _ in range(200):  # the hub delivers each second
        if started():
            break
        await asyncio.sleep(0.1)
    assert started() and started()[0]["commonAnnotations"] == {"incident": entry["id"]}


async def test_hostile_bundles_fail_alone_and_the_good_one_still_lists(
    daemon: tuple[str, FaultServer], tmp_path: Path
) -> None:
    base, _ = daemon
    state = tmp_path / "state"
    good = {
        "manifest.json": json.dumps({"target": {"name": "vllm-0"}, "action": {"action_id": 10**30}}).encode()
    }
    hostile_bundle(state, "good-1", good)
    hostile_bundle(state, "deep-1", {"manifest.json": b"[" * 200_000 + b"]" * 200_000})  # 516 bytes
    hostile_bundle(state, "zeros-1", {"manifest.json": b"{}", "log.txt": 64 << 20})
    async with httpx.AsyncClient(timeout=30) as c:  # no token: GET needs none
        listed = await c.get(base + "/api/v1/incidents")
        assert listed.status_code == 200, listed.text  # was a 500 for every bundle: a RecursionError
        entries = {e["id"]: e for e in listed.json()["data"]["incidents"]}
        assert entries["good-1"]["target"] == "vllm-0" and entries["good-1"]["action_id"] is None
        assert entries["deep-1"]["error"] == "incident 'deep-1': manifest.json: nested deeper than 32 levels"
        assert "error" not in entries["zeros-1"]  # its manifest reads; its log is not read to list it
        zeros = await c.get(base + "/api/v1/incidents/zeros-1")
        assert zeros.status_code == 404 and "holds 67108864 bytes, more than the 8388608 read" in zeros.text
        deep = (await c.get(base + "/api/v1/incidents/deep-1")).json()["data"]
        assert deep["manifest"] == {"error": "manifest.json: nested deeper than 32 levels"}
        assert (await c.get(base + "/api/v1/incidents/good-1")).json()["data"]["outcome"] is None
