"""What one query may do: how many samples it may materialise, and the deadline its `tick` checks."""

from __future__ import annotations

from collections.abc import Callable

from .values import QueryError

# Samples (each element of an instant vector, each point of a range) that all the nodes of one query may
# produce together. Prometheus' --query.max-samples is 50 M; this process also scrapes, and no query the API's
# 2 s deadline lets finish gets near 5 M. Rules have no deadline: this is their bound.
MAX_SAMPLES = 5_000_000
TOO_MANY_SAMPLES = "query processing would load too many samples into memory in query execution"
# The deadline is checked after at most this many samples or nodes.
TICK_EVERY = 1024


def _no_tick() -> None:
    pass


class Budget:
    """Counts what a query materialises and checks its deadline every TICK_EVERY samples or nodes."""

    __slots__ = ("_until_tick", "max_samples", "samples", "tick")

    def __init__(self, tick: Callable[[], None] | None = None, max_samples: int = MAX_SAMPLES) -> None:
        self.tick = tick or _no_tick  # raises (QueryTimeout) to abandon the query
        self.max_samples = max_samples
        self.samples = 0
        self._until_tick = TICK_EVERY

    def charge(self, samples: int) -> None:
        """Count samples just materialised (and one node); raises QueryError past the budget."""
        self.samples += samples
        if self.samples > self.max_samples:
            raise QueryError(TOO_MANY_SAMPLES)
        self._until_tick -= samples + 1
        if self._until_tick <= 0:
            self._until_tick = TICK_EVERY
            self.tick()

    def step(self) -> None:
        """Check the deadline now (each step of a range query or subquery)."""
        self._until_tick = TICK_EVERY
        self.tick()
