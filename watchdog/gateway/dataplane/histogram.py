"""A fixed-bucket latency histogram, cheap enough for every request."""

from __future__ import annotations

from bisect import bisect_left

from ..protocol.snapshot import LATENCY_BUCKETS, HistogramSnapshot


class Histogram:
    """Counts observations into Prometheus-style buckets (`le` upper bounds, inclusive)."""

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0
        self._count = 0

    def observe(self, value: float) -> None:
        """Add one observation (seconds)."""
        self._counts[bisect_left(self.bounds, value)] += 1
        self._sum += value
        self._count += 1

    def snapshot(self) -> HistogramSnapshot:
        """Cumulative counts as Prometheus exposes them."""
        cumulative: list[int] = []
        running = 0
        for c in self._counts:
            running += c
            cumulative.append(running)
        return HistogramSnapshot(self.bounds, tuple(cumulative), self._sum, self._count)
