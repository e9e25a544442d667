"""The one injectable clock of the tests: code under test takes `clock=` or `monotonic=`, tests move time."""

from __future__ import annotations

import asyncio
import heapq
import itertools

T0 = 1_700_000_000.0  # a wall-clock time (November 2023): where a test's time starts unless it says otherwise


class Clock:
    """Time a test sets: calling the clock reads `now`.

    Code that takes one clock, or a wall and a monotonic clock that must agree, gets the clock itself for
    both. Code that must see the wall clock step while monotonic time does not gets `clock` and
    `clock.monotonic`: `advance` moves both, `jump` moves the wall clock alone. Code that sleeps on the event
    loop takes `clock.sleep`, and the test lets time pass with `await clock.run(seconds)`: it wakes each sleeper
    at its time, in order, and lets the loop run what that set off before moving on.
    """

    def __init__(self, now: float = T0, monotonic: float | None = None) -> None:
        self.now = now
        self.monotonic_now = now if monotonic is None else monotonic
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

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

    async def sleep(self, seconds: float) -> None:
        """Wait until `run` has moved monotonic time `seconds` on (asyncio.sleep on this clock)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.monotonic_now + max(seconds, 0.0), next(self._order), future))
        await future

    async def run(self, seconds: float, settle: int = 20) -> None:
        """Let `seconds` pass: wake every sleeper due by then at its own time, oldest first, giving the loop
        `settle` turns after each wake-up (and before the first) to run what it set off."""
        end = self.monotonic_now + seconds
        await _settle(settle)
        while self._sleepers and self._sleepers[0][0] <= end:
            when, _, future = heapq.heappop(self._sleepers)
            if future.done():  # its sleeper was cancelled
                continue
            self.advance(max(when - self.monotonic_now, 0.0))
            future.set_result(None)
            await _settle(settle)
        self.advance(end - self.monotonic_now)
        await _settle(settle)


async def _settle(turns: int) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)
