"""Parts of bench/gateway.py: a trivial HTTP upstream and a cheap load generator, raw asyncio on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

TICK = os.sysconf("SC_CLK_TCK")
EVENTS = 16  # SSE events in one streamed response
JSON_BODY = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "text_completion",
        "choices": [{"index": 0, "text": "hello world", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
).encode()


def _sse_chunks() -> list[bytes]:
    chunks = []
    for i in range(EVENTS - 1):
        event = {"id": "cmpl-bench", "choices": [{"index": 0, "text": f" tok{i}", "finish_reason": None}]}
        data = b"data: " + json.dumps(event).encode() + b"\n\n"
        chunks.append(b"%x\r\n%s\r\n" % (len(data), data))
    done = b"data: [DONE]\n\n"
    chunks.append(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
    return chunks


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
JSON_RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(JSON_BODY),
    JSON_BODY,
)


class UpstreamProtocol(asyncio.Protocol):
    """A keep-alive HTTP/1.1 server: a JSON body for any request, an SSE stream of EVENTS writes if the
    request body or target mentions "stream"."""

    sse = _sse_chunks()

    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                length = int(head[at + 15 :].split(b"\r\n", 1)[0])
            if len(self.buf) < end + 4 + length:
                return
            request, self.buf = self.buf[: end + 4 + length], self.buf[end + 4 + length :]
            self._respond(b"stream" in request)

    def _respond(self, stream: bool) -> None:
        assert self.transport is not None
        if not stream:
            self.transport.write(JSON_RESPONSE)
            return
        # One write per event, as a token-by-token server does.
        self.transport.write(SSE_HEAD)
        for chunk in self.sse:
            self.transport.write(chunk)


async def serve_upstream(port: int, ready: Callable[[int], None]) -> None:
    """Serve the trivial upstream on 127.0.0.1 until cancelled."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, "127.0.0.1", port, backlog=1024)
    ready(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


# -- load generator ---------------------------------------------------------------------------------
class ClientProtocol(asyncio.Protocol):
    """One keep-alive connection; request() sends prepared bytes and waits for the whole response."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.done: asyncio.Future[int] | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("connection lost"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        status = self._complete()
        if status and self.done is not None and not self.done.done():
            self.done.set_result(status)

    def _complete(self) -> int:
        """The status code once the response is complete, else 0."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return 0
        head = bytes(self.buf[:end]).lower()
        status = int(head[9:12])
        at = head.find(b"content-length:")
        if at >= 0:
            length = int(head[at + 15 :].split(b"\r\n", 1)[0])
            return status if len(self.buf) >= end + 4 + length else 0
        if b"transfer-encoding: chunked" in head:
            return status if self.buf.endswith(b"\r\n0\r\n\r\n") else 0
        return 0

    async def request(self, data: bytes) -> int:
        """Send one request; the response's status code."""
        assert self.transport is not None
        if self.lost:
            raise ConnectionError("connection lost")
        self.buf.clear()
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.done


async def connect(port: int) -> ClientProtocol:
    """A new keep-alive connection to 127.0.0.1:port."""
    _, proto = await asyncio.get_running_loop().create_connection(ClientProtocol, "127.0.0.1", port)
    return proto


def request_bytes(port: int, path: str, body: bytes) -> bytes:
    """A complete POST request."""
    return (
        b"POST %s HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer bench\r\ncontent-length: %d\r\n\r\n%s"
        % (path.encode(), port, len(body), body)
    )


async def sequential(requests: list[tuple[int, bytes]], rounds: int) -> list[list[float]]:
    """One request at a time over one connection per target, interleaving the targets so that drift on a
    busy machine hits them alike; seconds per request, one list per target."""
    conns = [await connect(port) for port, _ in requests]
    times: list[list[float]] = [[] for _ in requests]
    for _ in range(rounds):
        for i, (conn, (_, data)) in enumerate(zip(conns, requests, strict=True)):
            t0 = time.perf_counter()
            status = await conn.request(data)
            times[i].append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"HTTP {status}")
    for conn in conns:
        assert conn.transport is not None
        conn.transport.close()
    return times


async def closed_loop(
    port: int, data: bytes, concurrency: int, duration: float, limit: int
) -> tuple[int, float]:
    """`concurrency` connections each sending requests back to back for `duration` seconds (at most `limit`
    requests in all): (requests completed, seconds)."""
    conns = [await connect(port) for _ in range(concurrency)]
    count = 0
    t0 = time.perf_counter()
    deadline = t0 + duration

    async def worker(conn: ClientProtocol) -> None:
        nonlocal count
        while time.perf_counter() < deadline and count < limit:
            status = await conn.request(data)
            if status != 200:
                raise RuntimeError(f"HTTP {status}")
            count += 1

    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - t0
    for conn in conns:
        assert conn.transport is not None
        conn.transport.close()
    return count, elapsed


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (and its reaped children) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICK


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]
