"""Which headers the gateway forwards: hop-by-hop ones, those Connection names and those that cannot be sent
again are dropped, both ways; a request's session, priority, API key and body framing are read on the way."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

# RFC 9110 7.6.1: for one connection only, never forwarded (nor Proxy-*, nor what Connection names).
HOP_BY_HOP = frozenset(
    (b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade", b"proxy-connection")
)
# Request headers the gateway sets itself: Host is the upstream's; the body is re-framed with its own
# Content-Length; the client's Expect: 100-continue was already answered by our server.
_REQUEST_DROP = HOP_BY_HOP | {b"host", b"content-length", b"expect"}
# What uvicorn refuses to write in a header value (CR, LF and NUL among them); such a header is dropped.
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


class Incoming:
    """The request headers to forward (hop-by-hop and unsendable ones dropped) and those the gateway reads."""

    __slots__ = ("authorization", "body_lost", "content_type", "headers", "length", "priority", "session")

    def __init__(
        self, raw: Iterable[tuple[bytes, bytes]], session_header: bytes, priority_header: bytes
    ) -> None:
        self.headers: list[tuple[str, str]] = []
        self.length = -1  # Content-Length, if given
        self.content_type = self.authorization = self.session = self.priority = None
        connection = None
        upgrade = chunked = False
        for name, value in raw:
            if name in _REQUEST_DROP or name.startswith(b"proxy-"):
                if name == b"content-length" and value.isdigit():
                    self.length = int(value)
                elif name == b"connection":
                    connection = value
                elif name == b"upgrade":
                    upgrade = True
                elif name == b"transfer-encoding":
                    chunked = True
                continue
            if _BAD_VALUE.search(value):
                continue
            if value.isascii():
                text = value.decode("ascii")
            else:  # aiohttp writes header values as UTF-8: other obs-text could not be re-sent byte for byte
                try:
                    text = value.decode("utf-8")
                except UnicodeDecodeError:
                    continue
            if name == b"content-type":
                self.content_type = text
            elif name == b"authorization":
                self.authorization = text
            elif name == session_header:
                self.session = text
            elif name == priority_header:
                self.priority = text
            self.headers.append((name.decode("latin-1"), text))
        named: set[str] = set()
        if connection is not None:
            named = {t.strip().lower().decode("latin-1") for t in connection.split(b",")}
            self.headers = [h for h in self.headers if h[0] not in named]
        # The HTTP server treats a request asking for an upgrade it cannot do as ending with its headers: the
        # body never reaches us, so forwarding the request would send the upstream a different one.
        self.body_lost = upgrade and "upgrade" in named and (self.length > 0 or chunked)


def response_headers(
    raw: Iterable[tuple[bytes, bytes]], on_content_type: Callable[[str], None] | None = None
) -> list[tuple[bytes, bytes]]:
    """The upstream response's headers to send on, names lower-cased; `on_content_type` is told each
    Content-Type among them (before the names Connection lists are dropped)."""
    out: list[tuple[bytes, bytes]] = []
    drop: set[bytes] | None = None
    for name, value in raw:
        lower = name.lower()
        if lower in HOP_BY_HOP or lower.startswith(b"proxy-") or _BAD_VALUE.search(value):
            if lower == b"connection":
                drop = {t.strip().lower() for t in value.split(b",")}
            continue
        if lower == b"content-type" and on_content_type is not None:
            on_content_type(value.decode("latin-1"))
        out.append((lower, value))
    if drop:
        out = [h for h in out if h[0] not in drop]
    return out
