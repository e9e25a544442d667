"""Chaos on the engine: a hung vLLM engine (SIGSTOP) and a dead one (SIGKILL) on a real vLLM the watchdog
launches itself, and a server that dies again after each restart (a crash loop) in Docker mode. Each restart
leaves an incident bundle (on by default with a state_dir): the hung engine's holds both processes' Python
stacks, the EngineCore's busy loop among them, the log tail and metrics that promtool imports.

The watchdog runs the bundled routes and actions (`include: bundled:watchdog.yml`) and bundled alerts copied
from rules/vllm.rules.yml with their windows scaled down as deploy/demo/rules.yml does (same expressions;
`[1m]` becomes a few seconds, `for:` a few seconds), and graceful-restart with shorter rails. The real-vLLM
test leaves VLLMDown out: scaled down to seconds it fires while vLLM loads its model, which the bundled
`startup_grace: 10m` (against `for: 1m`) exists to ignore and a scaled grace cannot without delaying the
test; the stub test shows VLLMDown restarting a killed server. Detection and recovery times are printed,
never asserted.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.apitargets import targets
from tests.support.configs import target, write_config
from tests.support.faultserver import FaultServer
from tests.support.incidents import bundle, manifest, part_status, promtool_import, stack_functions
from tests.support.stub_server import StubContainers
from tests.support.vllm_server import ROOT, free_port
from tests.support.watchdogproc import (
    START_LIMIT,
    api_servers,
    poll,
    start_watchdog,
    start_with_process_target,
)

LIMIT = 600.0  # bound on a detection plus a real vLLM restart on 2 busy cores; never asserted on
GRACE = 30  # seconds of start-up grace: more than a warm vLLM start here
BODY = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 4, "temperature": 0}


def scaled_rules(path: Path, names: Sequence[str], window: str, for_: str) -> None:
    """Copy the bundled alerts `names` to `path` with every `[1m]` window made `window` and `for:` `for_`."""
    doc = yaml.safe_load((ROOT / "rules" / "vllm.rules.yml").read_text())
    picked = [
        {**rule, "expr": rule["expr"].replace("[1m]", f"[{window}]"), "for": for_}
        for group in doc["groups"]
        for rule in group["rules"]
        if rule.get("alert") in names
    ]
    assert sorted(r["alert"] for r in picked) == sorted(names)
    path.write_text(yaml.safe_dump({"groups": [{"name": "chaos", "rules": picked}]}, sort_keys=False))


def firing_seen(fault: FaultServer) -> dict[str, int]:
    """How many firing notifications of each alert name reached the webhook."""
    seen: dict[str, int] = {}
    for _, path, body in list(fault.requests):
        doc = json.loads(body) if path == "/hook" else {}
        for alert in doc.get("alerts", []) if doc.get("type") == "alert" else []:
            if alert["status"] == "firing":
                name = alert["labels"]["alertname"]
                seen[name] = seen.get(name, 0) + 1
    return seen


def session_members(sid: int) -> list[tuple[int, bytes]]:
    """(pid, cmdline) of the live processes in session `sid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            out.append((int(entry.name), cmdline))
    return out


def engine_core(vport: int) -> int:
    """The VLLM::EngineCore process of the API server on vport (it runs in the server's session)."""
    (server,) = api_servers(vport)
    found = [pid for pid, cmd in session_members(server) if cmd.startswith(b"VLLM::EngineCore")]
    assert len(found) == 1, session_members(server)
    return found[0]


def actions(base: str) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(base + "/api/v1/actions", timeout=10).json()["data"]
    return data


@pytest.mark.vllm
def test_a_hung_then_a_killed_engine_is_restarted(
    tmp_path: Path, fault: FaultServer, cleanup: list[Callable[[], None]]
) -> None:
    port, vport, gport = free_port(), free_port(), free_port()
    base, log = f"http://127.0.0.1:{port}", tmp_path / "watchdog.log"
    fault.set("/hook", b"ok")
    scaled_rules(tmp_path / "chaos.rules.yml", ["VLLMEngineHung", "VLLMEngineStalled"], "15s", "5s")
    command = ["bash", str(ROOT / "scripts" / "serve-vllm.sh"), "--port", str(vport), "--max-num-seqs", "2"]
    cfg = write_config(
        tmp_path,
        target(
            f"http://127.0.0.1:{vport}",
            name="vllm-c",
            canary={"enabled": True, "interval": "2s", "timeout": "3s"},
            command=command,
        ),
        port=port,
        rest=f"""rule_files: [chaos.rules.yml]
gateway: {{listen: "127.0.0.1:{gport}", target: vllm-c}}
include: ["bundled:watchdog.yml"]
actions:
  graceful-restart:  # the bundled one with shorter drain, stop and start-up grace
    type: restart
    # The request the hang holds never finishes: the drain sees no engine step for stall_after (5 s, the
    # default) while the gateway's request waits, and ends at once, with the engine still frozen, so the
    # restart may end the hang before the second alert fires; if it fires, it merges or meets the cooldown.
    drain_timeout: 20s
    stop_timeout: 5s  # a frozen EngineCore keeps its API server from exiting on SIGTERM: always a SIGKILL
    ready_timeout: 5m
    startup_grace: {GRACE}s
    cooldown: 15m
    max_per_window: {{count: 3, window: 6h}}
notifiers:
  - {{type: webhook, url: "{fault.url}/hook"}}
""",
    )
    _, first_server = start_with_process_target(cfg, log, base, vport, cleanup)
    poll(
        base + "/api/v1/targets",
        lambda j: (targets(j)[0]["canary"] or {}).get("success") is True,
        START_LIMIT,
        "a successful canary",
        log,
    )

    # Until its first engine step a fresh vLLM looks hung to the rule; the start-up grace covers that.
    state = json.loads((tmp_path / "state" / "process-vllm-c.json").read_text())
    time.sleep(max(0.0, state["child"]["started_at"] + GRACE + 1 - time.time()))
    assert all(h["outcome"] == "skipped" for h in actions(base)["history"])  # (startup_grace)
    earlier = {h["id"] for h in actions(base)["history"]}

    # 1. The engine hangs: /health still answers, a request through the gateway waits forever.
    engine = engine_core(vport)
    os.kill(engine, signal.SIGSTOP)
    cleanup.append(lambda: os.kill(engine, signal.SIGCONT) if session_members(first_server) else None)
    hung_at = time.monotonic()
    stuck = threading.Thread(
        target=lambda: httpx.post(f"http://127.0.0.1:{gport}/v1/completions", json=BODY, timeout=120),
        daemon=True,
    )
    stuck.start()
    time.sleep(4)  # past the canary's 3 s timeout
    assert httpx.get(f"http://127.0.0.1:{vport}/health", timeout=5).status_code == 200

    seen: dict[str, float] = {}
    restart: dict[str, Any] | None = None
    deadline = hung_at + LIMIT
    while (
        restart is None
        or restart["outcome"] == "running"
        or not {"VLLMEngineHung", "VLLMEngineStalled"} & set(seen)
    ):
        assert time.monotonic() < deadline, (seen, restart, log.read_text()[-3000:])
        for name in firing_seen(fault):
            seen.setdefault(name, time.monotonic() - hung_at)
        rows = [h for h in actions(base)["history"] if h["id"] not in earlier]
        restart = rows[-1] if rows else None
        time.sleep(0.5)
    recovered = time.monotonic() - hung_at
    assert restart["outcome"] == "succeeded", restart
    assert restart["labels"]["alertname"] in ("VLLMEngineHung", "VLLMEngineStalled"), restart
    assert [s["step"] for s in restart["steps"]][:3] == ["drain", "drained", "stop"]
    drained = restart["steps"][1]["details"]
    assert drained["ended"].startswith("stalled: no progress for "), drained  # not the 20 s timeout
    ran = [h for h in actions(base)["history"] if h["id"] not in earlier and h["outcome"] != "skipped"]
    assert len(ran) == 1, ran  # the second alert merged with the running restart, or met its cooldown
    (second_server,) = api_servers(vport)
    assert second_server != first_server
    resp = httpx.post(f"http://127.0.0.1:{gport}/v1/completions", json=BODY, timeout=120)
    assert resp.status_code == 200, resp.text
    # The evidence, collected before the stop: the frozen EngineCore in its busy loop, the API server too.
    files = bundle(tmp_path / "state", restart["details"]["incident"])
    stacks = stack_functions(files)
    assert "run_busy_loop" in stacks[engine] and stacks[first_server], (part_status(files), stacks)
    processes = {p["pid"]: p for p in json.loads(files["processes.json"])}
    assert processes[engine]["state"].startswith("T") and processes[engine]["wchan"] == "do_signal_stop"
    assert "INFO" in files["log.txt"].decode()  # vLLM's own log lines
    promtool_import(files["metrics.om"], tmp_path / "promtool")
    assert manifest(files)["vllm"]["version"] and "--max-num-seqs" in manifest(files)["vllm"]["command"]
    hook = [json.loads(b) for _, path, b in list(fault.requests) if path == "/hook"]
    started = [b for b in hook if b.get("type") == "action" and b["event"]["outcome"] == "started"]
    assert started[0]["commonAnnotations"] == {"incident": restart["details"]["incident"]}
    print(
        f"\n[hang] firing (s after the SIGSTOP): {seen}, restarted by {restart['labels']['alertname']}, "
        f"drain ended {drained['ended']!r}, serving again {recovered:.1f}s after the SIGSTOP"
    )
    stuck.join(timeout=130)

    # 2. The engine dies: vLLM's API server notices within 5 s and exits; the supervisor starts it again.
    before = {h["id"] for h in actions(base)["history"]}
    engine = engine_core(vport)
    os.kill(engine, signal.SIGKILL)
    died_at = time.monotonic()

    def respawned(j: Any) -> bool:
        rows = [h for h in j["data"]["history"] if h["id"] not in before]
        return bool(rows) and all(h["outcome"] != "running" for h in rows)

    rows = [
        h for h in poll(base + "/api/v1/actions", respawned, LIMIT, "the respawn", log)["data"]["history"]
    ]
    (respawn,) = [h for h in rows if h["id"] not in before]
    assert (respawn["action"], respawn["trigger"], respawn["outcome"]) == (
        "respawn",
        "supervisor",
        "succeeded",
    )
    resp = httpx.post(f"http://127.0.0.1:{gport}/v1/completions", json=BODY, timeout=120)
    assert resp.status_code == 200, resp.text
    (third_server,) = api_servers(vport)
    assert third_server != second_server
    # The respawn's incident: no process left to read, but the log says how the server died.
    died = bundle(tmp_path / "state", respawn["details"]["incident"])
    assert part_status(died)["stacks"] == "absent" and part_status(died)["log"] == "ok"
    print(
        f"[death] respawned (exit code {respawn['labels'].get('exit_code')}), serving again "
        f"{time.monotonic() - died_at:.1f}s after the SIGKILL"
    )


@pytest.fixture
def stubs(docker_client: Any, hostroot_image: str) -> Iterator[StubContainers]:
    helper = StubContainers(docker_client, hostroot_image)
    yield helper
    helper.close()


def test_a_killed_server_is_restarted_and_a_crash_loop_stops_at_the_budget(
    tmp_path: Path, fault: FaultServer, stubs: StubContainers, cleanup: list[Callable[[], None]]
) -> None:
    port = free_port()
    base, log = f"http://127.0.0.1:{port}", tmp_path / "watchdog.log"
    fault.set("/hook", b"ok")
    crash = tmp_path / "crash"
    name, vport = stubs.run(["--crash-file", str(crash)], rw=[tmp_path])
    scaled_rules(tmp_path / "chaos.rules.yml", ["VLLMDown"], "15s", "2s")
    cfg = write_config(
        tmp_path,
        target(f"http://127.0.0.1:{vport}", name="stub", container=name),
        port=port,
        rest=f"""rule_files: [chaos.rules.yml]
include: ["bundled:watchdog.yml"]
actions:
  graceful-restart:  # the bundled rails (3 per 6h, crash loop 3 in 10m) scaled down to 2
    type: restart
    drain_timeout: 1s
    stop_timeout: 5s
    ready_timeout: 30s
    startup_grace: 0s
    cooldown: 0s
    max_per_window: {{count: 2, window: 1h}}
    crash_loop_window: 10m
    crash_loop_max: 2
    backoff_initial: 1s
    backoff_max: 2s
notifiers:
  - {{type: webhook, url: "{fault.url}/hook"}}
""",
    )
    wd = start_watchdog(cfg, log)
    cleanup.append(lambda: (wd.terminate(), wd.wait(20)))
    poll(base + "/api/v1/targets", lambda j: targets(j)[0]["up"], 60, "the server up", log)

    crash.write_text("5")  # from now on the server dies 5 s after each start
    stubs.client.containers.get(name).kill()  # SIGKILL
    killed_at = time.monotonic()

    def rows() -> list[dict[str, Any]]:
        return [h for h in actions(base)["history"] if h["action"] == "graceful-restart"]

    first = poll(
        base + "/api/v1/actions",
        lambda j: any(h["outcome"] == "succeeded" for h in j["data"]["history"]),
        60,
        "the first restart",
        log,
    )
    restarted_in = time.monotonic() - killed_at
    assert first["data"]["history"][-1]["labels"]["alertname"] == "VLLMDown"
    status = poll(
        base + "/api/v1/actions",
        lambda j: any(
            a["labels"]["alertname"] == "VLLMWatchdogRestartBudgetExhausted"
            for a in j["data"]["watchdog_alerts"]
        ),
        120,
        "the budget alert",
        log,
    )["data"]
    stopped_in = time.monotonic() - killed_at
    outcomes = [h["outcome"] for h in reversed(rows())]
    assert outcomes[:3] == ["succeeded", "succeeded", "skipped"], rows()
    assert rows()[0]["reason"].startswith("budget used up"), rows()[0]
    assert status["budgets_left"]["graceful-restart/stub"] == 0

    # No restart after the rail: the server stays down, and the alert reaches the notifier.
    last_start = stubs.client.containers.get(name).attrs["State"]["StartedAt"]
    poll(f"{base}/api/v1/targets", lambda j: not targets(j)[0]["up"], 30, "the server down for good", log)
    time.sleep(5)
    assert stubs.client.containers.get(name).attrs["State"]["StartedAt"] == last_start
    assert [h["outcome"] for h in rows()].count("succeeded") == 2
    deadline = time.monotonic() + 30
    while "VLLMWatchdogRestartBudgetExhausted" not in firing_seen(fault):
        assert time.monotonic() < deadline, firing_seen(fault)
        time.sleep(0.2)
    assert firing_seen(fault).get("VLLMDown", 0) >= 3  # once per death: each restart resolved it
    print(
        f"\n[crash loop] first restart done {restarted_in:.1f}s after the SIGKILL; the budget stopped "
        f"restarts {stopped_in:.1f}s after it; outcomes {outcomes}"
    )
