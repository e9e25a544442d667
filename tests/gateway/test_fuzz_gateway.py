"""Fuzz harness: the gateway's request handling, over raw sockets, in front of a scripted loopback upstream.

One GatewayServer (its own thread, uvicorn with httptools, max_body 2 KiB, client_timeout 0.5 s, a session
rate limit high enough to be exercised without refusing) runs in front of a gateway_upstream.Upstream whose
every path answers what the example scripts. Each example sends one request as raw bytes:

* method: the usual ones, random tokens and bytes that are not tokens;
* target: the OpenAI paths, /health, /metrics, random segments with %-escapes, non-ASCII and control bytes,
  query strings;
* headers: the session header (random bytes, non-UTF-8, control characters), X-Priority, Authorization
  (bearer or not), Content-Type variants (JSON, +json, text, none), Connection (close, keep-alive, naming other
  headers), Keep-Alive, TE, Upgrade, Proxy-*, Expect: 100-continue, a missing or repeated Host, random names
  and values with obs-text;
* body: OpenAI-shaped JSON (messages, tool calls, `user`, `stream` of any type), random JSON, JSON nested
  thousands deep, invalid JSON, broken UTF-8, random bytes, bodies over max_body;
* framing: a correct Content-Length or chunked body, none, a Content-Length larger than the body (the client
  then half-closes, or stays silent until the 408), smaller than the body, not a number, repeated with two
  values, 10**12, a chunked body with broken chunk sizes;

and the upstream answers a random status (2xx to 5xx), random end-to-end headers plus hop-by-hop ones, and a
JSON body with a `usage` of any shape, SSE events with `usage` split across chunks, or random bytes, with a
Content-Length or chunked.

After each example:

* the gateway never answers with a 5xx of its own for client input: a 5xx is only ever the upstream's own
  status passed through;
* a request the upstream saw was passed through faithfully: same method, target and body (as framed), every
  end-to-end header that can be re-sent (no control characters, valid UTF-8) in order, hop-by-hop ones
  dropped; and the client got the upstream's status, end-to-end headers and body;
* a request the upstream did not see got a 4xx with an OpenAI-shaped JSON error from the gateway, or was
  refused by the HTTP parser (uvicorn's plain-text 400), or got nothing because the client half-closed it;
* nothing was logged at ERROR, the gate's in-flight count, queue and per-session counts return to 0, and a
  good request on a new connection is served.

Allowed differences, each forced by the HTTP layer under the gateway: a fragment in the target (which a
client must not send) is dropped by the HTTP parser, and an empty query (`/p?`) reaches the upstream as `/p`
(ASGI hands the path and the query over separately); when bytes follow a request as framed (a body without a
Content-Length, or longer than it), uvicorn parses them as a pipelined request and its plain-text 400 for them
may come before the first request's response.

Excluded: upstream faults (timeouts, resets, truncated responses) are the chaos tests' and
tests/gateway/test_proxy.py's; here the upstream always answers well-formed HTTP. Requests that reach the
upstream after the first one on a connection (the remainder of a body longer than its Content-Length, parsed as
a pipelined request) are not checked beyond the in-flight and crash checks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from tests.support.fuzzing import fuzz
from tests.support.gateway_upstream import Seen, Upstream, chunk, echo, response_head
from tests.support.vllm_server import free_port
from vllm_watchdog.gateway.config import GatewayConfig, SessionConfig
from vllm_watchdog.gateway.dataplane.server import GatewayServer

MAX_BODY = 2048
# RFC 9110 7.6.1's hop-by-hop headers, written out here rather than taken from the proxy under test.
HOP_BY_HOP = {b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
HOP_BY_HOP |= {b"proxy-connection"}
CLIENT_TIMEOUT = 0.5
PARSER_400 = b"Invalid HTTP request received."  # uvicorn's answer to bytes its HTTP parser refuses

# --- the upstream's scripted answer --------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """What the upstream sends back."""

    status: int
    headers: tuple[tuple[str, str], ...]
    chunks: tuple[bytes, ...]  # the body, as written (one chunk each when chunked)
    chunked: bool

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def has_body(self, method: bytes) -> bool:
        return method != b"HEAD" and self.status not in (204, 304)


class Scripted(dict[str, Any]):
    """Upstream.routes: every path gets the current handler."""

    handler: Any = staticmethod(echo)

    def get(self, key: str, default: Any = None) -> Any:
        return self.handler


def handler_for(answer: Answer) -> Any:
    """An upstream handler writing `answer`."""

    async def handle(seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with_body = answer.has_body(seen.method.encode("latin-1"))
        headers = list(answer.headers)
        if answer.chunked and with_body:
            headers.append(("Transfer-Encoding", "chunked"))
        elif answer.status not in (204, 304):
            headers.append(("Content-Length", str(len(answer.body))))
        writer.write(response_head(answer.status, headers))
        if with_body:
            if answer.chunked:
                for part in answer.chunks:
                    if part:
                        writer.write(chunk(part))
                        await writer.drain()
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(answer.body)
        await writer.drain()

    return handle


_TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-", min_size=1, max_size=8)
_VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20).map(str.strip)
_USAGE = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens": st.one_of(
                st.integers(-5, 2**40), st.floats(), st.text(max_size=3), st.booleans()
            ),
            "completion_tokens": st.integers(-5, 2**34),
            "prompt_tokens_details": st.one_of(
                st.none(), st.fixed_dictionaries({}, optional={"cached_tokens": st.integers(-1, 2**33)})
            ),
        },
    ),
    st.text(max_size=5),
)


@st.composite
def answer(draw: st.DrawFn) -> Answer:
    """A well-formed upstream response of random shape."""
    status = draw(st.sampled_from([200, 200, 200, 201, 204, 304, 400, 404, 418, 429, 500, 502, 503]))
    names = st.dictionaries(_TOKEN.map(str.lower), _VALUE, max_size=3)  # distinct names, whatever the case
    headers = [(f"X-Up-{name}", value) for name, value in draw(names).items()]
    hop = draw(st.sampled_from([[], [("Connection", "keep-alive")], [("Keep-Alive", "timeout=5")]]))
    hop += draw(
        st.sampled_from([[], [("Proxy-Foo", "1")], [("Connection", "X-Up-Gone"), ("X-Up-Gone", "1")]])
    )
    kind = draw(st.sampled_from(["json", "sse", "bytes", "empty"]))
    if kind == "json":
        doc = {"id": "x", "choices": [], "usage": draw(_USAGE)}
        text = json.dumps(doc).encode()
        cut = sorted(draw(st.lists(st.integers(0, len(text)), max_size=3)))
        chunks = [text[a:b] for a, b in zip([0, *cut], [*cut, len(text)], strict=True)]
        headers.append(("Content-Type", "application/json"))
    elif kind == "sse":
        events = [
            b'data: {"choices": [{"text": "t"}], "usage": null}\n\n' for _ in range(draw(st.integers(0, 3)))
        ]
        events.append(b"data: " + json.dumps({"choices": [], "usage": draw(_USAGE)}).encode() + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        text = b"".join(events)
        cut = sorted(draw(st.lists(st.integers(0, len(text)), max_size=4)))
        chunks = [text[a:b] for a, b in zip([0, *cut], [*cut, len(text)], strict=True)]
        headers.append(("Content-Type", "text/event-stream"))
    elif kind == "bytes":
        chunks = draw(st.lists(st.binary(max_size=64), min_size=1, max_size=3))
    else:
        chunks = [b""]
    return Answer(status, tuple(headers + hop), tuple(chunks), draw(st.booleans()))


# --- the client's request ------------------------------------------------------------------------------------

# Three requests in four are well-formed HTTP (what reaches the gateway's own code); the fourth breaks the
# HTTP layer in one place: method, target, header value or framing.
FRAMINGS = ["length"] * 10 + ["chunked"] * 4 + ["short", "huge", "slow"]  # slow: a 408 after client_timeout
BAD_FRAMINGS = ["none", "long", "nan", "twice", "badchunk"]  # leftover bytes, or refused by the parser


@dataclass(frozen=True)
class Request:
    """One raw request: the framing decides how the body goes on the wire."""

    method: bytes
    target: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    framing: str
    host: int = 1  # how many Host headers

    def wire(self) -> bytes:
        """The request's bytes."""
        lines = [self.method + b" " + self.target + b" HTTP/1.1"]
        lines += [b"Host: gw.test"] * self.host
        lines += [name + b": " + value for name, value in self.headers]
        body = self.body
        n = len(body)
        framing = {
            "length": [b"Content-Length: %d" % n],
            "short": [b"Content-Length: %d" % (n + 10)],
            "slow": [b"Content-Length: %d" % (n + 10)],
            "long": [b"Content-Length: %d" % max(0, n - 3)],
            "nan": [b"Content-Length: 1x"],
            "twice": [b"Content-Length: %d" % n, b"Content-Length: %d" % (n + 1)],
            "huge": [b"Content-Length: 1000000000000"],
            "chunked": [b"Transfer-Encoding: chunked"],
            "badchunk": [b"Transfer-Encoding: chunked"],
            "none": [],
        }[self.framing]
        head = b"\r\n".join(lines + framing) + b"\r\n\r\n"
        if self.framing == "chunked":
            return head + (chunk(body) if body else b"") + b"0\r\n\r\n"
        if self.framing == "badchunk":
            return head + b"zz\r\n" + body + b"\r\n0\r\n\r\n"
        if self.framing == "huge":
            return head
        return head + body

    @property
    def sent_body(self) -> bytes:
        """The body as the gateway should read it (the first Content-Length bytes)."""
        if self.framing == "long":
            return self.body[: max(0, len(self.body) - 3)]
        if self.framing == "none":
            return b""
        return self.body

    @property
    def forwarded_target(self) -> bytes | None:
        """The target as the upstream should see it, None if the gateway must refuse its path: the path
        normalised (upstream_path), without a fragment (a client must not send one; the HTTP parser drops it),
        and, since ASGI gives the path and the query apart, an empty query (`/p?`) as `/p`."""
        text = self.target.partition(b"#")[0]
        path, _, query = text.partition(b"?")
        normal = upstream_path(path)
        if normal is None:
            return None
        return normal + (b"?" + query if query else b"")

    @property
    def leftover(self) -> bool:
        """Whether bytes follow the request as framed: the server parses them as a pipelined request, and
        when they are not one, uvicorn answers 400 and closes, which may overtake the first response."""
        return self.framing in ("none", "long") and len(self.sent_body) < len(self.body)

    @property
    def half_close(self) -> bool:
        """Whether the client shuts its side after sending (it promised more body than it sends)."""
        return self.framing == "short"


_UNRESERVED = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def upstream_path(path: bytes) -> bytes | None:
    """The path as vLLM routes on it, written out from RFC 3986 (6.2.2.2 unreserved escapes decoded, 5.2.4 dot
    segments removed) plus empty segments collapsed; None where it must be refused: an escape that decodes to
    `/`, `\\` or NUL, or a raw backslash."""
    escapes = [int(h, 16) for h in re.findall(rb"%([0-9A-Fa-f]{2})", path)]
    if b"\\" in path or any(b in (0x2F, 0x5C, 0x00) for b in escapes):
        return None
    decoded = re.sub(
        rb"%([0-9A-Fa-f]{2})",
        lambda m: bytes([int(m[1], 16)]) if int(m[1], 16) in _UNRESERVED else m[0],
        path,
    )
    kept: list[bytes] = []
    segments = decoded.split(b"/")[1:]
    for segment in segments:
        if segment == b"..":
            kept = kept[:-1]
        elif segment not in (b"", b"."):
            kept.append(segment)
    trailing = bool(kept) and segments[-1] in (b"", b".", b"..")
    return b"/" + b"/".join(kept) + (b"/" if trailing else b"")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)
_TOOL_CALL = st.fixed_dictionaries(
    {"type": st.just("function")},
    optional={
        "function": st.fixed_dictionaries(
            {},
            optional={
                "name": st.one_of(st.text(max_size=6), _JSON),
                "arguments": st.one_of(st.text(max_size=12), _JSON),
            },
        ),
        "id": st.text(max_size=4),
    },
)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", 7])},
    optional={
        "content": _JSON,
        "tool_calls": st.one_of(st.lists(_TOOL_CALL, max_size=3), _JSON),
        "function_call": _JSON,
    },
)
_OPENAI = st.fixed_dictionaries(
    {"model": st.just("m")},
    optional={
        "messages": st.one_of(st.lists(_MESSAGE, max_size=4), _JSON),
        "prompt": st.text(max_size=10),
        "stream": st.one_of(st.booleans(), _JSON),
        "user": st.one_of(st.text(max_size=80), _JSON),
        "max_tokens": st.integers(),
    },
)


@st.composite
def body(draw: st.DrawFn) -> bytes:
    """A request body: JSON of many shapes, invalid JSON, broken UTF-8, random or oversize bytes."""
    kind = draw(
        st.sampled_from(["openai", "openai", "json", "deep", "invalid", "utf8", "bytes", "big", "empty"])
    )
    if kind == "openai":
        return json.dumps(draw(_OPENAI)).encode("utf-8", "surrogatepass")
    if kind == "json":
        return json.dumps(draw(_JSON)).encode()
    if kind == "deep":  # past Python's recursion limit, within max_body
        depth = draw(st.integers(990, MAX_BODY // 2 - 12))
        prefix = draw(st.sampled_from([b"", b'{"messages":', b'{"user":"u","tools":']))
        closing = b"}" if prefix else b""
        return prefix + b"[" * depth + b"]" * depth + closing
    if kind == "invalid":
        return draw(st.sampled_from([b"{", b'{"user": "a",}', b"nan", b'{"stream": true', b"\x00", b"[]"]))
    if kind == "utf8":
        return b'{"user": "' + draw(st.binary(min_size=1, max_size=8)) + b'", "stream": true}'
    if kind == "bytes":
        return draw(st.binary(max_size=256))
    if kind == "big":
        return b"x" * draw(st.integers(MAX_BODY - 2, MAX_BODY + 3000))
    return b""


_PATHS = [b"/v1/chat/completions", b"/v1/completions"] * 3
_PATHS += [b"/v1/models", b"/health", b"/metrics", b"/v1/x", b"/", b"//v1/completions", b"/invocations"]
ADMIN_PATHS = {b"/pause", b"/v1/load_lora_adapter"}  # refused (403): never forwarded
_PATHS += [b"/v1/./chat/completions", b"/x/../v1/completions", *ADMIN_PATHS]
METHODS = [b"POST"] * 8 + [b"GET", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"HEAD"]
BAD_METHODS = [b"FOO", b"post", b"P\xc3\xa9", b"GET\x00", b""]  # not methods, or not tokens
_URL_SAFE = st.text("abcxyzABC0189-._~!$&'()*+,;=:@%", max_size=8).map(str.encode)
_RAW_BYTES = st.binary(max_size=6).map(lambda b: b.replace(b" ", b"%20"))
_PRINTABLE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=16).map(str.encode)
_UTF8 = st.text(st.characters(exclude_categories=["Cs", "Cc"]), max_size=8).map(lambda t: t.encode("utf-8"))
_NO_CRLF = st.binary(max_size=16).filter(lambda b: b"\r" not in b and b"\n" not in b)


@st.composite
def target(draw: st.DrawFn, bad: bool = False) -> bytes:
    """A request target: known paths, segments, %-escapes and queries; `bad` adds raw bytes."""
    segment = _RAW_BYTES if bad else _URL_SAFE
    path = draw(st.sampled_from(_PATHS))
    if bad or draw(st.integers(0, 2)) == 0:
        path += b"/" + draw(st.sampled_from([b"%2e%2e", b"%ff", b"a%00", b"..", b"~x"]) | segment)
    if draw(st.booleans()):
        path += b"?" + draw(st.sampled_from([b"a=1", b"x=%20y&z", b"", b"#frag"]) | segment)
    return path


_SESSION_VALUES = [b"s1", b" padded ", b"other", b"anonymous", b"x~", b"a" * 200, b"caf\xc3\xa9", b"\xff\xfe"]
_OPTIONAL: list[tuple[bytes, st.SearchStrategy[bytes], int]] = [  # name, values, present one time in N
    (b"Content-Type", st.sampled_from([b"application/json", b"application/x+json; v=1", b"text/plain"]), 2),
    (b"Content-Type", st.sampled_from([b"APPLICATION/JSON", b"", b"application/json; charset=latin-1"]), 4),
    (b"X-Session-ID", st.one_of(_PRINTABLE, _UTF8, st.sampled_from(_SESSION_VALUES)), 2),
    (b"X-Priority", st.sampled_from([b"batch", b"BATCH", b"nope", b"", b"\xff"]), 3),
    (
        b"Authorization",
        st.sampled_from([b"Bearer k1", b"bearer  ", b"Basic x", b"Bearer \xe9", b"Bearer"]),
        3,
    ),
    (b"Connection", st.sampled_from([b"close", b"keep-alive", b"X-Drop, close", b"Upgrade", b"te"]), 3),
]
_HOP_HEADERS = [(b"X-Drop", b"1"), (b"Keep-Alive", b"timeout=1"), (b"TE", b"trailers"), (b"Trailer", b"X-T")]
_HOP_HEADERS += [(b"Proxy-Authorization", b"x"), (b"Upgrade", b"websocket"), (b"Expect", b"100-continue")]


@st.composite
def headers(draw: st.DrawFn, bad: bool = False) -> list[tuple[bytes, bytes]]:
    """Request headers other than Host and the framing ones; `bad` allows control characters in values."""
    out: list[tuple[bytes, bytes]] = []
    for name, values, one_in in _OPTIONAL:
        if draw(st.integers(1, one_in)) == 1:
            out.append((name, draw(values)))
    out += draw(st.lists(st.sampled_from(_HOP_HEADERS), max_size=3))
    fuzz_values = st.one_of(_PRINTABLE, _UTF8, _NO_CRLF) if bad else _PRINTABLE | _UTF8
    for _ in range(draw(st.integers(0, 3))):
        out.append((b"X-Fuzz-" + draw(_TOKEN).encode(), draw(fuzz_values)))
    return out


@st.composite
def request(draw: st.DrawFn) -> Request:
    """A whole raw request: well-formed HTTP, or (one in four) broken in one place."""
    bad = draw(st.sampled_from([None] * 12 + ["method", "target", "header", "framing"]))
    method = draw(st.sampled_from(BAD_METHODS if bad == "method" else METHODS))
    framing = draw(st.sampled_from(BAD_FRAMINGS if bad == "framing" else FRAMINGS))
    return Request(
        method,
        draw(target(bad=bad == "target")),
        tuple(draw(headers(bad=bad == "header"))),
        draw(body()),
        framing,
        draw(st.sampled_from([1, 1, 1, 0, 2])),
    )


# --- reading responses ---------------------------------------------------------------------------------------


@dataclass
class Response:
    """One parsed response."""

    status: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k.lower() == name]

    @property
    def from_parser(self) -> bool:
        """uvicorn's own 400 for bytes its HTTP parser refuses (plain text, before the gateway sees them)."""
        plain = self.header(b"content-type") == [b"text/plain; charset=utf-8"]
        return self.status == 400 and plain and self.body in (PARSER_400, b"")


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.closed = False

    def fill(self) -> bool:
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed = True
        self.buf += data
        return bool(data)

    def until(self, sep: bytes) -> bytes | None:
        while sep not in self.buf:
            if not self.fill():
                return None
        out, _, self.buf = self.buf.partition(sep)
        return out

    def exactly(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            if not self.fill():
                return None
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def read_response(sock: socket.socket, method: bytes) -> Response | None:
    """The first final response on the connection (1xx skipped), or None if the connection ends first."""
    reader = _Reader(sock)
    while True:
        head = reader.until(b"\r\n\r\n")
        if head is None:
            return None
        status_line, *lines = head.split(b"\r\n")
        response = Response(int(status_line.split(b" ", 2)[1]))
        response.headers = [
            (k.strip().lower(), v.strip()) for k, _, v in (line.partition(b":") for line in lines)
        ]
        if response.status >= 200:
            break
    if method == b"HEAD" or response.status in (204, 304):
        return response
    if b"chunked" in b",".join(response.header(b"transfer-encoding")).lower():
        parts = []
        while True:
            size_line = reader.until(b"\r\n")
            if size_line is None:
                return None  # truncated: not a complete response
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                reader.until(b"\r\n")
                break
            part = reader.exactly(size + 2)
            if part is None:
                return None
            parts.append(part[:-2])
        response.body = b"".join(parts)
    elif response.header(b"content-length"):
        data = reader.exactly(int(response.header(b"content-length")[0]))
        if data is None:
            return None
        response.body = data
    else:
        while reader.fill():
            pass
        response.body = reader.buf
    return response


def exchange(port: int, req: Request) -> Response | None:
    """Send the request; the response, or None if the connection ended without one."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        try:
            sock.sendall(req.wire())
            if req.half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            return read_response(sock, req.method)
        except (ConnectionResetError, BrokenPipeError):
            return None


# --- the gateway under test -----------------------------------------------------------------------------------


class _Errors(logging.Handler):
    """Collects ERROR records (uvicorn logs an exception from the app at ERROR)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Rig:
    """The running gateway, its upstream and what is logged."""

    def __init__(self, gateway: GatewayServer, upstream: Upstream, routes: Scripted, errors: _Errors) -> None:
        self.gateway = gateway
        self.upstream = upstream
        self.routes = routes
        self.errors = errors

    def __repr__(self) -> str:
        return f"Rig({self.gateway.url})"


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    """One gateway in front of one scripted upstream for the whole module."""
    upstream = Upstream()
    routes = Scripted()
    upstream.routes = routes
    config = GatewayConfig(
        target="fuzz",
        upstream=upstream.url,
        listen_port=free_port(),
        max_body=MAX_BODY,
        client_timeout=CLIENT_TIMEOUT,
        read_timeout=10.0,
        sessions=SessionConfig(rate=10_000.0, burst=10_000, max_in_flight=4, max_sessions=50),
    )
    gateway = GatewayServer(config)
    gateway.start()
    errors = _Errors()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "uvicorn", "vllm_watchdog", "asyncio")]
    for logger in loggers:
        logger.addHandler(errors)
    yield Rig(gateway, upstream, routes, errors)
    for logger in loggers:
        logger.removeHandler(errors)
    gateway.stop(grace=1.0)
    upstream.close()


def _error_json(response: Response) -> bool:
    try:
        doc = json.loads(response.body)
    except ValueError:
        return False
    error = doc.get("error") if isinstance(doc, dict) else None
    return isinstance(error, dict) and {"message", "type", "code"} <= set(error)


def _resendable(value: bytes) -> bool:
    """A header value the gateway forwards: no control characters, valid UTF-8."""
    if any((b < 0x20 and b != 0x09) or b == 0x7F for b in value):
        return False
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_forwarded(req: Request, seen: Seen) -> None:
    """The upstream got the client's method, target, body and end-to-end headers."""
    assert seen.method.encode("latin-1") == req.method
    assert seen.target.encode("latin-1") == req.forwarded_target
    assert seen.body == req.sent_body
    connection = b",".join(v for k, v in req.headers if k.lower() == b"connection").lower()
    named = {t.strip() for t in connection.split(b",")}
    expected = [
        # gateway_upstream reads values as latin-1 and str.strip()s them, which also takes \x85 and \xa0
        (name.lower(), value.decode("latin-1").strip().encode("latin-1"))
        for name, value in req.headers
        if name.lower() not in HOP_BY_HOP | {b"expect", b"content-length", b"host"}
        and not name.lower().startswith(b"proxy-")
        and name.lower() not in named
        and _resendable(value)
    ]
    got = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in seen.headers]
    forwarded = [(k, v) for k, v in got if k not in (b"host", b"content-length")]
    assert forwarded == expected, (forwarded, expected)
    assert [k for k, _ in got].count(b"host") == 1


def check_answered(req: Request, response: Response, ans: Answer) -> None:
    """The client got the upstream's status, end-to-end headers and body."""
    assert response.status == ans.status
    gone = {v.lower() for k, v in ans.headers if k.lower() == "connection"}
    for name, value in ans.headers:
        low = name.lower().encode()
        if low in (b"connection", b"transfer-encoding"):
            continue  # the gateway's server frames its own response
        if low in HOP_BY_HOP or low.startswith(b"proxy-") or name.lower() in gone:
            assert response.header(low) == [], name
        else:
            assert response.header(low) == [value.encode()], name
    if ans.has_body(req.method):
        assert response.body == ans.body


def settle(rig: Rig) -> None:
    """Wait (bounded) until nothing is in flight or queued and no session holds a slot."""
    gw = rig.gateway
    for _ in range(500):
        snap = gw.call_sync(gw.gate.snapshot, timeout=10)
        if snap.in_flight == 0 and not any(snap.queued.values()) and not snap.session_in_flight:
            return
        time.sleep(0.01)
    raise AssertionError(f"the gateway never settled: {snap}")


def good_request_is_served(rig: Rig) -> None:
    """A plain request on a new connection gets the upstream's answer."""
    rig.routes.handler = echo
    good = Request(
        b"POST", b"/v1/completions", ((b"Content-Type", b"application/json"),), b'{"prompt": "ok"}', "length"
    )
    response = exchange(rig.gateway.config.listen_port, good)
    assert response is not None and response.status == 200, response
    assert json.loads(response.body)["body"] == '{"prompt": "ok"}'


@fuzz(1.5)
@given(request(), answer())
@example(
    Request(b"POST", b"/v1/chat/completions", (), b'{"a":' * 3000 + b"1" + b"}" * 3000, "length"),
    Answer(200, (), (b"{}",), False),
)
@example(Request(b"GET", b"/\xc3\xa9?q=\xe9", (), b"", "none"), Answer(200, (), (b"ok",), False))
@example(
    Request(b"POST", b"/v1/completions", ((b"X-Session-ID", b"\xff\xfe"),), b"{}", "chunked"),
    Answer(200, (), (b"",), True),
)
@example(
    Request(
        b"POST",
        b"/v1/completions",
        ((b"Connection", b"Upgrade"), (b"Upgrade", b"websocket")),
        b"{}",
        "length",
    ),
    Answer(200, (), (b"{}",), False),
)
def test_request_handling(rig: Rig, req: Request, ans: Answer) -> None:
    rig.routes.handler = handler_for(ans)
    before = len(rig.upstream.seen)
    response = exchange(rig.gateway.config.listen_port, req)
    settle(rig)
    reached = rig.upstream.seen[before:]
    event(
        "outcome: "
        + (
            "forwarded"
            if reached
            else "no response"
            if response is None
            else "parser 400"
            if response.from_parser
            else f"gateway {response.status}"
        )
    )
    target = req.forwarded_target
    if reached:
        assert target is not None and target.partition(b"?")[0] not in ADMIN_PATHS, target
        check_forwarded(req, reached[0])
        if response is not None and not (req.leftover and response.from_parser):
            check_answered(req, response, ans)
        elif response is None:  # a forwarded request goes unanswered only when the client left first
            assert req.half_close or req.leftover
    elif response is None:
        assert req.half_close or req.framing in ("badchunk", "nan", "twice") or not req.method, req
    else:
        assert 400 <= response.status < 500, (response.status, response.body[:200])
        if not response.from_parser:
            assert response.header(b"content-type") == [b"application/json"]
            assert req.method == b"HEAD" or _error_json(response), response.body[:200]
    assert not rig.errors.records, [r.getMessage() for r in rig.errors.records]
    good_request_is_served(rig)
    settle(rig)


# --- regressions: what the fuzzer found ------------------------------------------------------------------------


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_upgrade_with_a_body_is_refused_not_forwarded_without_it(rig: Rig, framing: str) -> None:
    """uvicorn ends a request that asks for an upgrade with its headers, so its body never reached the gateway,
    which forwarded the POST with an empty body."""
    rig.routes.handler = echo
    before = len(rig.upstream.seen)
    upgrade = ((b"Connection", b"keep-alive, Upgrade"), (b"Upgrade", b"h2c"))
    response = exchange(
        rig.gateway.config.listen_port, Request(b"POST", b"/v1/completions", upgrade, b"{}", framing)
    )
    assert response is not None and response.status == 400
    assert json.loads(response.body)["error"]["code"] == "upgrade_not_supported"
    assert rig.upstream.seen[before:] == []
    settle(rig)
    # Without a body nothing is lost: the request passes through as a plain one (Upgrade is hop-by-hop).
    response = exchange(rig.gateway.config.listen_port, Request(b"GET", b"/ws", upgrade, b"", "none"))
    assert response is not None and response.status == 200
    assert [s.target for s in rig.upstream.seen[before:]] == ["/ws"]
    good_request_is_served(rig)
