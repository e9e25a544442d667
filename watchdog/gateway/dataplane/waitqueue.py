"""The gate's wait queue: a FIFO per priority class, the highest class first. A waiter leaves it granted,
rejected, timed out or cancelled; its future holds what the gate decided (the gate's Ticket or Rejection)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

Outcome = TypeVar("Outcome")  # what a waiter's future resolves to


class Waiter(Generic[Outcome]):
    """A request waiting for a slot; its future gets the ticket or the rejection."""

    __slots__ = ("arrived", "future", "held", "priority", "queued", "rank", "session", "timer")

    def __init__(
        self,
        session: str | None,
        priority: str,
        rank: int,
        arrived: float,
        future: asyncio.Future[Outcome],
    ) -> None:
        self.session = session
        self.priority = priority
        self.rank = rank
        self.arrived = arrived
        self.future = future
        self.queued = True
        self.held = False  # its timer is the drain timer
        self.timer: asyncio.TimerHandle | None = None


class WaitQueue(Generic[Outcome]):
    """Waiters by priority class (rank 0 first), in order of arrival within a class."""

    def __init__(self) -> None:
        self.classes: tuple[str, ...] = ()
        self.rank: dict[str, int] = {}
        self.waiting = 0  # waiters still queued
        self._queues: list[deque[Waiter[Outcome]]] = []

    def reclass(self, classes: tuple[str, ...], default: str) -> None:
        """Take the configured classes; a waiter keeps its arrival order, and one of a class gone gets
        `default`."""
        if classes == self.classes:
            return
        waiters = sorted((w for q in self._queues for w in q), key=lambda w: w.arrived)
        self.classes = classes
        self.rank = {cls: i for i, cls in enumerate(classes)}
        self._queues = [deque() for _ in classes]
        for w in waiters:
            if w.priority not in self.rank:
                w.priority = default
            w.rank = self.rank[w.priority]
            self._queues[w.rank].append(w)

    def __iter__(self) -> Iterator[Waiter[Outcome]]:
        for queue in self._queues:
            yield from queue

    def lengths(self) -> dict[str, int]:
        """Waiters by class."""
        return {cls: len(q) for cls, q in zip(self.classes, self._queues, strict=True)}

    def push(self, waiter: Waiter[Outcome], front: bool = False) -> None:
        """Queue a waiter at the end of its class (`front`: at its head, for a request replayed)."""
        if front:
            self._queues[waiter.rank].appendleft(waiter)
        else:
            self._queues[waiter.rank].append(waiter)
        self.waiting += 1

    def remove(self, waiter: Waiter[Outcome]) -> None:
        """Take a waiter out of the queue and stop its timer (a waiter already out: only the timer)."""
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None
        if not waiter.queued:
            return
        waiter.queued = False
        queue = self._queues[waiter.rank]
        if queue and queue[0] is waiter:
            queue.popleft()
        else:
            queue.remove(waiter)
        self.waiting -= 1

    def newest_below(self, rank: int) -> Waiter[Outcome] | None:
        """The newest waiter of the lowest class below `rank`, None if no lower class has one."""
        for lower in range(len(self._queues) - 1, rank, -1):
            queue = self._queues[lower]
            if queue:
                return queue[-1]
        return None

    def pick(self, has_room: Callable[[str | None], bool]) -> Waiter[Outcome] | None:
        """The first eligible waiter of the highest class (sessions without room are skipped; `has_room(None)`
        says whether requests without a session have room)."""
        for queue in self._queues:
            while queue and queue[0].future.done():  # cancelled, its task has not run yet
                self.remove(queue[0])
            for waiter in queue:
                if waiter.future.done():
                    continue
                if has_room(waiter.session):
                    return waiter
        return None
