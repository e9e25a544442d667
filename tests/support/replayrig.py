"""The replay tests' rig: a real gateway (uvicorn, aiohttp) in front of a loopback upstream whose requests
freeze until the test "stops the engine" (drops their connections), drained and undrained by the same command
table the daemon's control channel uses; clients sent in the background."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx

from tests.support.gateway_upstream import Handler, Seen, Upstream, chunk, echo, response_head
from vllm_watchdog.gateway.dataplane.commands import GatewayCommands
from vllm_watchdog.gateway.dataplane.server import GatewayServer
from vllm_watchdog.gateway.protocol.snapshot import ProxySnapshot

PATH = "/v1/completions"
COMPLETION = {"model": "m", "prompt": "hello", "max_tokens": 4}
STREAM = {**COMPLETION, "stream": True}
REPLAYED = "x-vllm-watchdog-replayed"
EVENTS = [
    b'data: {"choices":[{"text":"a"}]}\n\n',
    b'data: {"choices":[{"text":"b"}]}\n\n',
    b"data: [DONE]\n\n",
]


class Engine:
    """The upstream's completions route: each request freezes (after `head`, if given) until stop(), which
    drops its connection (after `last`: vLLM's own error for a request whose engine died), as a stopped vLLM
    does."""

    def __init__(self, head: bytes = b"", last: bytes = b"") -> None:
        self.head = head
        self.last = last
        self.stopped = threading.Event()
        self.frozen = 0  # requests frozen so far

    async def __call__(self, seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Freeze, then drop the connection."""
        if self.head:
            writer.write(self.head)
            await writer.drain()
        self.frozen += 1
        await asyncio.to_thread(self.stopped.wait, 30)
        if self.last:
            writer.write(self.last)
            await writer.drain()
        writer.transport.abort()

    def stop(self) -> None:
        """Stop the engine: every frozen request's connection drops."""
        self.stopped.set()


def eventually(check: Callable[[], bool], what: str) -> None:
    """Wait (bounded) until check() holds."""
    for _ in range(1000):
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


class Rig:
    """A gateway in front of `upstream`, a way to drain it, and clients sent in the background."""

    def __init__(self, gw: GatewayServer, upstream: Upstream) -> None:
        self.gw = gw
        self.upstream = upstream
        self.commands = GatewayCommands(gw)
        self.pool = ThreadPoolExecutor(8)

    def drain(self, drained: bool) -> None:
        """What the daemon's restart flow sends (set_drain) through the control channel."""
        self.gw.call_sync(lambda: self.commands.run("set_drain", {"drained": drained}), timeout=10)

    def proxy(self) -> ProxySnapshot:
        """The forwarding counters, read on the gateway's loop."""
        return self.gw.call_sync(self.gw.snapshot, timeout=10).proxy

    def outcomes(self) -> dict[str, int]:
        """replays_total by outcome (only those seen)."""
        return dict(self.proxy().replays_total)

    def post(self, body: dict[str, Any] | bytes = COMPLETION) -> Future[httpx.Response]:
        """A plain request in the background; its response read whole."""
        content = body if isinstance(body, bytes) else json.dumps(body).encode()

        def run() -> httpx.Response:
            with httpx.Client(timeout=60) as client:
                return client.post(
                    self.gw.url + PATH, content=content, headers={"content-type": "application/json"}
                )

        return self.pool.submit(run)

    def stream(
        self, body: dict[str, Any] = STREAM, path: str = PATH
    ) -> Future[tuple[int, dict[str, str], bytes | str]]:
        """A streamed request in the background: status, headers and its body, or the error that cut it off."""

        def run() -> tuple[int, dict[str, str], bytes | str]:
            with (
                httpx.Client(timeout=60) as client,
                client.stream("POST", self.gw.url + path, json=body) as r,
            ):
                got = b""
                try:
                    for part in r.iter_raw():
                        got += part
                except httpx.HTTPError as exc:
                    return r.status_code, dict(r.headers), f"cut off after {got!r}: {type(exc).__name__}"
                return r.status_code, dict(r.headers), got

        return self.pool.submit(run)

    def completions(self) -> list[Seen]:
        """The completions requests the upstream received."""
        return [s for s in self.upstream.seen if s.target == PATH]


def revive(upstream: Upstream, handler: Handler = echo) -> None:
    """The new engine serves the completions route."""
    upstream.routes[PATH] = handler


DEAD = (
    b'{"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError", "code": 500}}'
)
DEAD_500 = (
    response_head(500, [("Content-Type", "application/json"), ("Content-Length", str(len(DEAD)))]) + DEAD
)
DEAD_EVENT = chunk(b"data: " + DEAD + b"\n\n") + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
BOOM = b'{"error": {"message": "boom", "type": "InternalServerError", "code": 500}}'  # an engine that lives
BOOM_500 = (
    response_head(500, [("Content-Type", "application/json"), ("Content-Length", str(len(BOOM)))]) + BOOM
)
