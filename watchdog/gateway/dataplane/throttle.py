"""The throttle: moves the gate's in-flight limit down while alerts hold it and back up once they resolve.

Decrease is multiplicative (or to an absolute limit) when an alert fires; recovery is additive, one `step`
per `step_interval` once no alert holds the limit (AIMD). A hold may instead follow a latency signal toward a
target while it lasts, like a gradient limiter: shrink in proportion to how far the signal overshoots, grow by
`step` while it is under target.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from ..config import ThrottleSpec

MIN_RATIO = 0.5  # one adaptive step at most halves the limit


class Limited(Protocol):
    """What the throttle needs of the gate."""

    @property
    def limit(self) -> int: ...

    @property
    def ceiling(self) -> int: ...

    def set_limit(self, limit: int) -> None: ...


class Throttle:
    """AIMD (or adaptive) control of the gate's limit, driven by alerts through hold() and release()."""

    def __init__(self, gate: Limited, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._gate = gate
        self._monotonic = monotonic
        self._holds: dict[str, ThrottleSpec] = {}  # the most recent hold last
        self._recovery: ThrottleSpec | None = None  # paces the climb back once nothing holds
        self._last_change: float | None = None

    @property
    def held(self) -> bool:
        """Whether some alert holds the limit down."""
        return bool(self._holds)

    def hold(self, key: str, spec: ThrottleSpec) -> int:
        """Alert `key` fired: decrease the limit now (never below floor, never up) and keep it held."""
        self._set(spec.lowered(self._gate.limit))
        self._holds.pop(key, None)
        self._holds[key] = spec
        self._recovery = None
        self._last_change = self._monotonic()
        return self._gate.limit

    def release(self, key: str) -> None:
        """Alert `key` resolved: drop its hold; with no hold left the limit starts to climb back."""
        spec = self._holds.pop(key, None)
        if spec is None or self._holds:
            return
        if self._gate.limit < self._gate.ceiling:
            self._recovery = spec
            self._last_change = self._monotonic()

    def tick(self, signal: Callable[[str], float | None]) -> int:
        """Advance recovery or adaptive control (call about once a second); returns the limit."""
        now = self._monotonic()
        limit = self._gate.limit
        ceiling = self._gate.ceiling
        if self._holds:
            spec = next((s for s in reversed(self._holds.values()) if s.adaptive is not None), None)
            if spec is None or spec.adaptive is None or not self._due(spec, now):
                return limit
            observed = signal(spec.adaptive)
            if observed is None or not math.isfinite(observed) or observed < 0:
                return limit
            if observed > spec.target:
                shrunk = math.floor(limit * max(MIN_RATIO, spec.target / observed))
                new = min(limit, max(spec.floor, shrunk))  # never below floor, never up
            else:
                new = max(limit, min(limit + spec.step, self._cap(ceiling)))
        elif self._recovery is not None:
            if limit >= ceiling:
                self._recovery = None
                return limit
            if not self._due(self._recovery, now):
                return limit
            new = min(ceiling, limit + self._recovery.step)
        else:
            return limit
        if new != limit:
            self._set(new)
            self._last_change = now
        if self._recovery is not None and self._gate.limit >= ceiling:
            self._recovery = None
        return self._gate.limit

    def _cap(self, ceiling: int) -> int:
        """The most an adaptive hold may grow to: absolute limits of the other holds still apply."""
        caps = [s.limit for s in self._holds.values() if s.adaptive is None and s.limit is not None]
        return min([ceiling, *caps])

    def _due(self, spec: ThrottleSpec, now: float) -> bool:
        return self._last_change is None or now - self._last_change >= spec.step_interval

    def _set(self, limit: int) -> None:
        self._gate.set_limit(limit)

    def state(self) -> dict[str, object]:
        """JSON-able state, for persistence and the API."""
        now = self._monotonic()
        since = None if self._last_change is None else round(max(0.0, now - self._last_change), 3)
        return {
            "limit": self._gate.limit,
            "ceiling": self._gate.ceiling,
            "holds": {key: spec.to_json() for key, spec in self._holds.items()},
            "recovering": None if self._recovery is None else self._recovery.to_json(),
            "seconds_since_change": since,
        }

    def restore(self, state: Mapping[str, object]) -> None:
        """Take back state() output after a restart; never raises the limit; invalid parts are ignored."""
        if not isinstance(state, Mapping):
            return
        holds = state.get("holds")
        restored = False
        if isinstance(holds, Mapping):
            for key, doc in holds.items():
                spec = ThrottleSpec.from_json(doc)
                if isinstance(key, str) and spec is not None and key not in self._holds:
                    self._holds[key] = spec
                    restored = True
        recovering = ThrottleSpec.from_json(state.get("recovering"))
        if recovering is not None and not self._holds:
            self._recovery = recovering
            restored = True
        limit = state.get("limit")
        if restored and isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
            self._set(min(self._gate.limit, limit))
        if self._holds:
            self._set(min(self._gate.limit, self._cap(self._gate.ceiling)))
        if restored:
            self._last_change = self._monotonic()  # pace from now: the old monotonic clock is gone
        if self._holds:
            self._recovery = None
