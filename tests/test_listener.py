"""The listeners' connection budget under slow uploads: a minimum body rate, uploads evicted at the cap, and a
reserve that keeps `/healthz` and `/metrics` answered (issue 28, finding 9: 520 connections trickling a query
body held the API's cap, and Docker's HEALTHCHECK got 503 for 75 s)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.support.daemon_thread import DaemonThread
from tests.support.vllm_server import free_port
from vllm_watchdog.api.server import API_LIMITS, api_error_body, api_server
from vllm_watchdog.listener import Listener, ListenerLimits, body_deadline, is_probe

QUERY_HEAD = (
    b"POST /api/v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
    b"Content-Length: 1000\r\n\r\n"
)


def read_all(sock: socket.socket) -> bytes:
    """Everything the peer sends until it closes (a reset after the answer counts as the close)."""
    data = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def refusal(raw: bytes, status: int) -> dict[str, Any]:
    """The JSON document of a raw refusal with `status`."""
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split(b" ", 2)[1] == b"%d" % status, raw[:300]
    assert b"content-type: application/json" in head.lower(), raw[:300]
    doc: dict[str, Any] = json.loads(body)
    return doc


def wait_for(condition: Callable[[], bool], limit: float = 10.0) -> None:
    """Poll `condition` until it holds (bounded)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def busy(listener: Listener) -> int:
    """Connections with a request under way (here: each sending its body)."""
    return sum(not c.waiting for c in list(listener.connections))


def start_uploads(port: int, n: int) -> list[socket.socket]:
    """`n` connections that send a query's headers and the first byte of its 1,000-byte body."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
    for s in socks:
        s.sendall(QUERY_HEAD + b"q")
    return socks


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Callable[[ListenerLimits], DaemonThread]]:
    """A real daemon whose API has the shipped limits with the given overrides."""
    with contextlib.ExitStack() as stack:
        yield lambda limits: stack.enter_context(DaemonThread(tmp_path, limits))


# -- the arithmetic ------------------------------------------------------------------------------------------


def test_a_trickle_is_due_after_the_grace_and_a_fast_body_only_at_the_body_deadline() -> None:
    limits = API_LIMITS  # 512 bytes/s after 5 s, all of it within 30 s
    assert body_deadline(limits, 100.0, 100.0, 1) == (100.0 + 5.0 + 1 / 512, "body_too_slow")
    assert body_deadline(limits, 100.0, 100.0, 5 * 512) == (110.0, "body_too_slow")  # 5 s more credit
    assert body_deadline(limits, 100.0, 100.0, 1024 * 1024) == (130.0, "body_timeout")
    assert body_deadline(replace(limits, min_body_rate=None), 100.0, 100.0, 0) == (130.0, "body_timeout")
    unbounded = replace(limits, min_body_rate=None, body_timeout=None)
    assert body_deadline(unbounded, 100.0, 100.0, 0)[0] == float("inf")  # the gateway: the proxy's own


def test_only_a_get_or_head_of_a_probe_path_is_a_probe() -> None:
    paths = API_LIMITS.probe_paths
    assert is_probe(b"GET /healthz HTTP/1.1\r", paths) and is_probe(b"HEAD /metrics?x=1 HTTP/1.1", paths)
    assert is_probe(b"GET /-/ready HTTP/1.0", paths)
    for line in (b"POST /healthz HTTP/1.1", b"GET /api/v1/query HTTP/1.1", b"GET /healthz/x HTTP/1.1"):
        assert not is_probe(line, paths), line
    assert not is_probe(b"GET /%68ealthz HTTP/1.1", paths) and not is_probe(b"GET /healthz", paths)
    assert not is_probe(b"GET http://x/healthz HTTP/1.1", paths) and not is_probe(b"\xff\xfe", paths)


# -- slow uploads against the real daemon --------------------------------------------------------------------


def test_uploads_holding_the_cap_make_room_for_probes_scrapes_and_queries(
    daemon: Callable[[ListenerLimits], DaemonThread],
) -> None:
    # No minimum rate within the test's time: what frees the slots here is eviction at the cap.
    api = daemon(replace(API_LIMITS, max_connections=16, body_grace=600.0))
    listener, url = api.daemon.api_listener, f"http://127.0.0.1:{api.port}"
    socks = start_uploads(api.port, 16)
    try:
        wait_for(lambda: busy(listener) == 16)
        socks += start_uploads(api.port, 4)  # the attack: more uploads than the cap
        wait_for(lambda: listener.refused.get("connection_limit", 0) == 4)
        for evicted in socks[:4]:  # the oldest uploads made room, each with a JSON 503
            assert refusal(read_all(evicted), 503)["reason"] == "connection_limit"
        # A probe that has just connected outlives uploads that began before it.
        probe = socket.create_connection(("127.0.0.1", api.port), timeout=10)
        wait_for(lambda: listener.evicted == 5)
        socks += start_uploads(api.port, 1)
        wait_for(lambda: listener.evicted == 6)
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert read_all(probe).startswith(b"HTTP/1.1 200 ")
        assert httpx.get(url + "/healthz", timeout=10).status_code == 200
        metrics = httpx.get(url + "/metrics", timeout=10)
        assert metrics.status_code == 200 and "vllm_watchdog_api_refused_total" in metrics.text
        query = httpx.post(url + "/api/v1/query", data={"query": "1+1"}, timeout=10)
        assert query.status_code == 200 and query.json()["data"]["result"][1] == "2"
        assert len(listener.connections) <= 16 and not listener.reserved
    finally:
        for s in socks:
            s.close()


def trickle_until_cut(socks: list[socket.socket], interval: float, limit: float = 20.0) -> list[bytes]:
    """Send each socket one more body byte every `interval` until the server answers it; the answers."""
    answers: dict[socket.socket, bytes] = {}
    deadline = time.monotonic() + limit
    while len(answers) < len(socks):
        assert time.monotonic() < deadline, "a trickling upload was never cut off"
        live = [s for s in socks if s not in answers]
        readable, _, _ = select.select(live, [], [], interval)
        for s in readable:
            answers[s] = read_all(s)
        for s in live:
            if s not in answers:
                with contextlib.suppress(OSError):
                    s.sendall(b"q")
    return [answers[s] for s in socks]


def test_a_body_trickled_below_the_minimum_rate_is_cut_with_a_json_408(
    daemon: Callable[[ListenerLimits], DaemonThread],
) -> None:
    # 20 connections (cap 16) add a byte per 50 ms at most: 20 bytes/s, under the 50 bytes/s asked after 0.2 s.
    limits = replace(API_LIMITS, max_connections=16, body_grace=0.2, min_body_rate=50.0)
    api = daemon(limits)
    listener, url = api.daemon.api_listener, f"http://127.0.0.1:{api.port}"
    socks = start_uploads(api.port, 20)
    try:
        answers = trickle_until_cut(socks, 0.05)
        reasons = [refusal(raw, int(raw.split(b" ", 2)[1]))["reason"] for raw in answers]
        # The oldest made room for the last 4 (unless, on a slow machine, the first were cut before those came).
        assert set(reasons) <= {"body_too_slow", "connection_limit"} and reasons.count("body_too_slow") >= 16
        assert listener.refused == {r: reasons.count(r) for r in set(reasons)}
        # A body sent at once is not held to the rate.
        query = httpx.post(url + "/api/v1/query", data={"query": "1"}, timeout=10)
        assert query.status_code == 200 and httpx.get(url + "/healthz", timeout=10).status_code == 200
    finally:
        for s in socks:
            s.close()


# -- the reserve: every connection busy with a request -------------------------------------------------------


async def exchange(port: int, data: bytes) -> bytes:
    """Send raw bytes and read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()


@pytest.mark.anyio
async def test_probes_are_answered_in_the_reserve_when_every_connection_is_busy() -> None:
    release, all_busy, entered = asyncio.Event(), asyncio.Event(), []

    async def slow(request: Request) -> PlainTextResponse:
        entered.append(request)
        if len(entered) == 16:
            all_busy.set()
        await release.wait()
        return PlainTextResponse("slow")

    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/slow", slow), Route("/healthz", ok), Route("/metrics", ok)])
    port = free_port()
    listener = Listener(replace(API_LIMITS, max_connections=16, reserve=2), api_error_body)
    server = api_server(app, "127.0.0.1", port, listener)
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done()
        await asyncio.sleep(0.02)
    busy = [asyncio.create_task(exchange(port, get("/slow"))) for _ in range(16)]
    await asyncio.wait_for(all_busy.wait(), 10)
    try:
        for path in ("/healthz", "/metrics"):
            assert (await exchange(port, get(path))).startswith(b"HTTP/1.1 200 "), path
        # Anything else on a reserve connection: a JSON 503, before the app sees it.
        for request in (get("/slow"), get("/healthz", "POST"), get("/healthz") + get("/slow")):
            doc = refusal(await exchange(port, request), 503)
            assert doc["reason"] == "connection_limit" and "only health" in doc["error"], request
        # Silent connections in the reserve make room for a probe, the oldest first.
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        assert (await exchange(port, get("/healthz"))).startswith(b"HTTP/1.1 200 ")
        assert refusal(await asyncio.wait_for(silent[0][0].read(), 10), 503)["reason"] == "connection_limit"
        for _, writer in silent:
            writer.close()
    finally:
        release.set()
        assert [(await b).endswith(b"slow") for b in busy] == [True] * 16  # the requests were never cut
        server.should_exit = True
        await asyncio.wait_for(task, 20)
