"""Hostile clients against a real gateway (own thread, uvicorn with httptools) in front of a loopback upstream,
and against a real daemon's API port: idle sockets, request floods, header trickling, oversized headers, paths
that reach the upstream as another path, admin endpoints, `OPTIONS *`. Every refusal is JSON and counted.

Bounded: at most about 1,000 sockets at a time (the soft fd limit is raised to the hard one), each case a few
seconds at most, all on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.configs import TOKEN
from tests.support.daemon_thread import DaemonThread, raise_nofile
from tests.support.gateway_upstream import Seen, Upstream, response_head
from tests.support.vllm_server import free_port
from vllm_watchdog.gateway.config import GatewayConfig
from vllm_watchdog.gateway.dataplane.server import GatewayServer
from vllm_watchdog.gateway.protocol.snapshot import GatewaySnapshot
from vllm_watchdog.listener import ListenerLimits

COMPLETION = {"model": "m", "prompt": "hello", "max_tokens": 4}
MiB = 1024 * 1024


@pytest.fixture(autouse=True, scope="module")
def _fds() -> None:
    raise_nofile()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    """A programmable upstream on 127.0.0.1 (unknown paths echo the request)."""
    up = Upstream()
    yield up
    up.close()


@pytest.fixture
def gateway(upstream: Upstream) -> Iterator[Callable[..., GatewayServer]]:
    """Start a GatewayServer in front of `upstream` (config fields as keyword overrides)."""
    servers: list[GatewayServer] = []

    def make(**overrides: Any) -> GatewayServer:
        server = GatewayServer(
            GatewayConfig(target="hostile", upstream=upstream.url, listen_port=free_port(), **overrides)
        )
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop(grace=1.0)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[DaemonThread]:
    """A real daemon whose API has a 1 s header and body deadline and a cap of 64 connections."""
    limits = ListenerLimits(max_connections=64, header_timeout=1.0, body_timeout=1.0)
    with DaemonThread(tmp_path, limits, token=TOKEN) as d:
        yield d


def snapshot(gw: GatewayServer) -> GatewaySnapshot:
    return gw.call_sync(gw.snapshot, timeout=10)


def read_all(sock: socket.socket) -> bytes:
    """Everything the peer sends until it closes (a reset after a final answer counts as the close)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def split(raw: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    """Status, headers (lower-case names) and body of one raw response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    return int(lines[0].split(b" ", 2)[1]), headers, body


def json_refusal(raw: bytes, status: int) -> dict[str, Any]:
    """Assert `raw` is a JSON response with `status`; its document."""
    code, headers, body = split(raw)
    assert code == status, raw[:300]
    assert headers[b"content-type"] == b"application/json", raw[:300]
    doc: dict[str, Any] = json.loads(body)
    return doc


def openai_code(raw: bytes, status: int) -> str:
    """The `error.code` of an OpenAI-shaped JSON refusal with `status`."""
    error = json_refusal(raw, status)["error"]
    assert {"message", "type", "code"} <= set(error)
    return str(error["code"])


def exchange(port: int, data: bytes) -> bytes:
    """Send raw bytes, then read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        return read_all(sock)


def post(path: bytes, body: bytes = b"{}", method: bytes = b"POST") -> bytes:
    """A raw request with `Connection: close`, the path exactly as given."""
    return (
        method
        + b" "
        + path
        + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


def trickle_until_cut(sock: socket.socket, first: bytes, limit: float = 10.0) -> bytes:
    """Send `first`, then one header line every 50 ms; what the server answered when it closed."""
    sock.sendall(first)
    deadline = time.monotonic() + limit
    i = 0
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], 0.05)
        if readable:
            return read_all(sock)
        try:
            sock.sendall(b"X-Slow-%d: 1\r\n" % i)
        except (BrokenPipeError, ConnectionResetError):
            return b""
        i += 1
    raise AssertionError("the slow client was never cut off")


def open_idle(port: int, n: int) -> list[socket.socket]:
    """`n` connections that send nothing."""
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


# -- idle connections are not requests ---------------------------------------------------------------------


def test_hundreds_of_idle_connections_do_not_turn_a_request_away(
    gateway: Callable[..., GatewayServer],
) -> None:
    gw = gateway()  # max_in_flight 64, max_queue 256: uvicorn's limit_concurrency counted 576 sockets
    idle = open_idle(gw.config.listen_port, 650)
    try:
        r = httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=10)
        assert r.status_code == 200, r.text
        assert snapshot(gw).gate.admitted_total["interactive"] == 1
    finally:
        close_all(idle)


def test_at_the_connection_cap_the_oldest_idle_connection_makes_room(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway(max_connections=100)
    port = gw.config.listen_port
    idle = open_idle(port, 300)
    try:
        with httpx.Client(timeout=10) as client:  # a keep-alive client keeps working among them
            for _ in range(3):
                assert client.post(gw.url + "/v1/completions", json=COMPLETION).status_code == 200
        snap = snapshot(gw)
        assert snap.proxy.connections <= 100
        assert snap.proxy.connections_evicted_total >= 200
        # The oldest were closed with a JSON 503 (they may have been about to send), the newest are open.
        assert openai_code(read_all(idle[0]), 503) == "connection_limit"
        idle[-1].setblocking(False)
        with pytest.raises(BlockingIOError):
            idle[-1].recv(1)
        # Connections still sending their headers make room too, with a JSON 503 and no request forwarded.
        kept = socket.create_connection(("127.0.0.1", port), timeout=10)  # kept alive after a response
        kept.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"}"):  # the echo's JSON body
            answer += kept.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200")
        slow = open_idle(port, 100)
        for s in slow:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.5)  # the gateway reads them: now they are sending headers, not idle
        more = open_idle(port, 50)
        assert read_all(kept) == b""  # an idle keep-alive connection went first, quietly
        assert openai_code(read_all(slow[0]), 503) == "connection_limit"
        close_all([kept, *slow, *more])
        assert [s.target for s in upstream.seen] == ["/v1/completions"] * 3 + ["/v1/models"]
        assert snapshot(gw).proxy.refused_total["connection_limit"] >= 200 + 50
    finally:
        close_all(idle)


# -- a flood of requests: admission answers, in JSON, counted ----------------------------------------------


async def _slow_ok(seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(0.05)
    writer.write(response_head(200, [("Content-Type", "application/json"), ("Content-Length", "2")]) + b"{}")
    await writer.drain()


def test_a_thousand_concurrent_requests_are_queued_or_refused_in_json(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    upstream.routes["/v1/completions"] = _slow_ok
    gw = gateway(max_in_flight=4, max_queue=32, max_queue_time=20.0)

    async def flood() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=gw.url, timeout=60, limits=limits) as client:
            return await asyncio.gather(
                *(client.post("/v1/completions", json=COMPLETION) for _ in range(1000))
            )

    responses = asyncio.run(flood())
    codes: dict[int, int] = {}
    for r in responses:
        codes[r.status_code] = codes.get(r.status_code, 0) + 1
        assert r.headers["content-type"] == "application/json", r.text
        if r.status_code != 200:
            assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full", r.text
    # Without a session the flood holds at most 3 of the 4 slots (sessions.anonymous_share), 32 queued.
    assert set(codes) <= {200, 429} and codes.get(200, 0) >= 35, codes
    snap = snapshot(gw)
    assert snap.proxy.responses_total == {str(k): v for k, v in sorted(codes.items())}
    assert snap.gate.rejected_total.get("queue_full", 0) == codes.get(429, 0)


# -- header deadline, header size -----------------------------------------------------------------------------


def test_header_trickling_gets_408_and_the_connection_closed_on_both_listeners(
    upstream: Upstream, gateway: Callable[..., GatewayServer], api: DaemonThread
) -> None:
    gw = gateway(client_timeout=0.5)
    for port, started in ((gw.config.listen_port, time.monotonic()), (api.port, time.monotonic())):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            raw = trickle_until_cut(sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        assert time.monotonic() - started < 5
        assert json_refusal(raw, 408)
        assert split(raw)[1][b"connection"] == b"close"
    assert snapshot(gw).proxy.refused_total["header_timeout"] == 1
    assert api.daemon.api_listener.refused["header_timeout"] == 1
    assert upstream.seen == []


def test_a_slow_body_on_the_api_gets_408_and_the_connection_closed(api: DaemonThread) -> None:
    head = b"POST /api/v1/pause HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n" % TOKEN.encode()
    started = time.monotonic()
    raw = exchange(api.port, head + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    assert time.monotonic() - started < 5
    assert json_refusal(raw, 408)["reason"] == "body_timeout"
    assert api.daemon.api_listener.refused == {"body_timeout": 1}


def test_api_connection_cap_keeps_the_api_answering(api: DaemonThread) -> None:
    trickling: list[socket.socket] = []
    try:
        for _ in range(3):  # cap 64: each batch's connections make room by closing the previous batch
            batch = open_idle(api.port, 64)
            for s in batch:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            trickling += batch
            time.sleep(0.3)  # the daemon reads them: now they are sending headers, not idle
        r = httpx.get(f"http://127.0.0.1:{api.port}/healthz", timeout=10)
        assert r.status_code in (200, 503) and r.headers["content-type"] == "application/json"
        listener = api.daemon.api_listener
        assert len(listener.connections) <= 64
        assert listener.refused["connection_limit"] >= 64
        # The first batch made room for the later ones: each got a JSON 503, or, where the machine was slow
        # enough for its header deadline to pass first, a JSON 408 (both end the connection; the count above
        # shows the cap did the evicting).
        replies = [read_all(s) for s in trickling[:64]]
        codes = [split(raw)[0] for raw in replies]
        assert set(codes) <= {503, 408}, codes
        assert all(
            json_refusal(raw, code)["status"] == "error" for raw, code in zip(replies, codes, strict=True)
        )
    finally:
        close_all(trickling)


@pytest.mark.parametrize("listener", ["gateway", "api"])
def test_a_1_mib_header_gets_431_and_is_not_forwarded(
    listener: str, upstream: Upstream, gateway: Callable[..., GatewayServer], tmp_path: Path
) -> None:
    big = b"X-Big: " + b"a" * MiB + b"\r\n"
    long_url = b"/v1/completions?" + b"q" * (64 * 1024)
    if listener == "gateway":
        gw = gateway()
        raw = exchange(
            gw.config.listen_port, post(b"/v1/completions").replace(b"Host: x\r\n", b"Host: x\r\n" + big)
        )
        assert openai_code(raw, 431) == "header_too_large"
        assert openai_code(exchange(gw.config.listen_port, post(long_url)), 414) == "url_too_long"
        many = b"".join(b"X-H-%d: %s\r\n" % (i, b"v" * 100) for i in range(1000))  # 100 KiB in small headers
        raw = exchange(
            gw.config.listen_port, post(b"/v1/completions").replace(b"Host: x\r\n", b"Host: x\r\n" + many)
        )
        assert openai_code(raw, 431) == "header_too_large"
        assert snapshot(gw).proxy.refused_total == {"header_too_large": 2, "url_too_long": 1}
        assert httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=10).status_code == 200
        assert [s.target for s in upstream.seen] == ["/v1/completions"]
    else:
        with DaemonThread(tmp_path, ListenerLimits()) as d:
            raw = exchange(d.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
            assert json_refusal(raw, 431)["status"] == "error"
            assert json_refusal(exchange(d.port, post(long_url, method=b"GET")), 414)["status"] == "error"
            assert d.daemon.api_listener.refused == {"header_too_large": 1, "url_too_long": 1}
            metrics = httpx.get(f"http://127.0.0.1:{d.port}/metrics", timeout=10).text
            assert 'vllm_watchdog_api_refused_total{reason="header_too_large"} 1.0' in metrics


# -- admission decides on the path the upstream receives ------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        b"//v1/completions",
        b"/v1/./completions",
        b"/v1//completions",
        b"/x/../v1/completions",
        b"/v1/%63ompletions",
    ],
)
def test_paths_that_reach_an_inference_route_are_admitted_and_forwarded_normalised(
    path: bytes, upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway(drain_mode="reject")
    port = gw.config.listen_port
    gw.call_sync(lambda: gw.gate.set_drain(True))
    assert openai_code(exchange(port, post(path, json.dumps(COMPLETION).encode())), 503) == "draining"
    gw.call_sync(lambda: gw.gate.set_drain(False))
    gw.call_sync(lambda: gw.gate.open_breaker("s1", time.monotonic() + 60, "test"))
    with_session = post(path, json.dumps(COMPLETION).encode()).replace(
        b"Host: x\r\n", b"Host: x\r\nX-Session-ID: s1\r\n"
    )
    assert openai_code(exchange(port, with_session), 429) == "session_breaker"
    assert split(exchange(port, post(path, json.dumps(COMPLETION).encode())))[0] == 200
    assert [s.target for s in upstream.seen] == ["/v1/completions"]
    assert snapshot(gw).gate.admitted_total["interactive"] == 1


@pytest.mark.parametrize(
    "path", [b"/invocations", b"/v1/embeddings", b"/v2/rerank", b"/v1/audio/transcriptions"]
)
def test_every_inference_route_is_admitted(
    path: bytes, upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway(drain_mode="reject")
    gw.call_sync(lambda: gw.gate.set_drain(True))
    assert openai_code(exchange(gw.config.listen_port, post(path)), 503) == "draining"
    assert upstream.seen == []


@pytest.mark.parametrize(
    "path", [b"/v1%2Fcompletions", b"/v1/completions%00", b"/v1%5Ccompletions", b"/v1\\completions"]
)
def test_paths_that_would_decode_into_another_path_are_refused(
    path: bytes, upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway()
    assert openai_code(exchange(gw.config.listen_port, post(path)), 400) == "bad_path"
    assert upstream.seen == []
    assert snapshot(gw).proxy.refused_total == {"bad_path": 1}


def test_admin_endpoints_are_refused_unless_allowed(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway()
    port = gw.config.listen_port
    for path in (b"/pause", b"//pause", b"/v1/load_lora_adapter", b"/collective_rpc", b"/adapters/x"):
        assert openai_code(exchange(port, post(path)), 403) == "admin_path"
    assert openai_code(exchange(port, post(b"/is_paused", b"", b"GET")), 403) == "admin_path"
    assert upstream.seen == []
    assert snapshot(gw).proxy.refused_total == {"admin_path": 6}
    allowed = gateway(allow_admin_paths=("/pause", "/resume"), drain_mode="reject")
    allowed.call_sync(lambda: allowed.gate.set_drain(True))  # an allowed admin call is not held by a drain
    assert split(exchange(allowed.config.listen_port, post(b"/resume")))[0] == 200
    assert openai_code(exchange(allowed.config.listen_port, post(b"/sleep")), 403) == "admin_path"
    assert [s.target for s in upstream.seen] == ["/resume"]


def test_options_star_is_answered_by_the_gateway(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway()
    status, headers, _ = split(
        exchange(gw.config.listen_port, b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    )
    assert status == 204 and b"POST" in headers[b"allow"]
    assert openai_code(exchange(gw.config.listen_port, post(b"*")), 400) == "bad_path"
    assert upstream.seen == []
