"""Noticing wall-clock jumps: the wall clock and the monotonic clock, read together, disagree.

Samples carry wall-clock timestamps (as in Prometheus). Set the clock back by an hour and the sample store
would refuse every new sample as out of order, and rule groups would wait for the clock to pass their last
evaluation. The schedule's jobs wait on the monotonic clock, but they hand their functions the wall time.
The daemon reads both clocks every second on the event loop, whose timers are monotonic, and when they
disagree by more than TOLERANCE it places the schedule's jobs again from the new time; if the clock went back
it also drops the samples stamped in what is now the future, so that new scrapes are stored and the rules
see them at once.
"""

from __future__ import annotations

from collections.abc import Callable

TOLERANCE = 2.0  # seconds of disagreement that count as a jump (NTP slews far more gently)


class ClockWatch:
    """Compares how far the wall clock and the monotonic clock moved between two checks."""

    def __init__(
        self, clock: Callable[[], float], monotonic: Callable[[], float], tolerance: float = TOLERANCE
    ) -> None:
        self.clock, self.monotonic, self.tolerance = clock, monotonic, tolerance
        self._wall, self._mono = clock(), monotonic()
        self.jumps = {"forward": 0, "backward": 0}

    def check(self) -> float:
        """Seconds the wall clock jumped since the last check (negative: back); 0.0 within the tolerance."""
        wall, mono = self.clock(), self.monotonic()
        skew = (wall - self._wall) - (mono - self._mono)
        self._wall, self._mono = wall, mono
        if abs(skew) <= self.tolerance:
            return 0.0
        self.jumps["forward" if skew > 0 else "backward"] += 1
        return skew
