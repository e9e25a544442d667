"""The one injectable clock of the tests: code under test takes `clock=` or `monotonic=`, tests move time."""

from __future__ import annotations

T0 = 1_700_000_000.0  # a wall-clock time (November 2023): where a test's time starts unless it says otherwise


class Clock:
    """Time a test sets: calling the clock reads `now`.

    Code that takes one clock, or a wall and a monotonic clock that must agree, gets the clock itself for
    both. Code that must see the wall clock step while monotonic time does not gets `clock` and
    `clock.monotonic`: `advance` moves both, `jump` moves the wall clock alone.
    """

    def __init__(self, now: float = T0, monotonic: float | None = None) -> None:
        self.now = now
        self.monotonic_now = now if monotonic is None else monotonic

    def __call__(self) -> float:
        """The wall time (or the only time)."""
        return self.now

    def monotonic(self) -> float:
        """The monotonic time: moved by `advance`, not by `jump`."""
        return self.monotonic_now

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass."""
        self.now += seconds
        self.monotonic_now += seconds

    def jump(self, seconds: float) -> None:
        """Step the wall clock alone, as NTP or an operator does; monotonic time stands still."""
        self.now += seconds
