"""A programmable HTTP/1.1 upstream on 127.0.0.1 for the gateway's tests: raw asyncio in its own thread, so
tests see exactly the bytes the gateway sent and control exactly the bytes it gets back."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class Seen:
    """One request as the upstream received it."""

    method: str
    target: str  # path and query, as sent
    headers: list[tuple[str, str]]  # raw names and values, in order
    body: bytes

    def header(self, name: str) -> list[str]:
        """All values of a header (case-insensitive)."""
        return [v for k, v in self.headers if k.lower() == name.lower()]


Handler = Callable[[Seen, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Upstream:
    """Serves routes (exact path, without query) in a thread; unknown paths echo the request as JSON."""

    routes: dict[str, Handler] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    disconnected: threading.Event = field(default_factory=threading.Event)  # a handler saw the gateway leave
    port: int = 0

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-upstream", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def close(self) -> None:
        """Stop serving, end the handlers and the thread."""

        async def shut() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                seen = await read_request(reader)
                if seen is None:
                    break
                self.seen.append(seen)
                handler = self.routes.get(seen.target.split("?", 1)[0], echo)
                await handler(seen, reader, writer)
                if writer.is_closing():
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a cancelled handler ends quietly: asyncio's stream server logs cancelled ones
        finally:
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> Seen | None:
    """One request (Content-Length or chunked body); None at a clean end of the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head[:-4].split(b"\r\n")
    method, target, _ = lines[0].decode("latin-1").split(" ", 2)
    headers = []
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name, value.strip()))
    seen = Seen(method, target, headers, b"")
    if seen.header("content-length"):
        seen.body = await reader.readexactly(int(seen.header("content-length")[0]))
    elif "chunked" in ",".join(seen.header("transfer-encoding")).lower():
        parts = []
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        await reader.readuntil(b"\r\n")
        seen.body = b"".join(parts)
    return seen


def response_head(status: int, headers: list[tuple[str, str]]) -> bytes:
    """A status line and headers, written as given (no validation: tests send bad ones on purpose)."""
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def echo(seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """200 with the request as JSON: method, target, headers, body (latin-1)."""
    doc = {
        "method": seen.method,
        "target": seen.target,
        "headers": seen.headers,
        "body": seen.body.decode("latin-1"),
    }
    body = json.dumps(doc).encode()
    writer.write(
        response_head(200, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    )
    writer.write(body)
    await writer.drain()


def fixed(status: int, headers: list[tuple[str, str]], body: bytes = b"") -> Handler:
    """A handler answering `status`, `headers` (Content-Length added) and `body`."""

    async def handle(seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(response_head(status, [*headers, ("Content-Length", str(len(body)))]))
        if seen.method != "HEAD":
            writer.write(body)
        await writer.drain()

    return handle


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


SSE_HEAD = response_head(200, [("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked")])


def sse(events: list[bytes], gate: threading.Event | None = None) -> Handler:
    """An SSE stream: the first event, then (if `gate`) wait until the test sets it, then the rest and the end."""

    async def handle(seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + chunk(events[0]))
        await writer.drain()
        if gate is not None:
            await asyncio.to_thread(gate.wait, 30)
        for event in events[1:]:
            writer.write(chunk(event))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    return handle


def stream_then(action: str, upstream: Upstream) -> Handler:
    """The first SSE event, then: "hang" (until the gateway leaves, which sets upstream.disconnected),
    or "close" (drop the connection mid-stream)."""

    async def handle(seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + chunk(b"data: first\n\n"))
        await writer.drain()
        if action == "close":
            writer.close()
            return
        await wait_for_disconnect(reader, upstream)

    return handle


def hang(upstream: Upstream) -> Handler:
    """Never answer; note when the gateway leaves."""

    async def handle(seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await wait_for_disconnect(reader, upstream)

    return handle


async def wait_for_disconnect(reader: asyncio.StreamReader, upstream: Upstream) -> None:
    """Block until the peer closes the connection (bounded), then set upstream.disconnected."""
    try:
        await asyncio.wait_for(reader.read(), 60)
    except TimeoutError:
        return
    except ConnectionError:
        pass
    upstream.disconnected.set()
