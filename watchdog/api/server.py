"""The own API's HTTP server: uvicorn on the daemon's loop, behind a listener that caps connections."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette

from ..listener import Listener, ListenerLimits
from .promjson import ERROR_STATUS

# The own API serves a few scrapers, probes and operators: a small cap, and headers within 10 s.
API_LIMITS = ListenerLimits(max_connections=512, header_timeout=10.0)


class _EmbeddedServer(uvicorn.Server):
    """uvicorn on the daemon's loop, without its own signal handlers (the daemon owns SIGTERM/SIGHUP), and
    with a tick once a second (the Date header) instead of every 0.1 s: woken at once when told to exit, it
    stops as soon as before, for a tenth of the wake-ups (~2% of the daemon's CPU at 8 targets)."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        """Set to stop serving (uvicorn's own flag)."""
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()
        else:
            self._exit.clear()

    async def main_loop(self) -> None:
        """uvicorn's loop of ticks, one a second; on_tick refreshes the Date header when counter % 10 == 0."""
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._exit.wait()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def api_error_body(status: int, reason: str, message: str) -> bytes:
    """The own API's JSON error (as control.error_response writes it), for the listener's refusals."""
    kind = {s: k for k, s in ERROR_STATUS.items()}.get(status, "error")
    return json.dumps({"status": "error", "errorType": kind, "error": message, "reason": reason}).encode()


def api_server(app: Starlette, host: str, port: int, listener: Listener) -> uvicorn.Server:
    """A server for `app` on host:port that `serve(sockets=...)` starts; `listener` caps its connections."""
    return _EmbeddedServer(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
            http=listener.protocol(),  # connection cap, header deadline and size (431)
        )
    )
