"""The gateway as a process of its own: the data plane keeps serving whatever happens to the daemon.

A real watchdog (subprocess) starts a real gateway process in front of a loopback upstream that streams slowly.
Killed, stopped or restarted, the daemon never costs a stream; a gateway that dies is started again; a drain
whose owner is gone past the lease is lifted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.configs import AUTH, target, write_config
from tests.support.gateway_upstream import SSE_HEAD, Seen, Upstream, chunk
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import poll, start_watchdog

EVENTS = 20
STREAMS = 16


def slow_stream(started: threading.Semaphore) -> Callable[..., Any]:
    """SSE: EVENTS events 0.1 s apart, then the end; `started` is released when a stream begins."""

    async def handle(seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        started.release()
        for i in range(EVENTS):
            writer.write(chunk(b"data: %d\n\n" % i))
            await writer.drain()
            await asyncio.sleep(0.1)
        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    return handle


class Rig:
    """A watchdog config with a gateway in front of `upstream`; start/stop the daemon, find the gateway."""

    def __init__(
        self, tmp_path: Path, upstream: Upstream, cleanup: list[Callable[[], None]], lease: str
    ) -> None:
        self.port, self.gport = free_port(), free_port()
        self.api, self.gateway = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.gport}"
        self.log = tmp_path / "watchdog.log"
        self.cfg = write_config(
            tmp_path,
            target(upstream.url),
            port=self.port,
            rest=f"""
rule_files: []
gateway: {{listen: 127.0.0.1:{self.gport}, control_lease: {lease}, drain_mode: hold, drain_max_wait: 5m}}
actions:
  hold: {{type: drain}}
""",
        )
        self.cleanup = cleanup
        self.known: set[int] = set()  # gateway processes seen: killed at teardown (they outlive daemons)
        cleanup.append(self.kill_gateways)

    def start(self) -> Any:
        wd = self.start_daemon_only()
        poll(self.api + "/api/v1/gateway", lambda j: "data" in j, 60, "the gateway's status", self.log)
        return wd

    def start_daemon_only(self) -> Any:
        wd = start_watchdog(self.cfg, self.log)
        self.cleanup.append(lambda: (wd.kill(), wd.wait(20)))
        return wd

    def kill_gateways(self) -> None:
        for pid in list(self.known):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def gateway_pid(self) -> int:
        pid = int(httpx.get(self.api + "/api/v1/gateway", timeout=5).json()["data"]["pid"])
        self.known.add(pid)
        return pid


def poll_text(url: str, wanted: str, log: Path, limit: float = 60.0) -> None:
    """GET url until its text contains `wanted` (bounded)."""
    deadline = time.monotonic() + limit
    text = ""
    while time.monotonic() < deadline:
        try:
            text = httpx.get(url, timeout=5).text
        except httpx.HTTPError:
            text = ""
        if wanted in text:
            return
        time.sleep(0.3)
    raise AssertionError(f"{wanted!r} not in {url} within {limit}s; log: {log.read_text()[-3000:]}")


def _stream(url: str, results: list[Any]) -> None:
    body = {"model": "m", "prompt": "x", "stream": True}
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as resp:
            text = b"".join(resp.iter_bytes()).decode()
        results.append((resp.status_code, text))
    except httpx.HTTPError as exc:
        results.append((0, repr(exc)))


def _complete(result: tuple[int, str]) -> bool:
    status, text = result
    return status == 200 and all(f"data: {i}\n\n" in text for i in range(EVENTS)) and "[DONE]" in text


@pytest.fixture
def upstream() -> Any:
    up = Upstream()
    yield up
    up.close()


def test_streams_survive_a_kill_9_of_the_daemon_and_a_new_daemon_adopts_the_gateway(
    tmp_path: Path, upstream: Upstream, cleanup: list[Callable[[], None]]
) -> None:
    started = threading.Semaphore(0)
    upstream.routes["/v1/completions"] = slow_stream(started)
    rig = Rig(tmp_path, upstream, cleanup, lease="60s")
    wd = rig.start()
    pid = rig.gateway_pid()
    results: list[Any] = []
    threads = [threading.Thread(target=_stream, args=(rig.gateway, results)) for _ in range(STREAMS)]
    for t in threads:
        t.start()
    for _ in range(STREAMS):
        assert started.acquire(timeout=30)  # every stream is under way
    wd.kill()  # kill -9 in the middle of 16 streams
    wd.wait(10)
    for t in threads:
        t.join(60)
    assert len(results) == STREAMS and all(_complete(r) for r in results), results
    # No daemon at all: the gateway still forwards with its last limits.
    assert httpx.get(rig.gateway + "/v1/models", timeout=10).status_code == 200

    # A new daemon adopts the running gateway without dropping the stream that is under way.
    later: list[Any] = []
    stream = threading.Thread(target=_stream, args=(rig.gateway, later))
    stream.start()
    assert started.acquire(timeout=30)
    rig.start()
    stream.join(60)
    assert later and _complete(later[0]), later
    assert rig.gateway_pid() == pid
    assert "adopted a running gateway" in rig.log.read_text()


def test_a_gateway_that_dies_is_started_again(
    tmp_path: Path, upstream: Upstream, cleanup: list[Callable[[], None]]
) -> None:
    rig = Rig(tmp_path, upstream, cleanup, lease="60s")
    rig.start()
    first = rig.gateway_pid()
    os.kill(first, signal.SIGKILL)
    status = poll(
        rig.api + "/api/v1/gateway",
        lambda j: "data" in j and j["data"].get("pid") not in (None, first),
        60,
        "a new gateway process",
        rig.log,
    )
    rig.known.add(int(status["data"]["pid"]))
    assert httpx.get(rig.gateway + "/v1/models", timeout=10).status_code == 200
    assert "the gateway process is gone: starting a new one" in rig.log.read_text()


def test_the_gateway_serves_while_the_daemon_is_stopped_and_lifts_its_drain_after_the_lease(
    tmp_path: Path, upstream: Upstream, cleanup: list[Callable[[], None]]
) -> None:
    rig = Rig(tmp_path, upstream, cleanup, lease="3s")
    wd = rig.start()
    rig.gateway_pid()
    cleanup.append(lambda: os.kill(wd.pid, signal.SIGCONT))
    os.kill(wd.pid, signal.SIGSTOP)
    for _ in range(20):  # a frozen control plane costs the data plane nothing
        assert (
            httpx.post(rig.gateway + "/v1/completions", json={"prompt": "x"}, timeout=10).status_code == 200
        )
    os.kill(wd.pid, signal.SIGCONT)

    # The watchdog drains the gateway, then freezes: after the lease the drain is lifted.
    resp = httpx.post(
        rig.api + "/api/v1/actions/hold/run", json={"target": "vllm-0", "wait": True}, headers=AUTH
    )
    assert resp.status_code == 200 and resp.json()["result"]["outcome"] == "succeeded", resp.text
    poll(rig.api + "/api/v1/gateway", lambda j: j["data"]["draining"], 10, "the drain", rig.log)
    os.kill(wd.pid, signal.SIGSTOP)
    began = time.monotonic()
    held = httpx.post(rig.gateway + "/v1/completions", json={"prompt": "x"}, timeout=60)
    assert held.status_code == 200  # held while drained, forwarded once the lease ran out
    assert time.monotonic() - began >= 1.0  # it was held, not let through at once
    os.kill(wd.pid, signal.SIGCONT)
    # Back, the watchdog sees the lapse and puts its drain back (the store still says drained).
    poll(rig.api + "/api/v1/gateway", lambda j: j["data"]["draining"], 30, "the drain re-applied", rig.log)
    assert "lifted its holds while this watchdog was silent" in rig.log.read_text()


def test_an_external_gateway_is_attached_to_outlives_the_daemon_and_its_absence_alerts(
    tmp_path: Path, upstream: Upstream, cleanup: list[Callable[[], None]]
) -> None:
    """As systemd's two units and compose run them: `vllm-watchdog gateway` on its own, the daemon attaching."""
    rig = Rig(tmp_path, upstream, cleanup, lease="60s")
    rig.cfg.write_text(
        rig.cfg.read_text().replace("control_lease: 60s", "control_lease: 60s, supervise: false")
    )
    wd = rig.start_daemon_only()
    # No gateway yet: the daemon monitors on, says so, and attaches once one answers.
    unreachable = 'vllm_watchdog_gateway_reachable{target="vllm-0"} 0.0'
    poll_text(rig.api + "/metrics", unreachable, rig.log)
    assert httpx.get(rig.api + "/api/v1/gateway", timeout=10).status_code == 503
    with rig.log.open("ab") as out:
        gateway = subprocess.Popen(
            [sys.executable, "-m", "vllm_watchdog", "gateway", "--config", str(rig.cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    rig.known.add(gateway.pid)
    status = poll(rig.api + "/api/v1/gateway", lambda j: "data" in j, 60, "the attached gateway", rig.log)
    assert status["data"]["pid"] == gateway.pid
    wd.terminate()
    assert wd.wait(30) == 0
    # The daemon stopped on purpose: an external gateway is not its to stop.
    assert gateway.poll() is None
    assert httpx.get(rig.gateway + "/v1/models", timeout=10).status_code == 200
    # The gateway gone with the daemon running: not started again by the daemon (not its job), and alerted.
    rig.start_daemon_only()
    poll(rig.api + "/api/v1/gateway", lambda j: "data" in j, 60, "the gateway attached again", rig.log)
    gateway.kill()
    gateway.wait(10)
    poll_text(rig.api + "/metrics", unreachable, rig.log)
    assert httpx.get(rig.api + "/api/v1/gateway", timeout=10).status_code == 503


def test_two_watchdogs_never_share_a_gateway_and_a_stale_one_of_ours_is_replaced(tmp_path: Path) -> None:
    """The socket's name comes from state_dir, target and listen address; an adopted gateway must serve what
    the config says, or (ours, from before a config change) it is stopped and a new one started."""
    from vllm_watchdog.gateway.config import GatewayConfig
    from vllm_watchdog.gateway.control.process import GatewayProcess
    from vllm_watchdog.gateway.protocol.spec import spec_for

    first = GatewayConfig(target="vllm-0", upstream="http://127.0.0.1:9", listen_port=free_port())
    other = GatewayConfig(target="vllm-0", upstream="http://127.0.0.1:9", listen_port=free_port())
    assert spec_for(first, None).control_socket != spec_for(other, None).control_socket

    async def scenario() -> tuple[int | None, int | None, int | None]:
        a = GatewayProcess(spec_for(first, str(tmp_path)))
        await a.attach()
        moved = GatewayConfig(target="vllm-0", upstream="http://127.0.0.1:10", listen_port=first.listen_port)
        b = GatewayProcess(spec_for(moved, str(tmp_path)))
        assert b.spec.control_socket == a.spec.control_socket  # same watchdog, new upstream
        try:
            await b.attach()
            return a.pid, b.pid, (await b.request("hello")).get("pid")
        finally:
            await b.stop(1.0)
            await a.stop(1.0)

    old, new, answering = asyncio.run(scenario())
    assert old is not None and old != new and answering == new
    with contextlib.suppress(ProcessLookupError):
        os.kill(old, 0)
        raise AssertionError("the stale gateway still runs")
