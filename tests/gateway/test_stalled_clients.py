"""Clients that hold slots without taking their answers, against a real gateway (own thread, uvicorn with
httptools) in front of a loopback upstream that streams for as long as it is read: the write deadline frees a
non-reading client's slot and closes its upstream request; requests without a session cannot hold every slot.

Deadlines here are a fraction of a second; every wait is bounded, and nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.gateway_upstream import SSE_HEAD, Seen, Upstream, chunk, fixed, stream_then
from vllm_watchdog.gateway.config import SessionConfig
from vllm_watchdog.gateway.dataplane.server import GatewayServer
from vllm_watchdog.gateway.protocol.snapshot import GatewaySnapshot

STREAM = {"model": "m", "prompt": "a secret prompt", "max_tokens": 100_000, "stream": True}
EVENT = b"data: " + b"x" * 4000 + b"\n\n"


class Endless:
    """An upstream handler that streams SSE events as fast as they are taken, until the gateway leaves."""

    def __init__(self) -> None:
        self.left = 0  # streams the gateway closed
        self.lock = threading.Lock()

    async def __call__(self, seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(SSE_HEAD)
            while True:
                writer.write(chunk(EVENT))
                await writer.drain()
        except ConnectionError:
            with self.lock:
                self.left += 1
            writer.close()


def snapshot(gw: GatewayServer) -> GatewaySnapshot:
    return gw.call_sync(gw.snapshot, timeout=10)


def eventually(check: Callable[[], bool], what: str, limit: float = 20.0) -> None:
    """Wait (bounded) until check() holds."""
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def arrived(snap: GatewaySnapshot) -> int:
    """Requests in flight or waiting."""
    return snap.gate.in_flight + sum(snap.gate.queued.values())


def request(path: str, body: dict[str, Any], session: str | None = None) -> bytes:
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if session is not None:
        head += f"X-Session-ID: {session}\r\n"
    return (head + f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def never_reading(port: int, session: str | None) -> socket.socket:
    """A streaming request from a socket with a 2 KiB receive buffer that never reads its answer."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # before connect: the window stays small
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    sock.sendall(request("/v1/completions", STREAM, session))
    return sock


def test_clients_that_never_read_lose_their_slots_and_their_upstream_requests(
    upstream: Upstream, gateway: Callable[..., GatewayServer], caplog: pytest.LogCaptureFixture
) -> None:
    endless = Endless()
    upstream.routes["/v1/completions"] = endless
    upstream.routes["/v1/chat/completions"] = fixed(200, [("Content-Type", "application/json")], b"{}")
    gw = gateway(max_in_flight=4, max_queue_time=60.0, write_timeout=0.5)
    port = gw.config.listen_port
    # With a session each, so that only the write deadline can free their slots.
    stalled = [never_reading(port, f"attacker-{i}") for i in range(4)]
    try:
        eventually(lambda: snapshot(gw).gate.admitted_total.get("interactive", 0) == 4, "all four admitted")
        eventually(lambda: snapshot(gw).gate.in_flight == 0, "the stalled clients' slots are freed")
        snap = snapshot(gw)
        assert snap.proxy.upstream_errors_total.get("client_stalled") == 4
        assert snap.gate.oldest_in_flight_age == 0.0  # what GatewayRequestStuck watches
        eventually(lambda: endless.left == 4, "the gateway closed every upstream stream (vLLM stops)")
        eventually(lambda: snapshot(gw).proxy.connections == 0, "the stalled connections are closed")
        # A legitimate request is admitted at once, keyed or not.
        r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=10)
        assert r.status_code == 200
    finally:
        for sock in stalled:
            sock.close()
    lines = [rec.getMessage() for rec in caplog.records if "took none of its response" in rec.getMessage()]
    assert len(lines) == 4 and not any("secret" in line for line in lines)
    assert not [rec for rec in caplog.records if "without completing response" in rec.getMessage()]


def test_requests_without_a_session_cannot_take_every_slot(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    upstream.routes["/v1/completions"] = stream_then("hang", upstream)  # a stream that never ends, read
    upstream.routes["/v1/chat/completions"] = fixed(200, [("Content-Type", "application/json")], b"{}")
    gw = gateway(max_in_flight=4, max_queue_time=1.0, sessions=SessionConfig(anonymous_share=0.5))
    port = gw.config.listen_port
    anonymous = []
    try:
        for _ in range(6):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(request("/v1/completions", STREAM))
            anonymous.append(sock)
        eventually(lambda: arrived(snapshot(gw)) == 6, "all six arrived")
        assert snapshot(gw).gate.in_flight == 2  # half the slots; four wait
        with socket.create_connection(("127.0.0.1", port), timeout=10) as keyed:
            keyed.sendall(request("/v1/chat/completions", {"model": "m", "messages": []}, "alice"))
            assert keyed.recv(65536).startswith(b"HTTP/1.1 200 ")
        refused = [sock.recv(65536) for sock in anonymous[2:]]  # after max_queue_time, not a slot
        assert all(b" 429 " in raw.split(b"\r\n", 1)[0] for raw in refused), refused
        assert all(b'"anonymous_concurrency"' in raw for raw in refused), refused
        assert snapshot(gw).gate.rejected_total["anonymous_concurrency"] == 4
    finally:
        for sock in anonymous:
            sock.close()
