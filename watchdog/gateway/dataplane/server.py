"""The gateway's own thread, event loop and uvicorn server, and the one door into them from other threads."""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import uvicorn

try:
    from uvloop import new_event_loop
except ImportError:  # uvloop is optional; asyncio's loop is slower
    from asyncio import new_event_loop  # type: ignore[assignment]

from ...fdlimits import AcceptErrors
from ...listener import Listener, ListenerLimits
from ..config import GatewayConfig
from ..protocol.snapshot import GatewaySnapshot
from .admission import Gate
from .backoff import UpstreamBackoff
from .clients import ClientTransports
from .proxy import Proxy
from .signals import SessionSignals
from .throttle import Throttle

if TYPE_CHECKING:
    import httpx  # the gateway forwards with aiohttp: httpx is only the type of a refused argument

T = TypeVar("T")
BACKOFF_TICK = 1.0  # seconds between the gateway's own throttle steps (the daemon's ticks come on top)


class _Server(uvicorn.Server):
    """uvicorn's server, saying when it listens."""

    def __init__(self, on_started: Callable[[], None], config: uvicorn.Config) -> None:
        super().__init__(config)
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start listening, then tell."""
        await super().startup(sockets=sockets)
        if self.started:
            self._on_started()


class GatewayServer:
    """The gateway's own thread, event loop and uvicorn server."""

    gate: Gate
    signals: SessionSignals
    throttle: Throttle
    backoff: UpstreamBackoff
    proxy: Proxy
    listener: Listener

    def __init__(
        self,
        config: GatewayConfig,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if transport is not None:
            raise TypeError("the gateway forwards with aiohttp; an httpx transport cannot be injected")
        self.config = config
        self._monotonic = monotonic
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._failure: BaseException | None = None

    @property
    def running(self) -> bool:
        """Whether the serving thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def url(self) -> str:
        """Where clients reach the gateway."""
        return f"http://{self.config.listen_host}:{self.config.listen_port}"

    def start(self) -> None:
        """Bind (OSError naming host:port if that fails), then serve in a new thread; returns when serving."""
        if self._thread is not None:
            raise RuntimeError("gateway already started")
        host, port = self.config.listen_host, self.config.listen_port
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise OSError(exc.errno, f"gateway cannot listen on {host}:{port}: {exc.strerror}") from exc
        ready = threading.Event()
        self._failure = None
        self._thread = threading.Thread(
            target=self._run, args=(sock, ready), name=f"gateway-{self.config.target}", daemon=True
        )
        self._thread.start()
        ready.wait()
        if self._failure is not None:
            self._thread.join()
            self._thread = None
            raise RuntimeError(f"gateway for {self.config.target} failed to start") from self._failure

    def _run(self, sock: socket.socket, ready: threading.Event) -> None:
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        AcceptErrors().install(loop)  # out of descriptors at accept: a line a minute, not a traceback each
        try:
            loop.run_until_complete(self._serve(sock, ready))
        except BaseException as exc:  # reported by start() if it happens before serving
            self._failure = exc
        finally:
            sock.close()
            ready.set()
            loop.close()

    async def _serve(self, sock: socket.socket, ready: threading.Event) -> None:
        config, monotonic = self.config, self._monotonic
        self._loop = asyncio.get_running_loop()
        self.gate = Gate(config, monotonic=monotonic)
        self.signals = SessionSignals(
            top_k=config.sessions.top_k, max_sessions=config.sessions.max_sessions, monotonic=monotonic
        )
        self.throttle = Throttle(self.gate, monotonic=monotonic)
        self.backoff = UpstreamBackoff(config.upstream_backoff, self.throttle, monotonic=monotonic)
        transports = ClientTransports()  # the proxy aborts the connection of a client that stops reading
        self.proxy = Proxy(
            config, self.gate, self.signals, backoff=self.backoff, transports=transports, monotonic=monotonic
        )
        # Connections are capped here, apart from requests: admission (the Gate) is the only request budget.
        self.listener = Listener(
            ListenerLimits(
                max_connections=config.max_connections,
                header_timeout=config.client_timeout,
                body_timeout=None,  # the proxy's own deadline (client_timeout) answers a slow body
                fd_share=0.5,
            ),
            self.proxy.refusal_body,
            self.proxy.count_refusal,
        )
        server = self._server = _Server(
            ready.set,
            uvicorn.Config(
                self.proxy,
                http=self.listener.protocol(transports.protocol()),
                interface="asgi3",
                lifespan="off",
                # The gateway forwards HTTP only. With a WebSocket library installed (uvicorn[standard], as
                # next to vLLM) uvicorn would hand an Upgrade: websocket request to the app as a websocket
                # scope, which it does not answer: uvicorn then sends its own 500. Without one, the request
                # stays plain HTTP and is forwarded (Upgrade is hop-by-hop), whatever is installed.
                ws="none",
                access_log=False,
                log_config=None,
                proxy_headers=False,  # the upstream sees the client's own X-Forwarded-* untouched
                server_header=False,  # the upstream's Server and Date pass through instead
                date_header=False,
                timeout_keep_alive=math.ceil(config.keepalive_timeout),
            ),
        )
        ticker = asyncio.create_task(self._tick_backoff())
        try:
            await server.serve(sockets=[sock])
        finally:
            ticker.cancel()
            await self.proxy.aclose()

    async def _tick_backoff(self) -> None:
        """The gateway's own clock for its reflex to vLLM's 503s: runs with or without a daemon."""
        while True:
            await asyncio.sleep(BACKOFF_TICK)
            self.backoff.tick()

    def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish for up to `grace` seconds, then join the thread."""
        thread, loop, server = self._thread, self._loop, self._server
        if thread is None:
            return
        if loop is not None and server is not None and thread.is_alive():

            def begin() -> None:
                server.config.timeout_graceful_shutdown = math.ceil(grace)
                server.should_exit = True

            loop.call_soon_threadsafe(begin)
        thread.join(timeout=grace + 10.0)
        self._thread = None

    def _submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        loop = self._loop
        if loop is None or self._thread is None:
            raise RuntimeError("gateway not running")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return future

    async def call(self, fn: Callable[[], T]) -> T:
        """Run `fn()` on the gateway loop (from any other loop or thread) and return its result."""
        return await asyncio.wrap_future(self._submit(fn))

    def call_sync(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run `fn()` on the gateway loop and wait for its result (not from the gateway loop itself)."""
        if threading.current_thread() is self._thread:
            return fn()
        return self._submit(fn).result(timeout)

    def snapshot(self) -> GatewaySnapshot:
        """Everything the gateway exports; on the gateway loop (through call())."""
        gate = self.gate.snapshot()
        sessions, tracked = self.signals.stats(gate.session_in_flight, gate.breakers_open)
        proxy = self.proxy.snapshot(len(self.listener.connections), self.listener.evicted)
        return GatewaySnapshot(self.config.target, gate, proxy, sessions, tracked)

    def apply(self, config: GatewayConfig) -> None:
        """A config reload, on the gateway loop: admission limits, priorities, session headers, body size and
        client timeout take effect now; the listen address, the upstream and its timeouts need a restart."""
        self.gate.apply(config)
        self.proxy.apply(config)
        self.backoff.apply(config.upstream_backoff)
