"""An incident per disruptive action, through the remediator: collected before the stop, bundled, named in
the audit row and the action events; a collector that hangs is cut at the budget and the action runs; a
bundle that cannot be written is recorded and the action runs too.

The server here is a real process runtime running a stand-in with vLLM's shape (an API process and its busy
child), the child SIGSTOPped as the chaos tests freeze vLLM's EngineCore; real vLLM is in tests/chaos.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.incidents import Sleeper, bundle, manifest, part_status, promtool_import, stack_functions
from vllm_watchdog.actions.incidents import procs
from vllm_watchdog.actions.incidents.recorder import RecorderOptions
from vllm_watchdog.actions.pipeline.remediator import Remediator, RemediatorOptions
from vllm_watchdog.actions.runtimes.process import ProcessRuntime
from vllm_watchdog.actions.runtimes.runtime import Launch, LogTail, ServerPid
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.config.targets import TargetConfig
from vllm_watchdog.notifiers.alert import OutgoingAlert
from vllm_watchdog.redact import MASK
from vllm_watchdog.store import SampleStore, make_labels

pytestmark = pytest.mark.anyio
SECRET = "sk-incident-test-0123456789"
ENGINE = "import time\ndef run_busy_loop():\n    while True:\n        sum(range(1000))\nrun_busy_loop()\n"
SERVER = (
    "import subprocess, sys, time\n"
    "print('INFO api server starting', flush=True)\n"
    "print(\"INFO Received request cmpl-1: prompt: 'the secret plan'\", flush=True)\n"
    f"subprocess.Popen([sys.executable, '-c', {ENGINE!r}])\n"
    "def serve_forever():\n    time.sleep(600)\n"
    "serve_forever()\n"
)


def _config(state_dir: Path | None, budget: str = "5s", extra: str = "") -> str:
    state = f"state_dir: {state_dir}\n" if state_dir else ""
    return f"""{state}targets:
  - name: vllm-0
    url: http://127.0.0.1:9
    command: ["{sys.executable}", "-c", {json.dumps(SERVER)}, "--api-key", "{SECRET}"]
routes: [{{match: {{alertname: Hung}}, actions: [restart]}}, {{match: {{alertname: Off}}, actions: [off]}}]
actions:
  restart: {{type: restart, startup_grace: 0s, drain_timeout: 0s, stop_timeout: 5s}}
  off: {{type: disable_draft, startup_grace: 0s, drain_timeout: 0s, dry_run: true}}
incidents: {{budget: {budget}, metrics_window: 1m{extra}}}
"""


class Ready:
    async def wait(self, target: TargetConfig, timeout: float, alive: object = None) -> tuple[bool, str]:
        return True, ""


class Hub:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def alerts(self, alerts: list[OutgoingAlert], now: float) -> None:
        pass

    def event(self, event: Any, now: float) -> None:
        self.events.append(event)


def hung() -> OutgoingAlert:
    return OutgoingAlert({"alertname": "Hung", "target": "vllm-0"}, {}, "firing", 0.0, 0.0, 1.0)


def firing() -> list[dict[str, Any]]:
    return [
        {"labels": {"alertname": "Hung", "target": "vllm-0"}, "state": "firing", "annotations": {}},
        {"labels": {"alertname": "Other", "target": "elsewhere"}, "state": "firing"},
        {"labels": {"alertname": "Soon", "target": "vllm-0"}, "state": "pending"},
    ]


def remediator(text: str, runtime: Any, store: SampleStore, **incidents: Any) -> tuple[Remediator, Hub]:
    hub = Hub()
    r = Remediator(
        parse_config(text, "c.yml", env={}),
        {"vllm-0": runtime},
        RemediatorOptions(
            ActionStore(None),
            Ready(),  # type: ignore[arg-type]
            hub=hub,  # type: ignore[arg-type]
            incidents=RecorderOptions(
                store=lambda: store, firing=firing, driver_dir="/nonexistent/nvidia", **incidents
            ),
        ),
    )
    r.reconciled.set()
    return r, hub


async def settle(r: Remediator, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while any(q for q in r.queues.values()) or r.current:
        assert time.monotonic() < deadline, "the action did not finish"
        await asyncio.sleep(0.01)


def _samples(now: float) -> SampleStore:
    store = SampleStore(3600)
    labels = {"job": "vllm", "instance": "127.0.0.1:9", "target": "vllm-0"}
    for i in range(30):
        store.append(make_labels("vllm:num_requests_running", labels), int((now - 30 + i) * 1000), 1.0)
    return store


@pytest.fixture
async def frozen(tmp_path: Path) -> AsyncIterator[tuple[ProcessRuntime, int, int]]:
    """A running stand-in whose engine child is SIGSTOPped: (runtime, server pid, engine pid)."""
    state = tmp_path / "state"
    state.mkdir()
    cfg = parse_config(_config(state), "c.yml", env={})
    t = cfg.targets[0]
    runtime = ProcessRuntime(
        t.name, t.command, env={}, state_dir=str(state), log_path=str(state / "vllm-vllm-0.log")
    )
    await runtime.start()
    server = (await runtime.server_pid()).pid
    assert server is not None
    deadline = time.monotonic() + 30
    while len(procs.process_tree(server)) < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    engine = procs.process_tree(server)[1]
    await asyncio.sleep(0.3)
    os.kill(engine, signal.SIGSTOP)
    try:
        yield runtime, server, engine
    finally:
        await runtime.stop(5)


async def test_a_restart_leaves_a_bundle_with_stacks_log_metrics_and_its_id_everywhere(
    tmp_path: Path, frozen: tuple[ProcessRuntime, int, int]
) -> None:
    runtime, server, engine = frozen
    state = tmp_path / "state"
    r, hub = remediator(_config(state), runtime, _samples(time.time()))
    r.handle([hung()], time.time())
    await settle(r)
    (row,) = r.store.history()
    assert row.outcome == "succeeded", row
    incident = row.details["incident"]
    assert "incident_error" not in row.details
    assert [(e.outcome, e.annotations) for e in hub.events] == [
        ("started", {"incident": incident}),
        ("succeeded", {"incident": incident}),
    ]
    assert (await runtime.server_pid()).pid != server  # restarted
    files = bundle(state, incident)
    doc = manifest(files)
    assert part_status(files) == {
        "processes": "ok",
        "stacks": "ok",
        "log": "ok",
        "metrics": "ok",
        "gpu": "absent",
        "kernel": "absent",
    }
    assert doc["action"] == {
        "name": "restart",
        "type": "restart",
        "trigger": "alert",
        "action_id": row.id,
        "plan": "restart vllm-0 (process)",
    }
    assert doc["alert"] == {"alertname": "Hung", "target": "vllm-0"}
    assert [a["labels"]["alertname"] for a in doc["firing"]] == ["Hung"]  # firing, and about this target
    functions = stack_functions(files)
    assert "run_busy_loop" in functions[engine] and "serve_forever" in functions[server]
    processes = {p["pid"]: p for p in json.loads(files["processes.json"])}
    assert processes[engine]["state"].startswith("T") and processes[engine]["wchan"] == "do_signal_stop"
    assert doc["vllm"]["command"][-2:] == ["--api-key", MASK]
    assert SECRET not in b"".join(files.values()).decode(errors="replace")
    log = files["log.txt"].decode()
    assert "INFO api server starting" in log and "the secret plan" not in log  # a request log line: withheld
    promtool_import(files["metrics.om"], tmp_path / "promtool")
    assert doc["facts"]["metrics"] == {"series": 1, "truncated": False}
    assert doc["budget"] == 5.0 and doc["collection_seconds"] < 5.0 + 1.0


class Hanging:
    """A runtime whose view of its processes and log never answers; stop and start are recorded."""

    kind = "docker"
    target = "vllm-0"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def server_pid(self) -> ServerPid:
        await asyncio.Event().wait()
        raise AssertionError

    async def log_tail(self, lines: int, max_bytes: int) -> LogTail:
        await asyncio.Event().wait()
        raise AssertionError

    async def launch(self) -> Launch:
        return Launch("docker", ("--model", "m", "--speculative-config", "{}"))

    async def is_running(self) -> bool:
        return True

    async def started_at(self) -> float | None:
        return 0.0

    async def stop(self, timeout: float) -> None:
        self.calls.append("stop")

    async def start(self) -> None:
        self.calls.append("start")

    async def replace(self, launch: Launch, stop_timeout: float) -> None:
        self.calls.append("replace")

    async def has_previous(self) -> bool:
        return False

    async def commit(self) -> None:
        pass

    async def rollback(self, stop_timeout: float) -> None:
        pass

    async def close(self) -> None:
        pass


async def test_a_hanging_collector_is_cut_at_the_budget_and_the_restart_goes_on(tmp_path: Path) -> None:
    clock, runtime = Sleeper(), Hanging()
    store = _samples(time.time())
    r, _ = remediator(
        _config(tmp_path, budget="2s"), runtime, store, sleep=clock.sleep, monotonic=clock.monotonic
    )
    r.handle([hung()], time.time())
    for _ in range(100):  # the metrics part ends at once; the others wait on the runtime
        await clock.advance(0)
    assert runtime.calls == []  # nothing stopped while the evidence is collected
    await clock.advance(1.9)
    assert runtime.calls == []
    await clock.advance(0.1)  # the budget: 2s, before any part's own timeout
    await settle(r)
    assert runtime.calls == ["stop", "start"]
    (row,) = r.store.history()
    assert row.outcome == "succeeded"
    files = bundle(tmp_path, row.details["incident"])
    assert part_status(files) == {
        "processes": "cut",
        "stacks": "cut",
        "log": "cut",
        "metrics": "ok",
        "gpu": "absent",
        "kernel": "absent",
    }
    assert manifest(files)["collection_seconds"] == 2.0
    assert "metrics.om" in files


async def test_an_unwritable_bundle_is_named_in_the_audit_row_and_the_restart_goes_on(tmp_path: Path) -> None:
    (tmp_path / "incidents").write_text("a file where the directory should be")
    clock, runtime = Sleeper(), Hanging()
    r, hub = remediator(_config(tmp_path, budget="1s"), runtime, SampleStore(60), sleep=clock.sleep)
    r.handle([hung()], time.time())
    await clock.advance(1)
    await settle(r)
    (row,) = r.store.history()
    assert row.outcome == "succeeded" and runtime.calls == ["stop", "start"]
    assert row.details["incident_error"].startswith("bundle not written: ")
    assert hub.events[-1].annotations == {"incident": row.details["incident"]}


async def test_no_incident_without_a_state_dir_when_disabled_or_for_a_dry_run(tmp_path: Path) -> None:
    for text in (
        _config(None),
        _config(tmp_path, extra=", enabled: false"),
    ):
        runtime = Hanging()
        r, hub = remediator(text, runtime, SampleStore(60))
        r.handle([hung()], time.time())
        await settle(r)
        (row,) = r.store.history()
        assert row.outcome == "succeeded" and "incident" not in row.details
        assert all(not e.annotations for e in hub.events)
    r, _ = remediator(_config(tmp_path), Hanging(), SampleStore(60))
    r.handle([OutgoingAlert({"alertname": "Off", "target": "vllm-0"}, {}, "firing", 0.0, 0.0, 1.0)], 0.0)
    await settle(r)
    assert [row.outcome for row in r.store.history()] == ["would_do"]
    assert not (tmp_path / "incidents").exists()
