"""Fuzz harness: the own API's listener, over raw sockets, against a real daemon (its own thread and loop).

The daemon's API runs with a 0.5 s header deadline, 4 KiB of headers and a 512-byte request line, so that the
limits are reached by small examples. Each example sends one request as raw bytes:

* method: the usual ones, random tokens, bytes that are not tokens;
* target: read routes that ignore their query (/healthz, /metrics, /api/v1/targets, /api/v1/rules) and
  state-changing ones (refused without the token before any handler), with random %-escapes, queries and
  lengths around the request-line limit;
* headers: random names and values, obs-text, control bytes, a total size around the header limit, sent in
  one write or in pieces;
* framing: a Content-Length body, chunked, none, or a head that stops short (the deadline's case).

After each example:

* a head over a limit got a JSON 414 or 431 and the connection closed; a head that stopped short got a JSON
  408 within the deadline; a head within the limits never got 408, 414 or 431;
* every response is complete HTTP/1.1; refusals (400 but uvicorn's plain-text one for bytes its parser
  refuses, 401, 403, 413) are JSON; no 5xx but /healthz' own 503 (the target is down);
* nothing was logged at ERROR, and /healthz on a new connection still answers.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tests.support.daemon_thread import DaemonThread, raise_nofile
from tests.support.fuzzing import fuzz
from vllm_watchdog.listener import ListenerLimits

LIMITS = ListenerLimits(max_connections=64, header_timeout=0.5, max_header_bytes=4096, max_request_line=512)
PARSER_400 = b"Invalid HTTP request received."


@dataclass(frozen=True)
class Request:
    """One raw request."""

    method: bytes
    target: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    framing: str  # length | chunked | none | short
    pieces: int  # the head is written in this many parts

    def head(self) -> bytes:
        lines = [self.method + b" " + self.target + b" HTTP/1.1", b"Host: api.test"]
        lines += [name + b": " + value for name, value in self.headers]
        if self.framing == "length":
            lines.append(b"Content-Length: %d" % len(self.body))
        elif self.framing == "chunked":
            lines.append(b"Transfer-Encoding: chunked")
        return b"\r\n".join(lines) + b"\r\n" + (b"" if self.framing == "short" else b"\r\n")

    def payload(self) -> bytes:
        if self.framing == "length":
            return self.body
        if self.framing == "chunked":
            return (b"%x\r\n%s\r\n" % (len(self.body), self.body) if self.body else b"") + b"0\r\n\r\n"
        return b""

    @property
    def line_too_long(self) -> bool:
        """The request line, with its CR, is over the limit."""
        return len(self.head().partition(b"\n")[0]) > LIMITS.max_request_line

    @property
    def head_too_large(self) -> bool:
        return len(self.head()) > LIMITS.max_header_bytes


_TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-", min_size=1, max_size=10)
_ROUTES = [b"/healthz", b"/metrics", b"/api/v1/targets", b"/api/v1/rules", b"/-/reload", b"/api/v1/pause"]
_ROUTES += [b"/api/v1/silences", b"/nope", b"//healthz", b"/%2e%2e/healthz"]
_SEGMENT = st.text("abcxyz0189-._~!$&'()*+,;=:@%", max_size=12).map(str.encode)


@st.composite
def target(draw: st.DrawFn) -> bytes:
    path = draw(st.sampled_from(_ROUTES))
    if draw(st.booleans()):
        path += b"?" + draw(_SEGMENT)
    if draw(st.integers(0, 4)) == 0:  # around the request-line limit
        path += b"?pad=" + b"p" * draw(st.integers(400, 600))
    return path


@st.composite
def headers(draw: st.DrawFn) -> tuple[tuple[bytes, bytes], ...]:
    out = []
    values = st.one_of(
        st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20).map(str.encode),
        st.binary(max_size=12).filter(lambda b: b"\r" not in b and b"\n" not in b),
    )
    for _ in range(draw(st.integers(0, 4))):
        out.append((b"X-Fuzz-" + draw(_TOKEN).encode(), draw(values)))
    if draw(st.integers(0, 3)) == 0:  # around the header limit
        out.append((b"X-Pad", b"v" * draw(st.integers(3800, 4300))))
    if draw(st.integers(0, 5)) == 0:
        out.append((b"Authorization", draw(st.sampled_from([b"Bearer nope", b"Basic x", b"Bearer"]))))
    return tuple(out)


@st.composite
def request(draw: st.DrawFn) -> Request:
    method = draw(
        st.sampled_from([b"GET"] * 6 + [b"POST", b"HEAD", b"DELETE", b"OPTIONS", b"FOO", b"G\xc3T"])
    )
    framing = draw(st.sampled_from(["none"] * 4 + ["length", "chunked", "short"]))
    body = draw(st.binary(max_size=64)) if framing in ("length", "chunked") else b""
    return Request(method, draw(target()), draw(headers()), body, framing, draw(st.integers(1, 4)))


# --- the daemon and the wire -------------------------------------------------------------------------------


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonThread, _Errors]]:
    raise_nofile()
    errors = _Errors()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "uvicorn", "vllm_watchdog", "asyncio")]
    for logger in loggers:
        logger.addHandler(errors)
    with DaemonThread(Path(tmp_path_factory.mktemp("fuzz-api")), LIMITS) as d:
        yield d, errors
    for logger in loggers:
        logger.removeHandler(errors)


def send(port: int, req: Request) -> tuple[bytes, float]:
    """Send the request; everything the API answered until it closed (or 5 s passed), and how long it took."""
    started = time.monotonic()
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        head = req.head()
        step = max(1, len(head) // req.pieces)
        try:
            for i in range(0, len(head), step):
                sock.sendall(head[i : i + step])
            sock.sendall(req.payload())
            if req.framing != "short":
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return data, time.monotonic() - started


def first_response(data: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0].startswith(b"HTTP/1.1 "), data[:200]
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    length = int(headers.get(b"content-length", b"0"))
    return int(lines[0].split(b" ", 2)[1]), headers, rest[:length]


@fuzz(0.5)
@given(request())
def test_api_listener(api: tuple[DaemonThread, _Errors], req: Request) -> None:
    d, errors = api
    data, took = send(d.port, req)
    if req.line_too_long or req.head_too_large:
        event("over a limit")
        status, headers, _ = first_response(data)
        if status != 400:  # the parser may refuse a bad method or byte before the size is reached
            assert status == (414 if req.line_too_long else 431), data[:200]
            assert headers[b"content-type"] == b"application/json"
            assert headers[b"connection"] == b"close"
    elif req.framing == "short":
        event("stopped short")
        status, headers, _ = first_response(data)
        assert status in (400, 408), data[:200]
        assert took < 5
        if status == 408:
            assert headers[b"content-type"] == b"application/json"
    else:
        status, headers, body = first_response(data)
        event(f"status {status}")
        assert status not in (408, 414, 431), data[:200]
        if status in (401, 403, 413):  # the guard's refusals
            assert headers[b"content-type"] == b"application/json", data[:300]
        if status == 400 and body != PARSER_400:  # else uvicorn's parser refused a bad method or byte
            assert headers[b"content-type"] == b"application/json", data[:300]
        assert status < 500 or (status == 503 and req.target.startswith(b"/healthz")), data[:300]
    assert not errors.records, [r.getMessage() for r in errors.records]
    health, _ = send(d.port, Request(b"GET", b"/healthz", (), b"", "none", 1))
    assert first_response(health)[0] in (200, 503)
