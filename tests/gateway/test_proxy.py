"""The gateway's proxy and server: a real GatewayServer (own thread) in front of a real loopback upstream."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from tests.support.gateway_upstream import Upstream, fixed, hang, sse, stream_then
from tests.support.vllm_server import free_port
from vllm_watchdog.config.gatewayreplay import ReplayConfig
from vllm_watchdog.gateway.config import GatewayConfig
from vllm_watchdog.gateway.dataplane.server import GatewayServer
from vllm_watchdog.gateway.protocol.snapshot import GatewaySnapshot
from vllm_watchdog.listener import HttpProtocol

COMPLETION = {"model": "m", "prompt": "hello", "max_tokens": 4}
STREAM = {**COMPLETION, "stream": True}


def snapshot(gw: GatewayServer) -> GatewaySnapshot:
    """The gateway's snapshot, taken on its loop."""
    return gw.call_sync(gw.snapshot, timeout=10)


def eventually(check: Callable[[], bool], what: str) -> None:
    """Wait (bounded) until check() holds: things that happen on the gateway's loop after a response."""
    for _ in range(500):
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


def read_all(sock: socket.socket) -> bytes:
    """Everything the peer sends until it closes (a reset after a final answer counts as the close)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def exchange(port: int, *parts: bytes) -> bytes:
    """Send raw bytes, then read until the gateway closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for part in parts:
            sock.sendall(part)
        return read_all(sock)


def status_of(raw: bytes) -> int:
    """The status code of a raw response."""
    return int(raw.split(b" ", 2)[1])


# -- pass-through ---------------------------------------------------------------------------------
def test_methods_paths_headers_and_bodies_pass_through(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway()
    cases = [
        ("GET", "/v1/models", b""),
        ("POST", "/v1/chat/completions", b'{"model": "m", "messages": []}'),
        ("PUT", "/some/path?z=1&q=%20a", b"raw bytes"),
        ("DELETE", "/items/7", b""),
        ("PATCH", "/p?x", b"{}"),
        ("OPTIONS", "/v1/completions", b""),
        ("POST", "/metrics", b"not json"),
    ]
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        for method, target, body in cases:
            headers = [
                ("X-Custom", "abc"),
                ("X-Multi", "1"),
                ("X-Multi", "2"),
                ("Content-Type", "text/plain"),
            ]
            r = client.request(method, target, content=body, headers=headers)
            assert r.status_code == 200, (method, target)
            seen = upstream.seen[-1]
            assert (seen.method, seen.target, seen.body) == (method, target, body)
            assert seen.header("x-custom") == ["abc"]
            assert seen.header("x-multi") == ["1", "2"]
            assert seen.header("content-type") == ["text/plain"]
            assert seen.header("host") == [f"127.0.0.1:{upstream.port}"]
            assert seen.header("content-length") in ([[str(len(body))]] if body else [[], ["0"]])


def test_status_and_response_headers_pass_through(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    headers = [
        ("Content-Type", "text/plain"),
        ("X-Up", "1"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=2"),
        ("Server", "upstream/1.0"),
        ("Date", "Mon, 01 Jan 2024 00:00:00 GMT"),
    ]
    upstream.routes["/teapot"] = fixed(418, headers, b"short and stout")
    upstream.routes["/oops"] = fixed(500, [("Content-Type", "application/json")], b'{"error": "upstream"}')
    gw = gateway()
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        r = client.get("/teapot")
        assert r.status_code == 418
        assert r.content == b"short and stout"
        assert r.headers.get_list("set-cookie") == ["a=1", "b=2"]
        assert (r.headers["x-up"], r.headers["server"]) == ("1", "upstream/1.0")
        assert r.headers["date"] == "Mon, 01 Jan 2024 00:00:00 GMT"
        assert r.headers["content-length"] == "15"
        r = client.head("/teapot")
        assert (r.status_code, r.content, r.headers["content-length"]) == (418, b"", "15")
        r = client.post("/oops", content=b"x")  # an upstream error status is the upstream's answer, unchanged
        assert (r.status_code, r.content) == (500, b'{"error": "upstream"}')
    with httpx.Client(base_url=gw.url, timeout=10) as other:  # the gateway keeps no cookies of its own
        other.get("/echo")
    assert upstream.seen[-1].header("cookie") == []
    assert snapshot(gw).proxy.responses_total == {"418": 2, "500": 1, "200": 1}


def test_hop_by_hop_headers_are_dropped_both_ways(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    upstream.routes["/hop"] = fixed(
        200,
        [
            ("Connection", "X-Private-Down"),
            ("X-Private-Down", "secret"),
            ("Keep-Alive", "timeout=1"),
            ("Proxy-Authenticate", "Basic"),
            ("Trailer", "X-Later"),
            ("X-Kept", "yes"),
        ],
        b"ok",
    )
    gw = gateway()
    sent = [
        ("Connection", "keep-alive, X-Private-Up"),
        ("X-Private-Up", "1"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
        ("Trailer", "X-Later"),
        ("Proxy-Authorization", "Basic Zm9vOmJhcg=="),
        ("Proxy-Connection", "keep-alive"),
        ("X-Kept", "yes"),
    ]
    r = httpx.get(gw.url + "/hop", headers=sent, timeout=10)
    assert r.status_code == 200
    names = {k.lower() for k, _ in upstream.seen[-1].headers}
    for dropped in ("x-private-up", "keep-alive", "te", "trailer", "proxy-authorization", "proxy-connection"):
        assert dropped not in names
    assert upstream.seen[-1].header("x-kept") == ["yes"]
    for dropped in ("x-private-down", "keep-alive", "proxy-authenticate", "trailer"):
        assert dropped not in r.headers
    assert r.headers["x-kept"] == "yes"


def test_invalid_json_is_forwarded_byte_identical(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway()
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}\xff\xfe trailing garbage'
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        r = httpx.post(gw.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=10)
        assert r.status_code == 200
        assert upstream.seen[-1].body == body
    stats = snapshot(gw).sessions
    assert [s.requests_total for s in stats if s.session == "anonymous"] == [3]


def test_chunked_request_body_is_reframed_unchanged(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway()
    pieces = [b'{"model": "m", ', b'"prompt": "hi"}']
    r = httpx.post(gw.url + "/v1/completions", content=iter(pieces), timeout=10)  # sent chunked
    assert r.status_code == 200
    seen = upstream.seen[-1]
    assert seen.body == b"".join(pieces)
    assert seen.header("content-length") == [str(len(seen.body))]
    assert seen.header("transfer-encoding") == []


# -- streaming and disconnects --------------------------------------------------------------------
def test_sse_chunks_arrive_before_the_stream_ends(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    go = threading.Event()
    events = [b'data: {"n": %d}\n\n' % i for i in range(4)] + [b"data: [DONE]\n\n"]
    upstream.routes["/v1/completions"] = sse(events, go)
    gw = gateway()
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", gw.url + "/v1/completions", json=STREAM) as r,
    ):
        assert r.headers["content-type"] == "text/event-stream"
        chunks = r.iter_raw()
        first = next(chunks)  # the upstream holds the rest until `go` is set: a buffering proxy blocks here
        assert first == events[0]
        assert not go.is_set()
        go.set()
        rest = b"".join(chunks)
    assert first + rest == b"".join(events)


def test_client_disconnect_mid_stream_closes_the_upstream_request(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    upstream.routes["/v1/completions"] = stream_then("hang", upstream)
    gw = gateway()
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", gw.url + "/v1/completions", json=STREAM) as r,
    ):
        assert next(r.iter_raw()) == b"data: first\n\n"
    # leaving the block mid-body closed the client's connection
    assert upstream.disconnected.wait(10)
    eventually(lambda: gw.call_sync(lambda: gw.gate.in_flight) == 0, "the slot is released")
    snap = snapshot(gw)
    assert snap.proxy.upstream_errors_total == {"client_disconnect": 1}
    assert [s.in_flight for s in snap.sessions] == [0]


def test_client_disconnect_before_the_first_byte_closes_the_upstream_request(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    upstream.routes["/v1/completions"] = hang(upstream)
    gw = gateway()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=httpx.Timeout(10, read=0.3))
    assert upstream.disconnected.wait(10)
    eventually(lambda: gw.call_sync(lambda: gw.gate.in_flight) == 0, "the slot is released")


def test_client_disconnect_while_queued_frees_the_queue(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    go = threading.Event()
    upstream.routes["/v1/completions"] = sse([b"data: 1\n\n", b"data: [DONE]\n\n"], go)
    gw = gateway(max_in_flight=1)
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", gw.url + "/v1/completions", json=STREAM) as r,
    ):
        chunks = r.iter_raw()
        next(chunks)  # holds the only slot
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=httpx.Timeout(10, read=0.3))
        eventually(lambda: sum(snapshot(gw).gate.queued.values()) == 0, "the waiter leaves the queue")
        go.set()
        assert b"".join(chunks) == b"data: [DONE]\n\n"
    assert len(upstream.seen) == 1  # the abandoned request never went upstream


# -- upstream failures ----------------------------------------------------------------------------
def test_connect_refused_gives_502(gateway: Callable[..., GatewayServer]) -> None:
    """A refused connection says the server is gone: the first request waits replay.dead_window for a restart
    to drain the gateway, then gets the error; with no restart seen, the next one gets it at once."""
    gw = gateway(upstream=f"http://127.0.0.1:{free_port()}", replay=ReplayConfig(dead_window=0.3))
    for _ in range(2):
        r = httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=10)
        assert r.status_code == 502
        assert r.json()["error"]["type"] == "bad_gateway"
        assert r.json()["error"]["code"] == "upstream_connect"
    assert httpx.get(gw.url + "/health", timeout=10).status_code == 502
    snap = snapshot(gw)
    assert snap.proxy.upstream_errors_total == {"connect": 3}
    assert snap.proxy.replays_total == {"not_drained": 2}
    assert gw.call_sync(lambda: gw.proxy.replays.unrestarted, timeout=10)
    assert snap.gate.in_flight == 0


def test_upstream_silence_gives_504(upstream: Upstream, gateway: Callable[..., GatewayServer]) -> None:
    upstream.routes["/v1/completions"] = hang(upstream)
    gw = gateway(read_timeout=0.3)
    r = httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=10)
    assert r.status_code == 504
    assert r.json()["error"] == {
        "message": r.json()["error"]["message"],
        "type": "gateway_timeout",
        "code": "upstream_timeout",
    }
    assert upstream.disconnected.wait(10)  # the gateway gave up on the upstream request
    assert snapshot(gw).proxy.upstream_errors_total == {"timeout": 1}


@pytest.mark.parametrize("action", ["hang", "close"])
def test_upstream_failure_mid_stream_truncates_the_response(
    action: str, upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    upstream.routes["/v1/completions"] = stream_then(action, upstream)
    gw = gateway(read_timeout=0.3)
    got = b""
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", gw.url + "/v1/completions", json=STREAM) as r,
    ):
        assert r.status_code == 200  # already sent: it cannot become a 502
        with pytest.raises(httpx.RemoteProtocolError):  # no final chunk: the client knows the body is cut
            for chunk in r.iter_raw():
                got += chunk
    assert got == b"data: first\n\n"
    kind = "timeout" if action == "hang" else "protocol"
    eventually(lambda: snapshot(gw).proxy.upstream_errors_total == {kind: 1}, f"a {kind} error is counted")
    assert r.status_code == 200


def test_bad_upstream_header_values_never_reach_the_client(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    upstream.routes["/ctl"] = fixed(200, [("X-Ctl", "a\x01b"), ("X-Fine", "ok")], b"body")
    gw = gateway()
    r = httpx.get(gw.url + "/ctl", timeout=10)
    assert "x-ctl" not in r.headers
    assert r.status_code == 502 or (r.headers["x-fine"], r.content) == ("ok", b"body")


# -- bad input ------------------------------------------------------------------------------------
def test_content_length_over_max_body_gives_413_before_reading(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway(max_body=1000)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    raw = exchange(gw.config.listen_port, head + b"Content-Length: 1000000000\r\n\r\n")  # and no body at all
    assert status_of(raw) == 413
    assert json.loads(raw.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "body_too_large"
    assert b"connection: close" in raw.lower()
    ok = httpx.post(gw.url + "/v1/completions", content=b"x" * 1000, timeout=10)  # exactly the limit passes
    assert ok.status_code == 200
    assert [s.body for s in upstream.seen] == [b"x" * 1000]


def test_chunked_body_over_max_body_gives_413(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway(max_body=1000)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    piece = b"258\r\n" + b"y" * 600 + b"\r\n"
    raw = exchange(gw.config.listen_port, head + piece, piece + b"0\r\n\r\n")
    assert status_of(raw) == 413
    assert upstream.seen == []
    assert snapshot(gw).proxy.body_too_large_total == 1


def test_slow_body_gives_408(upstream: Upstream, gateway: Callable[..., GatewayServer]) -> None:
    gw = gateway(client_timeout=0.5)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    raw = exchange(gw.config.listen_port, head + b'{"model": ')  # 90 bytes never come
    assert status_of(raw) == 408
    assert upstream.seen == []
    snap = snapshot(gw)
    assert snap.proxy.client_timeouts_total == 1
    assert snap.gate.in_flight == 0


def trickle_until_cut(sock: socket.socket, first: bytes) -> bytes:
    """Send `first`, then one header line every 50 ms (at most 200); what the gateway answered once it
    closed the connection. Fails if it never does."""
    sock.sendall(first)
    for i in range(200):
        readable, _, _ = select.select([sock], [], [], 0.05)
        if readable:
            return read_all(sock)
        try:
            sock.sendall(b"X-Slow-%d: 1\r\n" % i)
        except (BrokenPipeError, ConnectionResetError):
            return b""
    raise AssertionError("the slow client was never cut off")


def test_slowloris_headers_are_cut_off(upstream: Upstream, gateway: Callable[..., GatewayServer]) -> None:
    gw = gateway(client_timeout=0.5)
    port = gw.config.listen_port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        raw = trickle_until_cut(sock, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    assert raw == b"" or status_of(raw) == 408
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:  # connects and says nothing
        assert status_of(read_all(sock)) == 408
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:  # the second request trickles
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while b"}" not in first:
            first += sock.recv(65536)
        assert status_of(first) == 200
        raw = trickle_until_cut(sock, b"GET /echo HTTP/1.1\r\n")
    assert raw == b"" or status_of(raw) == 408
    assert [s.target for s in upstream.seen] == ["/echo"]
    assert snapshot(gw).proxy.client_timeouts_total >= 2


@pytest.mark.parametrize(
    "header",
    [
        b"X-Evil: a\rInjected: 1\r\n",  # bare CR
        b"X-Evil: a\nInjected: 1\r\n",  # bare LF
        b"X-Evil: a\r\n Injected: 1\r\n",  # obs-fold
        b"X-Evil: a\x00Injected: 1\r\n",  # NUL
        b"X-Evil: a\x01b\r\n",  # another control character
    ],
)
def test_header_injection_never_reaches_the_upstream(
    header: bytes, upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway()
    raw = exchange(
        gw.config.listen_port, b"GET /echo HTTP/1.1\r\nHost: x\r\n" + header + b"Connection: close\r\n\r\n"
    )
    for seen in upstream.seen:
        assert all(
            "\r" not in v and "\n" not in v and "\x00" not in v and "\x01" not in v for _, v in seen.headers
        )
    if b"a\nInjected" in header and HttpProtocol.__name__ == "H11Protocol":
        # h11 reads a bare LF as a line end (RFC 9112 2.2 allows it): the client sent two header lines, and
        # the gateway re-sends each with CRLF, so it and the upstream agree on where every header ends.
        assert status_of(raw) == 200
        assert (upstream.seen[-1].header("x-evil"), upstream.seen[-1].header("injected")) == (["a"], ["1"])
    else:  # refused (httptools refuses them all), or the value dropped or unfolded into one line
        assert status_of(raw) in (200, 400)
        assert all(seen.header("injected") == [] for seen in upstream.seen)


def test_non_ascii_header_values_pass_byte_for_byte(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway()
    value = "café ✓".encode()
    raw = exchange(
        gw.config.listen_port,
        b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Name: " + value + b"\r\nConnection: close\r\n\r\n",
    )
    assert status_of(raw) == 200
    assert upstream.seen[-1].header("x-name") == [
        value.decode("latin-1")
    ]  # the upstream reads bytes as latin-1


# -- admission ------------------------------------------------------------------------------------
def test_a_full_queue_gives_429_with_retry_after(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    go = threading.Event()
    upstream.routes["/v1/completions"] = sse([b"data: 1\n\n", b"data: [DONE]\n\n"], go)
    gw = gateway(max_in_flight=1, max_queue=0)
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", gw.url + "/v1/completions", json=STREAM) as held,
    ):
        chunks = held.iter_raw()
        next(chunks)
        r = httpx.post(
            gw.url + "/v1/completions",
            json=COMPLETION,
            headers={b"X-Session-ID": b"evil\xe2\x80\xa8value"},
            timeout=10,
        )
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
        assert set(r.headers) == {"content-type", "content-length", "retry-after"}  # nothing of the client's
        error = r.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_exceeded", "queue_full")
        assert isinstance(error["message"], str) and error["message"]
        assert httpx.get(gw.url + "/v1/models", timeout=10).status_code == 200  # GETs are not admitted
        go.set()
        assert b"".join(chunks) == b"data: [DONE]\n\n"
    assert httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=10).status_code == 200
    assert snapshot(gw).gate.rejected_total["queue_full"] == 1


def test_only_posts_to_inference_routes_are_admitted(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway(drain_mode="reject")
    gw.call_sync(lambda: gw.gate.set_drain(True))
    r = httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=10)
    assert r.status_code == 503
    assert int(r.headers["retry-after"]) >= 1
    assert (r.json()["error"]["type"], r.json()["error"]["code"]) == ("service_unavailable", "draining")
    assert httpx.get(gw.url + "/v1/models", timeout=10).status_code == 200
    assert httpx.post(gw.url + "/tokenize", json={}, timeout=10).status_code == 200
    assert httpx.put(gw.url + "/v1/completions", json={}, timeout=10).status_code == 200
    gw.call_sync(lambda: gw.gate.set_drain(False))
    assert httpx.post(gw.url + "/v1/completions", json=COMPLETION, timeout=10).status_code == 200
    assert [s.target for s in upstream.seen] == [
        "/v1/models",
        "/tokenize",
        "/v1/completions",
        "/v1/completions",
    ]


def test_session_and_priority_come_from_headers(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway()
    headers = {"X-Session-ID": "agent-7", "X-Priority": "batch"}
    for _ in range(2):
        assert (
            httpx.post(gw.url + "/v1/completions", json=COMPLETION, headers=headers, timeout=10).status_code
            == 200
        )
    assert (
        httpx.post(gw.url + "/v1/completions", json={**COMPLETION, "user": "u1"}, timeout=10).status_code
        == 200
    )
    snap = snapshot(gw)
    assert snap.gate.admitted_total == {"interactive": 1, "batch": 2}
    assert {s.session: s.requests_total for s in snap.sessions} == {"agent-7": 2, "u1": 1}
    assert snap.proxy.ttfb.count == 3
    assert snap.proxy.responses_total == {"200": 3}


# -- the server -----------------------------------------------------------------------------------
def test_start_on_a_busy_port_names_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = GatewayServer(GatewayConfig(target="t", upstream="http://127.0.0.1:1", listen_port=port))
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            server.start()


def test_call_runs_on_the_gateway_loop(gateway: Callable[..., GatewayServer]) -> None:
    gw = gateway(max_in_flight=8)

    async def from_another_loop() -> tuple[int, bool]:
        limit = await gw.call(lambda: gw.gate.limit)
        on_gateway_thread = await gw.call(lambda: threading.current_thread().name == "gateway-test")
        return limit, on_gateway_thread

    assert asyncio.run(from_another_loop()) == (8, True)

    def boom() -> None:
        raise ValueError("from the gateway loop")

    with pytest.raises(ValueError, match="from the gateway loop"):
        gw.call_sync(boom)


def test_stop_lets_an_in_flight_stream_finish(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    go = threading.Event()
    events = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
    upstream.routes["/v1/completions"] = sse(events, go)
    gw = gateway()
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", gw.url + "/v1/completions", json=STREAM) as r,
    ):
        chunks = r.iter_raw()
        first = next(chunks)
        stopping = threading.Thread(target=gw.stop, kwargs={"grace": 20.0})
        stopping.start()
        go.set()
        rest = b"".join(chunks)
    stopping.join(30)
    assert not stopping.is_alive()
    assert first + rest == b"".join(events)
    with pytest.raises(httpx.ConnectError):
        httpx.get(gw.url + "/v1/models", timeout=10)
