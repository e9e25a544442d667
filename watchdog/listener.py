"""Bounds for the own HTTP listeners (the API and the gateway), below the HTTP server.

uvicorn has no header deadline, no header size limit and only a request-or-connection count
(`limit_concurrency`) that turns idle sockets into refused requests. `Listener` adds what a listener facing
hostile clients needs, as a wrapper around uvicorn's protocol (`uvicorn.Config(http=listener.protocol())`):

* a header deadline: a request's headers must arrive within `header_timeout` of its first byte (or of the
  connection's start), else 408 and close (slowloris); and, where the application has none of its own, a
  body deadline: the rest of the request within `body_timeout` of its headers; optionally a minimum upload
  rate: after `body_grace`, each further second needs `min_body_rate` bytes (Apache's MinRate), else 408;
* a header size limit: more than `max_header_bytes` before the end of the headers is answered 431, a request
  line over `max_request_line` 414, both before the HTTP parser buffers more;
* a connection cap, bounded by the file-descriptor limit: at the cap a new connection first closes the
  oldest idle keep-alive connection (quietly), then, with a 503, the one whose request began first among
  those still sending it: silent, sending headers, or (with `evict_uploads`) sending a body before any
  response. Oldest first, so that a probe that has just connected outlives a trickle that began before it.
  When every connection is busy with a request, a newcomer gets one of `reserve` slots beyond the cap, which
  only GET or HEAD of `probe_paths` may use (checked on the request line, before the parser sees it); only
  when those are busy too is it refused (503). Idle sockets never turn a request away.

Every refusal is a JSON body from the server's own `error_body` and is counted by reason.
"""

from __future__ import annotations

import asyncio
import http
import math
import resource
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as HttpProtocol
except ImportError:  # httptools (the C parser) is optional; h11 is pure Python and slower
    from uvicorn.protocols.http.h11_impl import H11Protocol as HttpProtocol  # type: ignore[assignment]

KiB = 1024
_TERMINATOR = b"\r\n\r\n"


@dataclass(frozen=True)
class ListenerLimits:
    """What one listener allows a client: connections, header and body time, header size."""

    max_connections: int = 1024  # further bounded by fd_share of the file-descriptor limit
    header_timeout: float = 10.0  # from connect, or a request's first byte, to the end of its headers
    body_timeout: float | None = 30.0  # from the end of the headers to the end of the body; None: the app's
    max_header_bytes: int = 64 * KiB  # request line and headers together
    max_request_line: int = 8 * KiB  # method, target and version
    fd_share: float = 0.25  # at most this share of RLIMIT_NOFILE's soft limit is spent on connections
    min_body_rate: float | None = None  # bytes/s a body must average after body_grace; None: no minimum
    body_grace: float = 5.0  # seconds after the headers before min_body_rate applies
    evict_uploads: bool = False  # at the cap, a connection still sending a body may make room (503)
    reserve: int = 0  # connections beyond the cap for probes, when every other one is busy with a request
    probe_paths: frozenset[str] = frozenset()  # what a reserve connection may ask for, with GET or HEAD


ErrorBody = Callable[[int, str, str], bytes]  # (status, reason, message) -> a JSON body
# Every reason a listener refuses a request or connection for (Listener.refused); each is exported from 0.
REFUSALS = (
    "header_timeout",
    "body_timeout",
    "body_too_slow",
    "header_too_large",
    "url_too_long",
    "connection_limit",
)
BUSY = "The server has too many open connections; retry shortly."
PROBES_ONLY = "The server's connections are all busy with requests; only health and metrics are answered now."


def body_deadline(limits: ListenerLimits, began: float, since: float, received: int) -> tuple[float, str]:
    """When a body must be complete, and the refusal's reason if it is not: `body_timeout` after `began`, or,
    with a minimum rate, `body_grace` plus a second per `min_body_rate` bytes `received` since `since`."""
    deadline, reason = math.inf, "body_timeout"
    if limits.body_timeout is not None:
        deadline = began + limits.body_timeout
    if limits.min_body_rate:
        paced = since + limits.body_grace + received / limits.min_body_rate
        if paced < deadline:
            deadline, reason = paced, "body_too_slow"
    return deadline, reason


def is_probe(request_line: bytes, paths: frozenset[str]) -> bool:
    """Whether a request line is a GET or HEAD of one of `paths` (exactly, before any query)."""
    parts = request_line.strip().split(b" ")
    if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD"):
        return False
    return parts[1].partition(b"?")[0].decode("ascii", "replace") in paths


def connection_cap(configured: int, fd_share: float) -> int:
    """`configured`, bounded by `fd_share` of the soft file-descriptor limit (at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(16, min(configured, int(soft * fd_share)))


def refusal_response(status: int, body: bytes, extra: bytes = b"") -> bytes:
    """A complete HTTP/1.1 JSON response that closes the connection."""
    phrase = http.HTTPStatus(status).phrase.encode()
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        status,
        phrase,
        len(body),
    )
    return head + extra + b"connection: close\r\n\r\n" + body


class Listener:
    """One server's connections: the cap and its reserve, which may make room, and refusals by reason."""

    def __init__(
        self,
        limits: ListenerLimits,
        error_body: ErrorBody,
        on_refusal: Callable[[str, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,  # the event loop's clock (asyncio's default is this one)
    ) -> None:
        self.limits = limits
        self.cap = connection_cap(limits.max_connections, limits.fd_share)
        self.clock = clock
        self._error_body = error_body
        self._on_refusal = on_refusal
        self.connections: dict[BoundedProtocol, None] = {}  # in the order they connected, the reserve's too
        self.reserved: dict[BoundedProtocol, None] = {}  # those in the reserve: probes only
        self.refused: dict[str, int] = {}
        self.evicted = 0  # connections closed to make room

    def protocol(self, base: Callable[..., asyncio.Protocol] = HttpProtocol) -> type[asyncio.Protocol]:
        """A protocol class for uvicorn.Config(http=...): `base` wrapped in this listener's bounds."""
        listener = self

        class Bound(BoundedProtocol):
            def __init__(self, **kwargs: Any) -> None:
                super().__init__(base(**kwargs), listener)

        return Bound

    def refusal(self, status: int, reason: str, message: str, extra: bytes = b"") -> bytes:
        """Count a refusal and build its response."""
        self.refused[reason] = self.refused.get(reason, 0) + 1
        if self._on_refusal is not None:
            self._on_refusal(reason, status)
        return refusal_response(status, self._error_body(status, reason, message), extra)

    def busy(self, message: str = BUSY) -> bytes:
        """Count and build a 503 `connection_limit`."""
        return self.refusal(503, "connection_limit", message, b"retry-after: 1\r\n")

    def admit(self, conn: BoundedProtocol) -> bool:
        """Make room for a new connection, in the cap or else in the reserve; False if there is none."""
        if len(self.connections) - len(self.reserved) >= self.cap and not self._make_room(reserve=False):
            if len(self.reserved) >= self.limits.reserve and not self._make_room(reserve=True):
                return False
            self.reserved[conn] = None
        self.connections[conn] = None
        return True

    def _make_room(self, reserve: bool) -> bool:
        """Close the cap's (or the reserve's) oldest idle connection, else the one whose request began first
        among those still sending it (a body too with evict_uploads); False if every one is busy."""
        pool: Collection[BoundedProtocol] = self.reserved if reserve else self.connections
        if self.reserved and not reserve:
            pool = [c for c in self.connections if c not in self.reserved]
        victim = next((c for c in pool if c.idle), None)
        if victim is None:
            uploads = self.limits.evict_uploads
            sending = (c for c in pool if c.waiting or (uploads and c.uploading))
            victim = min(sending, key=lambda c: c.began, default=None)
        if victim is None:
            return False
        self.evicted += 1
        victim.evict()
        return True

    def discard(self, conn: BoundedProtocol) -> None:
        """`conn` is gone."""
        self.connections.pop(conn, None)
        self.reserved.pop(conn, None)


class BoundedProtocol(asyncio.Protocol):
    """Wraps uvicorn's protocol for one connection: header and body deadlines, header size and the cap."""

    def __init__(self, inner: asyncio.Protocol, listener: Listener) -> None:
        self.inner = inner
        self.listener = listener
        self._limits = listener.limits
        self._timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self.began = listener.clock()  # when the current request's first byte (or the connection) came
        self._head = 0  # bytes of the current request head received so far
        self._tail = b""  # its last bytes, to find a terminator split across reads
        self._line = b""  # the request line so far, kept on a reserve connection only
        self._line_done = False  # the request line's end was seen
        self._after_head = 0  # bytes after the end of the head in the read that ended it
        self._paced_from = 0.0  # the minimum body rate counts from here ...
        self._body_bytes = 0  # ... these bytes
        self._refused = False  # refused at connect: the inner protocol never started

    # -- state -------------------------------------------------------------------------------------
    def _cycle(self) -> Any:
        return getattr(self.inner, "cycle", None)

    def _between_requests(self) -> bool:
        cycle = self._cycle()
        return cycle is None or bool(cycle.response_complete)

    def _reading_head(self) -> bool:
        """Whether the next bytes belong to a request head (not to a request body still arriving)."""
        cycle = self._cycle()
        return cycle is None or bool(cycle.response_complete) or not cycle.more_body

    @property
    def waiting(self) -> bool:
        """No request is being served: the connection is silent, idle or sending a request's headers."""
        return self._between_requests() and not getattr(self.inner, "pipeline", None)

    @property
    def idle(self) -> bool:
        """Kept alive after a response, with nothing of the next request yet."""
        return self._head == 0 and self._cycle() is not None and self.waiting

    @property
    def uploading(self) -> bool:
        """A request's body is still arriving, and no response to it has begun."""
        cycle, pipelined = self._cycle(), getattr(self.inner, "pipeline", None)
        return cycle is not None and bool(cycle.more_body and not cycle.response_started) and not pipelined

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Make room (or refuse), then start the clock for the first request's headers."""
        self._transport = transport  # type: ignore[assignment]
        if not self.listener.admit(self):
            self._refused = True
            transport.write(self.listener.busy())  # type: ignore[attr-defined]
            transport.close()
            return
        self.inner.connection_made(transport)
        self._start_timer()

    def data_received(self, data: bytes) -> None:
        """Measure a head as it arrives, pass on, and stop the clock when a request's headers are complete."""
        if self._refused:
            return
        if self._reading_head():
            refusal = self._measure(data)
            if refusal is not None:
                self._close_with(refusal)
                return
        else:
            self._body_bytes += len(data)
        inner = self.inner
        before = self._cycle()
        inner.data_received(data)
        cycle = self._cycle()
        if cycle is not before and cycle is not None:
            self._head, self._tail, self._line, self._line_done = 0, b"", b"", False
            self._stop_timer()
            pipelined = getattr(inner, "pipeline", None)  # its body is read after the responses before it
            if cycle.more_body and not pipelined:
                now = self.listener.clock()
                self._paced_from, self._body_bytes = now, self._after_head
                self._arm_body(cycle, now, now)
        elif self._timer is None and self._between_requests():
            self._start_timer()
        if self._body_timer is not None and (cycle is None or not cycle.more_body):
            self._body_timer.cancel()
            self._body_timer = None

    def _measure(self, data: bytes) -> bytes | None:
        """Add `data` to the current head; the refusal to send if over a limit, or no probe in the reserve."""
        limits = self._limits
        if self._head == 0 and not self._line_done and self._cycle() is not None:
            self.began = self.listener.clock()  # a keep-alive connection's next request
        if not self._line_done:
            newline = data.find(b"\n")
            if self._head + (len(data) if newline < 0 else newline) > limits.max_request_line:
                message = f"The request line is longer than {limits.max_request_line} bytes."
                return self.listener.refusal(414, "url_too_long", message)
            self._line_done = newline >= 0
            if self in self.listener.reserved:
                self._line += data if newline < 0 else data[:newline]
                if self._line_done and not is_probe(self._line, limits.probe_paths):
                    return self.listener.busy(PROBES_ONLY)
        window = self._tail + data
        end = window.find(_TERMINATOR)
        size = self._head + (len(data) if end < 0 else end + len(_TERMINATOR) - len(self._tail))
        if size > limits.max_header_bytes:
            message = f"The request headers are larger than {limits.max_header_bytes} bytes."
            return self.listener.refusal(431, "header_too_large", message)
        if end < 0:
            self._head, self._tail = size, window[-3:]
            return None
        # What follows is a body or the next request, which the parser frames; a probe has neither.
        self._after_head = len(window) - end - len(_TERMINATOR)
        self._head, self._tail, self._line, self._line_done = 0, b"", b"", False
        if self._after_head and self in self.listener.reserved:
            return self.listener.busy(PROBES_ONLY)
        return None

    def eof_received(self) -> bool | None:
        """Pass on."""
        if self._refused:
            return None
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        """Pass on, stop the clock and leave the listener."""
        self.listener.discard(self)
        self._stop_timer()
        if not self._refused:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        """Pass on."""
        if not self._refused:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        """Pass on."""
        if not self._refused:
            self.inner.resume_writing()

    # -- the clocks and closing --------------------------------------------------------------------
    def _start_timer(self) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            self._timer = asyncio.get_running_loop().call_later(self._limits.header_timeout, self._expire)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _arm_body(self, cycle: Any, began: float, now: float) -> None:
        """Wake up when the body is due (by the body deadline or the minimum rate), if it ever is."""
        deadline, _ = body_deadline(self._limits, began, self._paced_from, self._body_bytes)
        if deadline < math.inf:
            self._body_timer = asyncio.get_running_loop().call_later(
                deadline - now, self._expire_body, cycle, began
            )

    def _expire_body(self, cycle: Any, began: float) -> None:
        self._body_timer = None
        transport = self._transport
        if transport is None or transport.is_closing() or self._cycle() is not cycle:
            return
        if not cycle.more_body or cycle.response_started:
            return
        now = self.listener.clock()
        if not transport.is_reading():  # the server is not reading (flow control): the pace restarts
            self._paced_from, self._body_bytes = now, 0
        deadline, reason = body_deadline(self._limits, began, self._paced_from, self._body_bytes)
        if now < deadline:  # more bytes came meanwhile
            self._arm_body(cycle, began, now)
            return
        message = "The request body did not arrive in time."
        if reason == "body_too_slow":
            message = f"The request body arrived slower than {self._limits.min_body_rate:g} bytes/s."
        self._close_with(self.listener.refusal(408, reason, message), answer=True)

    def _expire(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing() or not self._between_requests():
            return
        message = "The request headers did not arrive in time."
        self._close_with(self.listener.refusal(408, "header_timeout", message))

    def _close_with(self, response: bytes, answer: bool = False) -> None:
        """Send `response` and close: between requests, or if `answer` (no response has begun then)."""
        transport = self._transport
        self._stop_timer()
        self.listener.discard(self)
        if transport is not None and not transport.is_closing():
            if answer or self._between_requests():  # else a response is under way: cutting it off is all
                transport.write(response)
            transport.close()

    def evict(self) -> None:
        """Close to make room: quietly if idle after a response, else with a 503 (a request may be coming)."""
        if self.idle:
            self._stop_timer()
            self.listener.discard(self)
            if self._transport is not None:
                self._transport.close()
        else:
            self._close_with(self.listener.busy(), answer=self.uploading)
