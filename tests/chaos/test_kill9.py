"""Chaos: the watchdog is killed with SIGKILL at each phase of a restart and of a reconfigure
(disable_draft), in Docker mode and in process mode, and the next watchdog reconciles: the gateway admits
requests again, exactly one server runs (the old or the new one, as the audit row says), no renamed or
half-made container is left, and the interrupted action has a final outcome saying it was reconciled.

The server is tests/support/stub_server.py (starts in well under a second), so each case costs seconds. Most phases
are hit exactly with a failpoint (vllm_watchdog.failpoints): the flow records the step, then waits there
forever. "stopping" is the middle of a stop: the stub answers SIGTERM with /health 503 and exits 3 s later;
the test kills the watchdog as soon as it sees the 503, while the stop (or the replace) is still in
progress. A real vLLM killed at wait_ready is in test_remediation_process.py.
"""

from __future__ import annotations

import asyncio
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
from tests.support.configs import AUTH, target, write_config
from tests.support.stub_server import StubContainers, stub_args, stubs_on, wait_status, write_stub
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import poll
from vllm_watchdog.actions.runtimes.docker import BACKUP_SUFFIX
from vllm_watchdog.failpoints import ENV, armed, reach

pytestmark = pytest.mark.spread  # each case starts its own stubs and watchdog: any worker may run any of them

SPEC = '{"method":"ngram","num_speculative_tokens":4}'
TERM_DELAY = "3"
LIMIT = 60.0  # bound on each wait; never asserted on
ACTION = {"restart": "restart", "reconfigure": "draft-off"}
# The phase -> the outcome the reconcile must record. Failpoint phases are the step names flows.py records.
EXPECTED = {
    "restart": {
        "drain": "succeeded",  # drained, nothing stopped yet: the server is running and ready
        "stopping": "succeeded",  # SIGTERM sent: it exits during the reconcile, which starts it again
        "start": "succeeded",  # stopped, not started yet: the reconcile starts it
        "wait_ready": "succeeded",  # started, readiness not seen yet
    },
    "reconfigure": {
        "drain": "failed",  # killed before anything was replaced: the old server runs on
        "replace": "failed",  # the same, with the new command line already in the audit log
        "stopping": "rolled_back",  # old one renamed and stopping, new one created, never started
        "wait_ready": "succeeded",  # the replacement runs: committed, the kept old one removed
    },
}
CASES = [(flow, phase) for flow, phases in EXPECTED.items() for phase in phases]


def _config(tmp_path: Path, port: int, gport: int, vport: int, how: dict[str, Any]) -> Path:
    """`how` is the target's `container` or its `command`."""
    fast = "startup_grace: 0s, cooldown: 0s, drain_timeout: 2s, stop_timeout: 20s, ready_timeout: 30s"
    return write_config(
        tmp_path,
        target(f"http://127.0.0.1:{vport}", name="stub", **how),
        port=port,
        rest=f"""gateway: {{listen: "127.0.0.1:{gport}", target: stub, drain_max_wait: 5s}}
actions:
  restart: {{type: restart, {fast}}}
  draft-off: {{type: disable_draft, {fast}}}
""",
    )


def _watchdog(cfg: Path, log: Path, failpoint: str | None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if failpoint is not None:
        env[ENV] = failpoint
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "vllm_watchdog", "run", "--config", str(cfg), "--log-format", "json"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def test_a_failpoint_is_inert_unless_armed_and_then_holds_its_step() -> None:
    assert not armed("stop", {})
    assert armed("stop", {ENV: "drain, stop"}) and not armed("start", {ENV: "drain, stop"})

    async def scenario() -> None:
        await asyncio.wait_for(reach("stop", {}), 1)  # unset: returns at once
        await asyncio.wait_for(reach("stop", {ENV: "start"}), 1)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reach("stop", {ENV: "stop"}), 0.2)

    asyncio.run(scenario())


@pytest.fixture
def stubs(docker_client: Any, hostroot_image: str) -> Iterator[StubContainers]:
    helper = StubContainers(docker_client, hostroot_image)
    yield helper
    helper.close()


@pytest.mark.parametrize("mode", ["docker", "process"])
@pytest.mark.parametrize(("flow", "phase"), CASES)
def test_kill_9_at_each_phase_reconciles(
    mode: str,
    flow: str,
    phase: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    cleanup: list[Callable[[], None]],
) -> None:
    began = time.monotonic()
    port, gport = free_port(), free_port()
    base, log = f"http://127.0.0.1:{port}", tmp_path / "watchdog.log"
    server_args = ["--speculative-config", SPEC, "--term-delay", TERM_DELAY]
    script = write_stub(tmp_path)
    if mode == "docker":
        stubs: StubContainers = request.getfixturevalue("stubs")
        client = stubs.client
        name, vport = stubs.run(server_args)
        how: dict[str, Any] = {"container": name}
    else:
        vport = free_port()
        how = {"command": [sys.executable, str(script), "--port", str(vport), *server_args]}
        cleanup.append(lambda: [os.killpg(pid, signal.SIGKILL) for pid in stubs_on(vport, script)])
    cfg = _config(tmp_path, port, gport, vport, how)
    failpoint = None if phase == "stopping" else phase

    first = _watchdog(cfg, log, failpoint)
    cleanup.append(lambda: (first.kill(), first.wait(10)))
    poll(base + "/api/v1/targets", lambda j: targets(j)[0]["up"], LIMIT, "the server up", log)
    before = stub_args(vport)
    assert ("--speculative-config" in before["args"]) and len(before["args"]) == len(server_args) + 2
    run = httpx.post(f"{base}/api/v1/actions/{ACTION[flow]}/run", json={}, headers=AUTH, timeout=10)
    assert run.status_code == 202, run.text

    if failpoint is not None:
        deadline = time.monotonic() + LIMIT
        while "failpoint reached" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
    else:
        wait_status(f"http://127.0.0.1:{vport}/health", 503)  # SIGTERM received: the stop is under way
    status = httpx.get(base + "/api/v1/actions", timeout=5).json()["data"]
    assert status["drained"], status  # the gateway is drained while the action runs
    (row,) = [h for h in status["history"] if h["action"] == ACTION[flow]]
    assert row["outcome"] == "running" and (failpoint is None or row["step"] == phase), row
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    killed_at = time.monotonic()
    if mode == "docker" and flow == "reconfigure" and phase == "stopping":
        # the replace was cut between creating the new container and starting it
        assert client.containers.get(name + BACKUP_SUFFIX) is not None
        assert client.containers.get(name).attrs["State"]["StartedAt"].startswith("0001-")

    second = _watchdog(cfg, log, None)
    cleanup.append(lambda: (second.terminate(), second.wait(20)))

    def settled(j: Any) -> bool:
        rows = [h for h in j["data"]["history"] if h["action"] == ACTION[flow]]
        return bool(rows) and all(r["outcome"] != "running" for r in rows)

    status = poll(base + "/api/v1/actions", settled, LIMIT, "the reconciled action", log)["data"]
    reconciled_in = time.monotonic() - killed_at
    (row,) = [h for h in status["history"] if h["action"] == ACTION[flow]]  # no second run of it
    steps = [s["step"] for s in row["steps"]]
    assert row["outcome"] == EXPECTED[flow][phase], row
    assert "after a watchdog restart" in row["reason"], row
    assert "reconcile" in steps and steps[-1] == "undrain", steps
    assert status["drained"] == {}
    assert all(h["outcome"] != "running" for h in status["history"])
    gateway = httpx.get(base + "/api/v1/gateway", timeout=5).json()["data"]
    assert not gateway["draining"], gateway
    body = {"model": "stub", "prompt": "hello", "max_tokens": 1}
    through = httpx.post(f"http://127.0.0.1:{gport}/v1/completions", json=body, timeout=30)
    assert through.status_code == 200, through.text

    # Exactly one server, running the command line the outcome says.
    after = stub_args(vport)
    replaced = flow == "reconfigure" and row["outcome"] == "succeeded"
    assert ("--speculative-config" in after["args"]) is not replaced, (row, after)
    if mode == "docker":
        found = client.containers.list(all=True, filters={"name": name})
        assert [(c.name, c.status) for c in found] == [(name, "running")]
    else:
        assert stubs_on(vport, script) == [after["pid"]]
    print(
        f"\n[kill9 {mode} {flow} at {phase}] {row['outcome']}: reconciled {reconciled_in:.1f}s after the "
        f"kill, case {time.monotonic() - began:.1f}s; steps {steps}"
    )
