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

# What may use the reserve beyond the cap: Docker's HEALTHCHECK, orchestrators' probes, Prometheus.
PROBE_PATHS = frozenset({"/healthz", "/-/healthy", "/-/ready", "/metrics"})
# The own API serves a few scrapers, probes and operators: a small cap, headers within 10 s, and a body that,
# after 5 s, comes at 512 bytes/s at least (all of it within 30 s). At the cap a connection still sending its
# request, body included, makes room for a newcomer; when every one is busy with a request, 8 more
# connections are kept for probes, so that /healthz and /metrics are answered whatever the clients do.
API_LIMITS = ListenerLimits(
    max_connections=512,
    header_timeout=10.0,
    body_timeout=30.0,
    min_body_rate=512.0,
    body_grace=5.0,
    evict_uploads=True,
    reserve=8,
    probe_paths=PROBE_PATHS,
)


class ApiServer(uvicorn.Server):
    """uvicorn on the daemon's loop, without its own signal handlers (the daemon owns SIGTERM/SIGHUP), and
    without a timer of its own: uvicorn ticks every 0.1 s to refresh the Date header, which the daemon's
    upkeep does instead (`tick`, once a second, in the same wake-up as its other upkeep). Woken at once when
    told to exit, it stops as soon as before."""

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
        """Set the Date header, then serve until told to exit."""
        await self.tick()
        await self._exit.wait()

    async def tick(self, now: float | None = None) -> None:
        """Refresh the Date header (uvicorn's on_tick does when its counter is a multiple of 10)."""
        await self.on_tick(0)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def api_error_body(status: int, reason: str, message: str) -> bytes:
    """The own API's JSON error (as control.error_response writes it), for the listener's refusals."""
    kind = {s: k for k, s in ERROR_STATUS.items()}.get(status, "error")
    return json.dumps({"status": "error", "errorType": kind, "error": message, "reason": reason}).encode()


def api_server(app: Starlette, host: str, port: int, listener: Listener) -> ApiServer:
    """A server for `app` on host:port that `serve(sockets=...)` starts; `listener` caps its connections."""
    return ApiServer(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
            http=listener.protocol(),  # connection cap and reserve, header and body deadlines, header size
        )
    )
