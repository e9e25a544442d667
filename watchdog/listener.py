"""Bounds for the own HTTP listeners (the API and the gateway), below the HTTP server.

uvicorn has no header deadline, no header size limit and only a request-or-connection count
(`limit_concurrency`) that turns idle sockets into refused requests. `Listener` adds what a listener facing
hostile clients needs, as a wrapper around uvicorn's protocol (`uvicorn.Config(http=listener.protocol())`):

* a header deadline: a request's headers must arrive within `header_timeout` of its first byte (or of the
  connection's start), else 408 and close (slowloris); and, where the application has none of its own, a
  body deadline: the rest of the request within `body_timeout` of its headers;
* a header size limit: more than `max_header_bytes` before the end of the headers is answered 431, a request
  line over `max_request_line` 414, both before the HTTP parser buffers more;
* a connection cap, bounded by the file-descriptor limit: at the cap a new connection first closes the
  oldest idle keep-alive connection (quietly), then the oldest one that has not sent a whole request yet
  (silent or sending its headers: 503); only when every connection is busy with a request is the newcomer
  refused (503). Idle sockets never turn a request away.

Every refusal is a JSON body from the server's own `error_body` and is counted by reason.
"""

from __future__ import annotations

import asyncio
import http
import resource
from collections.abc import Callable
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
    """What one listener allows a client: connections, header time and size."""

    max_connections: int = 1024  # further bounded by fd_share of the file-descriptor limit
    header_timeout: float = 10.0  # from connect, or a request's first byte, to the end of its headers
    body_timeout: float | None = 30.0  # from the end of the headers to the end of the body; None: the app's
    max_header_bytes: int = 64 * KiB  # request line and headers together
    max_request_line: int = 8 * KiB  # method, target and version
    fd_share: float = 0.25  # at most this share of RLIMIT_NOFILE's soft limit is spent on connections


ErrorBody = Callable[[int, str, str], bytes]  # (status, reason, message) -> a JSON body
# Every reason a listener refuses a request or connection for (Listener.refused); each is exported from 0.
REFUSALS = ("header_timeout", "body_timeout", "header_too_large", "url_too_long", "connection_limit")


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
    """One server's connections: the cap, which are idle, and refusals by reason."""

    def __init__(
        self,
        limits: ListenerLimits,
        error_body: ErrorBody,
        on_refusal: Callable[[str, int], None] | None = None,
    ) -> None:
        self.limits = limits
        self.cap = connection_cap(limits.max_connections, limits.fd_share)
        self._error_body = error_body
        self._on_refusal = on_refusal
        self.connections: dict[BoundedProtocol, None] = {}  # in the order they connected
        self.refused: dict[str, int] = {}
        self.evicted = 0  # idle connections closed to make room

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

    def admit(self, conn: BoundedProtocol) -> bool:
        """Make room for a new connection; False if every connection is busy with a request."""
        if len(self.connections) >= self.cap:
            victim = next((c for c in self.connections if c.idle), None)
            if victim is None:
                victim = next((c for c in self.connections if c.waiting), None)
            if victim is None:
                return False
            self.evicted += 1
            victim.evict()
        self.connections[conn] = None
        return True

    def discard(self, conn: BoundedProtocol) -> None:
        """`conn` is gone."""
        self.connections.pop(conn, None)


class BoundedProtocol(asyncio.Protocol):
    """Wraps uvicorn's protocol for one connection: header deadline, header size and the listener's cap."""

    def __init__(self, inner: asyncio.Protocol, listener: Listener) -> None:
        self.inner = inner
        self.listener = listener
        self._limits = listener.limits
        self._timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._head = 0  # bytes of the current request head received so far
        self._tail = b""  # its last bytes, to find a terminator split across reads
        self._line_done = False  # the request line's end was seen
        self._refused = False  # refused at connect: the inner protocol never started

    # -- state -------------------------------------------------------------------------------------
    def _between_requests(self) -> bool:
        cycle = getattr(self.inner, "cycle", None)
        return cycle is None or bool(cycle.response_complete)

    def _reading_head(self) -> bool:
        """Whether the next bytes belong to a request head (not to a request body still arriving)."""
        cycle = getattr(self.inner, "cycle", None)
        return cycle is None or bool(cycle.response_complete) or not cycle.more_body

    @property
    def waiting(self) -> bool:
        """No request is being served: the connection is silent, idle or sending a request's headers."""
        return self._between_requests() and not getattr(self.inner, "pipeline", None)

    @property
    def idle(self) -> bool:
        """Kept alive after a response, with nothing of the next request yet."""
        return self._head == 0 and getattr(self.inner, "cycle", None) is not None and self.waiting

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Make room (or refuse), then start the clock for the first request's headers."""
        self._transport = transport  # type: ignore[assignment]
        if not self.listener.admit(self):
            self._refused = True
            message = "The server has too many open connections; retry shortly."
            transport.write(  # type: ignore[attr-defined]
                self.listener.refusal(503, "connection_limit", message, b"retry-after: 1\r\n")
            )
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
        inner = self.inner
        before = getattr(inner, "cycle", None)
        inner.data_received(data)
        cycle: Any = getattr(inner, "cycle", None)
        if cycle is not before and cycle is not None:
            self._head, self._tail, self._line_done = 0, b"", False
            self._stop_timer()
            pipelined = getattr(inner, "pipeline", None)  # its body is read after the responses before it
            if cycle.more_body and self._limits.body_timeout is not None and not pipelined:
                self._body_timer = asyncio.get_running_loop().call_later(
                    self._limits.body_timeout, self._expire_body, cycle
                )
        elif self._timer is None and self._between_requests():
            self._start_timer()
        if self._body_timer is not None and (cycle is None or not cycle.more_body):
            self._body_timer.cancel()
            self._body_timer = None

    def _measure(self, data: bytes) -> bytes | None:
        """Add `data` to the current head; the refusal to send if it goes over a limit."""
        limits = self._limits
        if not self._line_done:
            newline = data.find(b"\n")
            if self._head + (len(data) if newline < 0 else newline) > limits.max_request_line:
                message = f"The request line is longer than {limits.max_request_line} bytes."
                return self.listener.refusal(414, "url_too_long", message)
            self._line_done = newline >= 0
        window = self._tail + data
        end = window.find(_TERMINATOR)
        size = self._head + (len(data) if end < 0 else end + len(_TERMINATOR) - len(self._tail))
        if size > limits.max_header_bytes:
            message = f"The request headers are larger than {limits.max_header_bytes} bytes."
            return self.listener.refusal(431, "header_too_large", message)
        if end < 0:
            self._head, self._tail = size, window[-3:]
        else:  # what follows is a body or the next request, which the parser frames
            self._head, self._tail, self._line_done = 0, b"", False
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

    # -- the clock and closing ---------------------------------------------------------------------
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

    def _expire_body(self, cycle: Any) -> None:
        self._body_timer = None
        transport = self._transport
        current: Any = getattr(self.inner, "cycle", None)
        if transport is None or transport.is_closing() or current is not cycle:
            return
        if cycle.more_body and not cycle.response_started:
            message = "The request body did not arrive in time."
            refusal = self.listener.refusal(408, "body_timeout", message)
            self._stop_timer()
            self.listener.discard(self)
            transport.write(refusal)
            transport.close()

    def _expire(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing() or not self._between_requests():
            return
        message = "The request headers did not arrive in time."
        self._close_with(self.listener.refusal(408, "header_timeout", message))

    def _close_with(self, response: bytes) -> None:
        transport = self._transport
        self._stop_timer()
        self.listener.discard(self)
        if transport is not None and not transport.is_closing():
            if self._between_requests():  # else a response is under way: cutting it off is all we can do
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
            message = "The server has too many open connections; retry shortly."
            self._close_with(self.listener.refusal(503, "connection_limit", message, b"retry-after: 1\r\n"))
