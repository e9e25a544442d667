"""Servers for bench/isolation.py's hostile phases, each run as its own process on 127.0.0.1.

  python bench/_hostile_servers.py upstream PORT          the gateway's upstream
  python bench/_hostile_servers.py target PORT FIXTURE    a scrape target that turns hostile on request

The upstream answers like bench/gateway.py's (a small JSON body; an SSE stream of 16 events if the request
mentions "stream"), and streams for a long time if the request mentions "endless": 16 KiB events every 5 ms
for at most ENDLESS_SECONDS, paused while the gateway does not read (so a client that never reads holds the
gateway's side full, not this process' memory). It buffers request bodies in a bytearray (a 16 MiB body
costs one copy).

The target serves FIXTURE (the real vLLM 0.32 payload) at /metrics until GET /bench/arm; from then on every
scrape also carries 15 new series whose label values are 1 MB each and one series with WIDE_LABELS labels,
and every third scrape is instead a huge body (HUGE_BYTES of distinct series, no Content-Length: the scraper
must count what it reads). GET /bench/disarm ends it; GET /bench/stats says what was served.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import cast

from _gateway_load import JSON_RESPONSE, SSE_HEAD, UpstreamProtocol

ENDLESS_SECONDS = 120.0
ENDLESS_CHUNK = 16 * 1024
CHURN_SERIES = 15  # new series per scrape (one scrape a second)
CHURN_VALUE = 1_000_000  # bytes of one label value
WIDE_LABELS = 10_000
HUGE_BYTES = 64 * 1024 * 1024
MAX_HEAD = 64 * 1024


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class EndlessUpstream(asyncio.Protocol):
    """Keep-alive HTTP/1.1: JSON, a short SSE stream, or an endless one that respects flow control."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.paused = False
        self.streaming: asyncio.TimerHandle | None = None
        self.until = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.streaming is not None:
            self.streaming.cancel()
        self.transport = None

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                length = int(head[at + 15 :].split(b"\r\n", 1)[0])
            if len(self.buf) < end + 4 + length:
                return
            request = bytes(self.buf[: min(end + 4 + length, end + 4 + 4096)])  # the kind is near the start
            del self.buf[: end + 4 + length]
            self._respond(request)

    def _respond(self, request: bytes) -> None:
        assert self.transport is not None
        if b"endless" in request:
            self.transport.write(SSE_HEAD)
            self.until = time.monotonic() + ENDLESS_SECONDS
            self._pump()
        elif b"stream" in request:
            self.transport.write(SSE_HEAD)
            for chunk in UpstreamProtocol.sse:
                self.transport.write(chunk)
        else:
            self.transport.write(JSON_RESPONSE)

    def _pump(self) -> None:
        transport = self.transport
        if transport is None:
            return
        if time.monotonic() >= self.until:
            transport.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            return
        if not self.paused:
            transport.write(_chunk(b"data: " + b"x" * ENDLESS_CHUNK + b"\n\n"))
        self.streaming = asyncio.get_running_loop().call_later(0.005, self._pump)


class HostileTarget:
    """The fixture, or (armed) churn of 1 MB label values, a wide series and every third time a huge body."""

    def __init__(self, fixture: bytes) -> None:
        self.fixture = fixture
        self.armed = False
        self.scrapes = 0
        self.churned = 0  # series names handed out so far
        self.stats = {"plain": 0, "churn": 0, "huge": 0, "bytes": 0, "cut": 0}
        self._value = b"v" * CHURN_VALUE
        self._wide = b"bench_wide{" + b",".join(b'l%d="v"' % i for i in range(WIDE_LABELS)) + b"} 1\n"
        self._huge: bytes | None = None

    def huge(self) -> bytes:
        """HUGE_BYTES of distinct one-sample series (built once)."""
        if self._huge is None:
            lines, size, i = [], 0, 0
            while size < HUGE_BYTES:
                line = b'bench_huge{i="%d"} 1\n' % i
                lines.append(line)
                size += len(line)
                i += 1
            self._huge = b"".join(lines)
        return self._huge

    def body(self) -> tuple[bytes, bool]:
        """The next /metrics body and whether to send it without a length (then closing the connection)."""
        if not self.armed:
            self.stats["plain"] += 1
            return self.fixture, False
        self.scrapes += 1
        if self.scrapes % 3 == 0:
            self.stats["huge"] += 1
            return self.huge(), True
        self.stats["churn"] += 1
        churn = []
        for _ in range(CHURN_SERIES):
            churn.append(b'bench_churn_%d{v="%s"} 1\n' % (self.churned, self._value))
            self.churned += 1
        return self.fixture + b"".join(churn) + self._wide, False

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve requests on one connection until it closes."""
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                if not await self._answer(path, writer):
                    break
        except (asyncio.IncompleteReadError, IndexError):
            pass  # the scraper closed its connection between requests, or sent garbage
        except (asyncio.LimitOverrunError, ConnectionError):
            self.stats["cut"] += 1  # the scraper stopped reading a body and hung up
        finally:
            writer.close()

    async def _answer(self, path: bytes, writer: asyncio.StreamWriter) -> bool:
        """Write one response; False to close the connection after it."""
        text = b"text/plain; version=0.0.4"
        if path.startswith(b"/bench/"):
            self.armed = {b"/bench/arm": True, b"/bench/disarm": False}.get(path, self.armed)
            body, text, close = (
                json.dumps(self.stats | {"armed": self.armed}).encode(),
                b"application/json",
                False,
            )
        elif path == b"/metrics":
            body, close = self.body()
        else:
            body, close = b"OK\n", False
        length = b"" if close else b"Content-Length: %d\r\n" % len(body)
        end = b"Connection: close\r\n\r\n" if close else b"\r\n"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\n%s%s" % (text, length, end))
        for at in range(0, len(body), 1 << 20):  # in 1 MiB pieces, so a scraper that stops reading stops us
            writer.write(body[at : at + (1 << 20)])
            await writer.drain()
        self.stats["bytes"] += len(body)
        return not close


async def serve_upstream(port: int) -> None:
    """The endless-capable upstream until cancelled."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(EndlessUpstream, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


async def serve_target(port: int, fixture: bytes) -> None:
    """The hostile-capable target until cancelled."""
    target = HostileTarget(fixture)
    server = await asyncio.start_server(target.handle, "127.0.0.1", port, limit=MAX_HEAD)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    """Run one server role."""
    if len(argv) >= 2 and argv[0] == "upstream":
        try:  # as bench/gateway.py's upstream: uvloop where installed
            import uvloop

            uvloop.run(serve_upstream(int(argv[1])))
        except ImportError:
            asyncio.run(serve_upstream(int(argv[1])))
    elif len(argv) >= 3 and argv[0] == "target":
        asyncio.run(serve_target(int(argv[1]), Path(argv[2]).read_bytes()))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
