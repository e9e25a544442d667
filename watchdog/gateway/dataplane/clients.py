"""Clients that stop reading: the gateway's connections by peer address, and a send with a write deadline.

uvicorn's `send` waits while the connection's write buffer is above its high-water mark, for as long as the
client does not read: a client that never reads would hold its admission slot, and the upstream request
behind it, forever. `ClientWriter` gives each such wait `write_timeout`; past it the connection is aborted (a
plain close would wait for the buffer to drain, which never happens) and `ClientStalled` is raised, so that
the proxy closes the upstream response (vLLM stops generating) and frees the slot.

The kernel's send buffer comes first: Linux grows it up to 4 MiB (net.ipv4.tcp_wmem) even toward a client
that reads nothing, which a slow stream takes minutes to fill before the write buffer sees any of it. Each
client connection's send buffer is therefore fixed at `SEND_BUFFER` (the kernel doubles it), which still
carries a loopback or LAN connection at full speed.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any, cast

from starlette.types import Message, Scope, Send

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as HttpProtocol
except ImportError:  # httptools (the C parser) is optional; h11 is pure Python and slower
    from uvicorn.protocols.http.h11_impl import H11Protocol as HttpProtocol  # type: ignore[assignment]

Peer = tuple[str, int]
SEND_BUFFER = 128 * 1024  # bytes; a client that stops reading stalls a send once about this much is unread


class ClientStalled(Exception):
    """The client took nothing of what was written to it for `write_timeout`; its connection is aborted."""


def peer_of(transport: asyncio.BaseTransport) -> Peer | None:
    """The (host, port) uvicorn puts in scope["client"] for this transport; None for a Unix socket."""
    name = transport.get_extra_info("peername")
    if isinstance(name, tuple) and len(name) >= 2:
        return (str(name[0]), int(name[1]))
    return None


class ClientTransports:
    """The transports of the open client connections, by peer address (scope["client"])."""

    def __init__(self) -> None:
        self._by_peer: dict[Peer, asyncio.Transport] = {}

    def __len__(self) -> int:
        return len(self._by_peer)

    def protocol(self, base: type[asyncio.Protocol] = HttpProtocol) -> Callable[..., asyncio.Protocol]:
        """uvicorn's protocol class `base`, registering each connection here while it is open."""
        table = self

        class Tracked(base):  # type: ignore[valid-type,misc]
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                super().connection_made(transport)
                table.add(transport)
                sock = transport.get_extra_info("socket")
                if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)

            def connection_lost(self, exc: Exception | None) -> None:
                table.discard(self.transport)
                super().connection_lost(exc)

        return Tracked

    def add(self, transport: asyncio.BaseTransport) -> None:
        """A connection opened."""
        peer = peer_of(transport)
        if peer is not None:  # uvloop's transports are not asyncio.Transport subclasses, but alike
            self._by_peer[peer] = cast(asyncio.Transport, transport)

    def discard(self, transport: asyncio.BaseTransport | None) -> None:
        """A connection closed."""
        peer = None if transport is None else peer_of(transport)
        if peer is not None and self._by_peer.get(peer) is transport:
            del self._by_peer[peer]

    def of(self, scope: Scope) -> asyncio.Transport | None:
        """The transport of the connection a request came on; None if unknown (the app served directly)."""
        client: Any = scope.get("client")
        if not client:
            return None
        return self._by_peer.get((str(client[0]), int(client[1])))


class ClientWriter:
    """One request's ASGI `send`, with a deadline on each wait for the client to take what was written."""

    __slots__ = ("_low", "_send", "_timeout", "_transport", "stalled")

    def __init__(self, send: Send, transport: asyncio.Transport | None, timeout: float) -> None:
        self._send = send
        self._transport = transport
        self._timeout = timeout
        self._low = -1 if transport is None else transport.get_write_buffer_limits()[0]
        self.stalled = False

    async def __call__(self, message: Message) -> None:
        """Send `message`; ClientStalled (and the connection aborted) if the client takes nothing in time."""
        transport = self._transport
        if transport is not None and transport.get_write_buffer_size() <= self._low:
            # Below the low-water mark writing is never paused: uvicorn's send cannot wait (the fast path).
            return await self._send(message)
        try:
            await asyncio.wait_for(self._send(message), self._timeout)
        except asyncio.TimeoutError:
            self.stalled = True
            if transport is not None:
                transport.abort()  # close() would wait for the buffer to drain
            raise ClientStalled from None
