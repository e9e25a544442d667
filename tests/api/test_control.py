"""The daemon's action plane through HTTP: rule -> route -> dry-run action -> webhook; the control API's
token, bodies, pause, silences, manual runs and inbound Alertmanager webhooks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.test_daemon import PAYLOAD, wait_for
from tests.support.configs import AUTH, target, write_config
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import free_port
from vllm_watchdog.service.daemon import Daemon, DaemonOptions

pytestmark = pytest.mark.anyio
RULES = """
groups:
  - name: q
    rules:
      - alert: Backlog
        expr: vllm:num_requests_waiting > 2
        labels: {severity: critical}
"""
# A stub for systemctl (systemd is not PID 1 here): the unit is known and active; every call is logged.
SYSTEMCTL = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/calls.log"
case "$1" in
  is-active) echo active ;;
  show) printf 'Id=vllm-test.service\\nNames=vllm-test.service\\nLoadState=loaded\\nExecMainStartTimestampMonotonic=1\\n' ;;
esac
"""


@pytest.fixture
async def plane(tmp_path: Path, fault: FaultServer) -> AsyncIterator[tuple[str, FaultServer, Path]]:
    fault.vllm_like(PAYLOAD)  # 3 requests waiting: Backlog fires at the first evaluation
    fault.set("/hook", b"ok")
    stub = tmp_path / "systemctl"
    stub.write_text(SYSTEMCTL)
    stub.chmod(0o755)
    (tmp_path / "q.rules.yml").write_text(RULES)
    port = free_port()
    cfg = write_config(
        tmp_path,
        target(fault.url, unit="vllm-test.service"),
        port=port,
        rest=f"""rule_files: [q.rules.yml]
routes:
  - {{match: {{alertname: Backlog}}, actions: [restart]}}
  - {{match: {{alertname: Hung}}, actions: [restart]}}
actions:
  restart: {{type: restart, startup_grace: 0s, cooldown: 0s}}
notifiers:
  - {{type: webhook, url: "{fault.url}/hook"}}
dry_run: true
""",
    )
    d = Daemon.load(DaemonOptions(str(cfg), env={}, systemctl=(str(stub),)))
    ready = asyncio.Event()
    task = asyncio.create_task(d.run(ready))
    await asyncio.wait([task, asyncio.create_task(ready.wait())], timeout=20, return_when="FIRST_COMPLETED")
    if task.done():
        task.result()
    yield f"http://127.0.0.1:{port}", fault, tmp_path
    d.stop()
    await asyncio.wait_for(task, 10)


def hook_bodies(fault: FaultServer) -> list[dict[str, Any]]:
    return [json.loads(body) for method, path, body in fault.requests if path == "/hook"]


async def test_a_firing_rule_runs_its_route_in_dry_run_and_tells_the_webhook(
    plane: tuple[str, FaultServer, Path],
) -> None:
    base, fault, tmp = plane
    async with httpx.AsyncClient(timeout=10) as c:
        status: Any = await wait_for(
            c,
            base + "/api/v1/actions",
            lambda j: any(h["outcome"] == "would_do" for h in j["data"]["history"]),
        )
        rec = next(h for h in status["data"]["history"] if h["outcome"] == "would_do")
        assert rec["action"] == "restart" and rec["target"] == "vllm-0" and rec["trigger"] == "alert"
        assert "would restart vllm-0 (systemd)" in rec["reason"]
        assert status["data"]["dry_run"] is True
        metrics = (await c.get(base + "/metrics")).text
        assert 'vllm_watchdog_actions_total{action="restart",outcome="would_do",target="vllm-0"}' in metrics
        assert "vllm_watchdog_dry_run 1.0" in metrics
    deadline = asyncio.get_running_loop().time() + 10
    while asyncio.get_running_loop().time() < deadline:
        kinds = {b.get("type") for b in hook_bodies(fault)}
        if {"alert", "action"} <= kinds or (
            any("alerts" in b for b in hook_bodies(fault)) and "action" in kinds
        ):
            break
        await asyncio.sleep(0.2)
    bodies = hook_bodies(fault)
    assert any(a["labels"]["alertname"] == "Backlog" for b in bodies for a in b.get("alerts", []))
    assert any(b.get("type") == "action" and b["event"]["outcome"] == "would_do" for b in bodies)
    calls = (tmp / "calls.log").read_text() if (tmp / "calls.log").exists() else ""
    verbs = {line.split()[0] for line in calls.splitlines() if line.strip()}
    assert not verbs & {"restart", "stop", "start", "kill"}, verbs  # dry run: reads only (is-active, show)


async def test_control_api_needs_the_token_and_names_bad_fields(plane: tuple[str, FaultServer, Path]) -> None:
    base, _, _ = plane
    async with httpx.AsyncClient(timeout=10) as c:
        for path in (
            "/api/v1/pause",
            "/api/v1/resume",
            "/api/v1/silences",
            "/api/v1/actions/restart/run",
            "/api/v1/alertmanager",
        ):
            assert (await c.post(base + path, json={})).status_code == 401, path
            assert (
                await c.post(base + path, json={}, headers={"Authorization": "Bearer nope"})
            ).status_code == 403
        bad = [
            ("/api/v1/alertmanager", b"{not json", "body is not JSON"),
            ("/api/v1/alertmanager", b"[]", "body must be a JSON object"),
            (
                "/api/v1/alertmanager",
                json.dumps({"alerts": [{"labels": {"a": 1}}]}).encode(),
                "alerts[0].labels",
            ),
            (
                "/api/v1/alertmanager",
                json.dumps({"alerts": [{"status": "odd", "labels": {}}]}).encode(),
                "alerts[0].status",
            ),
            (
                "/api/v1/alertmanager",
                json.dumps({"alerts": [{"labels": {}, "startsAt": "yesterday"}]}).encode(),
                "alerts[0].startsAt",
            ),
            ("/api/v1/silences", json.dumps({"matchers": [], "duration": "1h"}).encode(), "matchers"),
            (
                "/api/v1/silences",
                json.dumps({"matchers": ['alertname=~"("'], "duration": "1h"}).encode(),
                "matchers[0]",
            ),
            ("/api/v1/silences", json.dumps({"matchers": ["a=b"], "duration": "soon"}).encode(), "duration"),
            ("/api/v1/actions/restart/run", json.dumps({"target": 3}).encode(), "target"),
        ]
        for path, body, field in bad:
            resp = await c.post(base + path, content=body, headers=AUTH)
            assert resp.status_code == 400 and field in resp.json()["error"], (path, resp.text)
        resp = await c.post(base + "/api/v1/actions/nope/run", json={}, headers=AUTH)
        assert resp.status_code == 404 and "unknown action 'nope'" in resp.json()["error"]
        resp = await c.post(base + "/api/v1/alertmanager", content=b"x" * (1024 * 1024 + 10), headers=AUTH)
        assert resp.status_code == 413 and "over" in resp.json()["error"]


async def test_pause_silence_manual_and_inbound(plane: tuple[str, FaultServer, Path]) -> None:
    base, fault, _ = plane
    async with httpx.AsyncClient(timeout=10) as c:
        # The inbound Hung alert below must find the target's queue empty, or its restart merges with one
        # the firing Backlog rule queued ("queued": 0). End the backlog and wait until nothing is left of it.
        fault.vllm_like('vllm:num_requests_waiting{model_name="m"} 0\n')
        await wait_for(c, base + "/api/v1/alerts", lambda j: not j["data"]["alerts"])
        await wait_for(
            c, base + "/api/v1/actions", lambda j: not j["data"]["running"] and not j["data"]["queued"]
        )
        assert (
            await c.post(base + "/api/v1/pause", json={"reason": "kernel upgrade"}, headers=AUTH)
        ).status_code == 200
        run = await c.post(base + "/api/v1/actions/restart/run", json={"wait": True}, headers=AUTH)
        result = run.json()["result"]
        assert (
            result["outcome"] == "skipped"
            and result["rail"] == "paused"
            and "kernel upgrade" in result["reason"]
        )
        assert (await c.get(base + "/metrics")).text.count("vllm_watchdog_paused 1.0") == 1
        assert (await c.post(base + "/api/v1/resume", headers=AUTH)).status_code == 200

        sil = await c.post(
            base + "/api/v1/silences",
            json={"matchers": ['alertname="Hung"'], "duration": "1h", "comment": "known"},
            headers=AUTH,
        )
        sid = sil.json()["silenceID"]
        hung = {"alerts": [{"status": "firing", "labels": {"alertname": "Hung", "instance": "vllm-0"}}]}
        inbound = await c.post(base + "/api/v1/alertmanager", json=hung, headers=AUTH)
        assert inbound.json() == {"status": "success", "alerts": 1, "queued": 1}
        status: Any = await wait_for(
            c,
            base + "/api/v1/actions",
            lambda j: any(h["trigger"] == "inbound" for h in j["data"]["history"]),
        )
        rec = next(h for h in status["data"]["history"] if h["trigger"] == "inbound")
        assert rec["outcome"] == "skipped" and "silence" in rec["reason"]
        listed = (await c.get(base + "/api/v1/silences")).json()["data"]
        assert [s["id"] for s in listed] == [sid]
        assert (await c.delete(base + f"/api/v1/silences/{sid}", headers=AUTH)).status_code == 200
        assert (await c.delete(base + f"/api/v1/silences/{sid}", headers=AUTH)).status_code == 404

        run = await c.post(base + "/api/v1/actions/restart/run", json={"wait": True}, headers=AUTH)
        assert run.json()["result"]["outcome"] == "would_do"


async def test_catastrophic_regexes_from_clients_are_answered_without_stalling(
    plane: tuple[str, FaultServer, Path],
) -> None:
    """Patterns that stall a backtracking engine for hours, in a silence and in a series query (issue 13)."""
    base, _, _ = plane
    detail = "a" * 40  # 2^40 steps for a backtracking engine on the patterns below
    async with httpx.AsyncClient(timeout=10) as c:
        never = await c.post(
            base + "/api/v1/silences",
            json={"matchers": ['alertname="Hung"', 'detail=~"(.*.*)*Q"'], "duration": "1h"},
            headers=AUTH,
        )
        assert never.status_code == 200, never.text
        regex = {"name": "detail", "value": r"(a|a)*b|\w+", "isRegex": True}  # Alertmanager's shape
        sil = await c.post(
            base + "/api/v1/silences", json={"matchers": [regex], "duration": "1h"}, headers=AUTH
        )
        assert sil.status_code == 200, sil.text
        listed = (await c.get(base + "/api/v1/silences")).json()["data"]
        assert {m["value"] for s in listed for m in s["matchers"]} >= {"(.*.*)*Q", r"(a|a)*b|\w+"}

        hung = {"alerts": [{"status": "firing", "labels": {"alertname": "Hung", "instance": "vllm-0"}}]}
        hung["alerts"][0]["labels"]["detail"] = detail
        assert (await c.post(base + "/api/v1/alertmanager", json=hung, headers=AUTH)).status_code == 200
        status: Any = await wait_for(
            c,
            base + "/api/v1/actions",
            lambda j: any(h["trigger"] == "inbound" for h in j["data"]["history"]),
        )
        rec = next(h for h in status["data"]["history"] if h["trigger"] == "inbound")
        assert rec["outcome"] == "skipped" and "silence" in rec["reason"]

        found = await c.get(base + "/api/v1/series", params={"match[]": '{__name__=~"(.+)+Q"}'})
        assert found.status_code == 200 and found.json()["data"] == []
        bad = await c.get(base + "/api/v1/series", params={"match[]": '{__name__=~"(.+)++Q"}'})
        assert bad.status_code == 400 and "invalid regular expression" in bad.json()["error"]
        bad = await c.post(
            base + "/api/v1/silences", json={"matchers": ['a=~"\\\\C"'], "duration": "1h"}, headers=AUTH
        )
        assert bad.status_code == 400 and "invalid escape sequence" in bad.json()["error"]
        assert (await c.get(base + "/healthz")).status_code == 200
