"""The read API's queries, each one's whole work in a child process, one at a time, clients in turn.

The daemon's event loop scrapes, evaluates rules and acts; a query must not take it from them, however heavy
or hostile. So a query's parsing, evaluation, sorting, redaction and JSON encoding all run in a forked child
(querychild.py) that the loop only waits on, bounded in wall time, bytes of answer and memory; the loop's own
share is the fork (its page tables: about a millisecond per 100 MB of the daemon's memory) and reading the
answer off a pipe. Queries take turns at one child (fairqueue.py), a client at a time (peers.py), and after a
fork that held the loop for d seconds, the next waits `spacing` times d: the loop spends at most about a fifth
of its time forking, however fast queries come.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .fairqueue import PER_CLIENT, SLOTS, WAITING, Busy, FairQueue
from .peers import ClientIds
from .querychild import Answer, Child, ChildFailed, ChildLimits, spawn

Spawn = Callable[[Callable[[], Answer], ChildLimits], Child]


@dataclass(frozen=True)
class Delivery:
    """An answer, and what to call once its client has read it."""

    answer: Answer
    sent: Callable[[], None]


@dataclass(frozen=True)
class RunnerLimits:
    """Queries at once, waiting per client and in all, bytes of one answer, memory of one child, the seconds
    a child gets past its query's timeout to write its answer, the spacing after a fork, and the bytes of
    answers clients may leave unread (a client that does not read would otherwise hold each one it asked)."""

    slots: int = SLOTS
    per_client: int = PER_CLIENT
    waiting: int = WAITING
    max_bytes: int = 64 << 20
    memory: int = 1 << 30
    grace: float = 0.5
    spacing: float = 4.0
    held: int = 512 << 20  # bytes of answers handed out and not yet read by their clients, all together
    held_per_client: int = 128 << 20  # ... and of one client's


def error_kind(exc: Busy | ChildFailed) -> str:
    """Prometheus' errorType for a query the runner could not answer."""
    if isinstance(exc, Busy):
        return "unavailable"
    return {"timeout": "timeout", "unavailable": "unavailable"}.get(exc.kind, "execution")


class QueryRunner:
    """Runs each query's work in a child process when it is its client's turn; Busy or ChildFailed if not."""

    def __init__(
        self,
        monotonic: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        limits: RunnerLimits = RunnerLimits(),
        spawn: Spawn = spawn,
    ) -> None:
        self.monotonic = monotonic
        self.sleep = sleep
        self.limits = limits
        self.spawn = spawn
        self.queue = FairQueue(limits.slots, limits.per_client, limits.waiting)
        self.clients = ClientIds(monotonic)
        self.free_at = 0.0
        self.held: dict[str, int] = {}  # bytes of answers not yet read, by client

    async def run(self, scope: Mapping[str, Any], work: Callable[[], Answer], seconds: float) -> Delivery:
        """`work`'s answer, computed in a child that may take `seconds` (plus the grace to write it)."""
        client = self.clients.key(scope)
        held = sum(self.held.values())
        if held >= self.limits.held or self.held.get(client, 0) >= self.limits.held_per_client:
            raise Busy(f"answers not yet read by their clients hold {held} bytes; try again later")
        async with self.queue.turn(client):
            answer = await self._run(work, seconds)
        size = len(answer.body)
        self.held[client] = self.held.get(client, 0) + size

        def sent() -> None:
            left = self.held.get(client, 0) - size
            if left > 0:
                self.held[client] = left
            else:
                self.held.pop(client, None)

        return Delivery(answer, sent)

    async def _run(self, work: Callable[[], Answer], seconds: float) -> Answer:
        pause = self.free_at - self.monotonic()
        if pause > 0:
            await self.sleep(pause)
        wall = seconds + self.limits.grace
        limits = ChildLimits(wall, self.limits.max_bytes, self.limits.memory, math.ceil(wall) + 1)
        started = self.monotonic()
        try:
            child = self.spawn(work, limits)
        except OSError as exc:
            raise ChildFailed("unavailable", f"cannot start the query's process: {exc.strerror}") from None
        ended = self.monotonic()
        self.free_at = ended + (ended - started) * self.limits.spacing
        return await child.answer()
