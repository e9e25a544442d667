"""Turns at the read API's query slots, shared round-robin between clients.

Each client (see peers.py: the local user owning the connection, else its address) may have a few queries
waiting; when a slot frees, the next client in turn gets it, then goes to the back of the line. One client
sending forty queries at once gets eight of them queued and 503 for the rest, and another client's query
waits for at most one turn of each client ahead of it, never behind the first one's forty.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Hashable

SLOTS = 1  # queries running at once (each is a child process: one core at most, one memory budget)
PER_CLIENT = 8  # queries one client may have waiting
WAITING = 64  # queries all clients together may have waiting


class Busy(Exception):
    """A query refused because its client, or all clients together, have too many waiting."""


class FairQueue:
    """At most `slots` holders at once; waiters are served one per client in turn."""

    def __init__(self, slots: int = SLOTS, per_client: int = PER_CLIENT, waiting: int = WAITING) -> None:
        self.slots = slots
        self.per_client = per_client
        self.max_waiting = waiting
        self.running = 0
        self.count = 0  # futures in `waiting`
        self.waiting: OrderedDict[Hashable, deque[asyncio.Future[None]]] = OrderedDict()

    @contextlib.asynccontextmanager
    async def turn(self, client: Hashable) -> AsyncIterator[None]:
        """Hold a slot for the block, once it is `client`'s turn; Busy if it may not wait."""
        await self._acquire(client)
        try:
            yield
        finally:
            self._release()

    def waiting_for(self, client: Hashable) -> int:
        """How many of `client`'s queries wait."""
        return len(self.waiting.get(client, ()))

    async def _acquire(self, client: Hashable) -> None:
        if self.running < self.slots and not self.waiting:
            self.running += 1
            return
        if self.waiting_for(client) >= self.per_client:
            raise Busy(f"this client has {self.per_client} queries waiting; try again later")
        if self.count >= self.max_waiting:
            raise Busy(f"too many queries waiting ({self.max_waiting}); try again later")
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(client, deque()).append(turn)
        self.count += 1
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self._release()  # given the slot as it was cancelled: pass it on
            else:
                self._forget(client, turn)
            raise

    def _forget(self, client: Hashable, turn: asyncio.Future[None]) -> None:
        queue = self.waiting.get(client)
        if queue is None or turn not in queue:
            return
        queue.remove(turn)
        self.count -= 1
        if not queue:
            del self.waiting[client]

    def _release(self) -> None:
        self.running -= 1
        while self.waiting and self.running < self.slots:
            client, queue = next(iter(self.waiting.items()))
            turn = queue.popleft()
            self.count -= 1
            if queue:
                self.waiting.move_to_end(client)
            else:
                del self.waiting[client]
            if not turn.done():
                self.running += 1
                turn.set_result(None)
