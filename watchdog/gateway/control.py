"""The daemon's handle on the running gateway: actions, drains, adaptive signals and persisted state.

The gateway owns its own thread and event loop; everything here runs on the daemon's loop and reaches the
gateway's objects only through `GatewayServer.call`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..actions.state import ActionStore
from ..background import Background
from ..promql.mathfuncs import histogram_quantile
from .server import GatewayServer
from .snapshot import GatewaySnapshot, HistogramSnapshot
from .throttle import ThrottleSpec

log = logging.getLogger(__name__)
HOLD_TTL = 900.0  # a hold whose alert was not seen for this long is dropped (a lost "resolved")
SIGNAL_WINDOW = 10.0  # seconds of gateway latency the adaptive throttle looks at
SIGNAL_QUANTILE = 0.9
SIGNAL_MIN_COUNT = 5  # fewer observations in the window: no signal


def window_quantile(q: float, old: HistogramSnapshot, new: HistogramSnapshot) -> float | None:
    """The q-quantile of the observations between two snapshots, as PromQL's histogram_quantile computes it
    over the increase; None with too few observations to mean anything."""
    if new.count - old.count < SIGNAL_MIN_COUNT or len(old.cumulative) != len(new.cumulative):
        return None
    bounds = (*new.bounds, math.inf)
    increase = zip(bounds, new.cumulative, old.cumulative, strict=True)
    return histogram_quantile(q, [(le, float(n - o)) for le, n, o in increase])


class GatewayControl:
    """Steers one gateway: throttle holds and releases, session breakers, drains; persists what it set."""

    def __init__(
        self,
        server: GatewayServer,
        store: ActionStore,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        queue_time: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.server = server
        self.queue_time = queue_time  # vLLM's own recent queue time (p90), for the adaptive throttle
        self.store = store
        self.clock, self.monotonic = clock, monotonic
        self.target = server.config.target
        self.breaker_default = server.config.sessions.breaker_duration
        self.snapshot: GatewaySnapshot | None = None
        self._holds_seen: dict[str, float] = {}  # hold key -> when its alert last asked (monotonic)
        self._history: deque[tuple[float, HistogramSnapshot]] = deque()  # (when, time-to-first-byte)
        self._persisted = ""
        self._background = Background()

    @property
    def listen(self) -> str:
        """host:port the gateway serves on."""
        return f"{self.server.config.listen_host}:{self.server.config.listen_port}"

    @property
    def _key(self) -> str:
        return f"gateway/{self.target}"

    async def start(self) -> None:
        """Start serving with the throttle, breakers and drain state a previous run left."""
        await asyncio.to_thread(self.server.start)
        saved = self.store.get(self._key)
        if isinstance(saved, dict):
            await self.server.call(lambda: self._restore(saved))
        drained = self.target in self.store.drains()
        await self.server.call(lambda: self.server.gate.set_drain(drained))
        self.store.on_drain = self.on_drain

    def _restore(self, saved: dict[str, Any]) -> None:
        throttle = saved.get("throttle")
        if isinstance(throttle, dict):
            self.server.throttle.restore(throttle)
        now_wall, now_mono = self.clock(), self.monotonic()
        breakers = saved.get("breakers")
        for session, value in (breakers if isinstance(breakers, dict) else {}).items():
            if isinstance(value, list) and len(value) == 2 and isinstance(value[0], (int, float)):
                left = float(value[0]) - now_wall
                if left > 0:
                    self.server.gate.open_breaker(str(session), now_mono + left, str(value[1]))
        holds = self.server.throttle.state().get("holds")
        for key in holds if isinstance(holds, dict) else {}:
            self._holds_seen[str(key)] = now_mono

    # -- actions -------------------------------------------------------------------------------
    async def throttle(self, key: str, spec: ThrottleSpec) -> tuple[int, int]:
        """Tighten the cap for an alert (key: action and alert); returns the cap before and after."""

        def hold() -> tuple[int, int]:
            before = self.server.gate.limit
            return before, self.server.throttle.hold(key, spec)

        self._holds_seen[key] = self.monotonic()
        result = await self.server.call(hold)
        await self.persist()
        return result

    def release(self, key: str) -> None:
        """The alert behind a hold resolved: recovery starts once no hold is left."""
        self._holds_seen.pop(key, None)
        self._background.spawn(self._release(key))

    async def _release(self, key: str) -> None:
        await self.server.call(lambda: self.server.throttle.release(key))
        await self.persist()

    async def open_breaker(self, session: str, duration: float, reason: str) -> None:
        """Refuse a session's requests for `duration` seconds."""
        until = self.monotonic() + duration
        await self.server.call(lambda: self.server.gate.open_breaker(session, until, reason))
        await self.persist()

    async def close_breaker(self, session: str) -> None:
        """Admit a session again."""
        await self.server.call(lambda: self.server.gate.close_breaker(session))
        await self.persist()

    async def set_drain(self, drained: bool) -> None:
        """Hold or refuse new requests (drained), or admit them again."""
        await self.server.call(lambda: self.server.gate.set_drain(drained))

    def on_drain(self, target: str, drained: bool) -> None:
        """The action store's drain hook: follow the flag for our target."""
        if target == self.target:
            self._background.spawn(self.set_drain(drained))

    def in_flight(self) -> int:
        """Requests forwarded and not finished (an int read across threads is safe)."""
        return int(self.server.gate.in_flight)

    # -- periodic ------------------------------------------------------------------------------
    async def tick(self) -> GatewaySnapshot:
        """Drop stale holds, move the throttle one step, persist changes and take a snapshot."""
        now = self.monotonic()
        for key, seen in list(self._holds_seen.items()):
            if now - seen > HOLD_TTL:
                log.warning("dropping a throttle hold whose alert went quiet", extra={"hold": key})
                self.release(key)
        self._trim(now)
        # The gateway's own queue time rises whenever the cap falls, so it would feed on itself: the adaptive
        # throttle follows vLLM's queue time, or the time to first byte of what the gateway let through.
        signals = {"queue_time": self.queue_time(), "ttft": self._ttfb()}
        mono, wall = now, self.clock()

        def step() -> tuple[GatewaySnapshot, dict[str, Any]]:  # one trip to the gateway's loop per tick
            self.server.throttle.tick(signals.get)
            return self.server.snapshot(), self._state(mono, wall)

        snap, state = await self.server.call(step)
        self._history.append((now, snap.proxy.ttfb))
        self.snapshot = snap
        self._save(state)
        return snap

    def _trim(self, now: float) -> None:
        while len(self._history) > 1 and now - self._history[1][0] >= SIGNAL_WINDOW:
            self._history.popleft()

    def _ttfb(self) -> float | None:
        if len(self._history) < 2:
            return None
        return window_quantile(SIGNAL_QUANTILE, self._history[0][1], self._history[-1][1])

    def _state(self, mono: float, wall: float) -> dict[str, Any]:
        """The throttle and breakers as saved (breaker ends as wall-clock times); runs on the gateway loop."""
        breakers = {
            s: [wall + (until - mono), reason] for s, (until, reason) in self.server.gate.breakers().items()
        }
        throttle = self.server.throttle.state()
        throttle.pop("seconds_since_change", None)  # changes every tick; not worth an fsync
        return {"throttle": throttle, "breakers": breakers}

    def _save(self, state: dict[str, Any]) -> None:
        text = json.dumps(state, sort_keys=True)
        if text != self._persisted:
            self.store.put(self._key, state)
            self._persisted = text

    async def persist(self) -> None:
        """Save the throttle and breaker state when it changed, so that a restart keeps it."""
        mono, wall = self.monotonic(), self.clock()
        self._save(await self.server.call(lambda: self._state(mono, wall)))

    async def status_json(self) -> dict[str, Any]:
        """GET /api/v1/gateway."""
        gate = (
            self.server.gate
        )  # read live on the gateway's loop: the last tick's snapshot may be a second old
        throttle, breakers, limit, draining = await self.server.call(
            lambda: (self.server.throttle.state(), gate.breakers(), gate.limit, gate.draining)
        )
        mono = self.monotonic()
        return {
            "target": self.target,
            "listen": self.listen,
            "upstream": self.server.config.upstream,
            "limit": limit,
            "ceiling": self.server.config.max_in_flight,
            "in_flight": self.in_flight(),
            "draining": draining,
            "throttle": throttle,
            "breakers": {
                s: {"seconds_left": round(until - mono, 3), "reason": reason}
                for s, (until, reason) in breakers.items()
            },
        }

    async def aclose(self, grace: float) -> None:
        """Stop the gateway: no new connections, in-flight requests get `grace` seconds."""
        self.store.on_drain = None
        await self._background.wait(grace)
        await asyncio.to_thread(self.server.stop, grace)
