"""Admission control: a global concurrency limit with a priority queue, session limits, breakers and drains.

Not thread-safe: every method runs on the gateway's event loop.

Invariant: after every change of state, waiters are granted slots while slots are free and someone eligible
waits (a waiter whose session is at its cap is not eligible, nor one without a session while requests without
one hold their share, `sessions.anonymous_share` of the cap). So a free slot seen by a newcomer means nobody
waiting could use it, and the newcomer takes it without looking at the queue (the fast path).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from statistics import median

from ..config import GatewayConfig
from ..protocol.snapshot import GateSnapshot
from .histogram import Histogram
from .rejections import Rejection, Rejections
from .sessions import SessionLimits
from .waitqueue import Waiter, WaitQueue

RECENT_WINDOW = 60.0  # seconds of admissions recent_queue_time() looks at
RECENT_SAMPLES = 256


class Ticket:
    """An admitted request; release() exactly once when the response is done (idempotent)."""

    __slots__ = ("_gate", "admitted_at", "batch", "priority", "queued_seconds", "released", "session")

    def __init__(
        self,
        gate: Gate,
        session: str | None,
        priority: str,
        admitted_at: float,
        queued_seconds: float,
        batch: int = 1,
    ) -> None:
        self._gate = gate
        self.batch = batch  # requests in flight once this one was admitted (itself included)
        self.session = session
        self.priority = priority
        self.admitted_at = admitted_at  # monotonic
        self.queued_seconds = queued_seconds
        self.released = False

    def release(self) -> None:
        """Free the request's slots; later calls do nothing."""
        if not self.released:
            self.released = True
            self._gate._release(self)

    def __repr__(self) -> str:
        return f"Ticket(session={self.session!r}, priority={self.priority!r}, released={self.released})"


class Gate:
    """Decides, per request, admit now / wait in the priority queue / reject."""

    def __init__(self, config: GatewayConfig, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._sessions = SessionLimits(config.sessions, monotonic=monotonic)
        self._ceiling = max(1, config.max_in_flight)
        self._limit = self._ceiling
        self._throttled = False  # set_limit() put the limit below the ceiling
        self._in_flight = 0
        self._anonymous = 0  # requests without a session in flight
        self._tickets: dict[Ticket, None] = {}  # in admission order: the first is the oldest
        self._queue: WaitQueue[Ticket | Rejection] = WaitQueue()
        self._draining = False
        self._breakers: dict[str, tuple[float, str]] = {}
        self._admitted: dict[str, int] = {}
        self._rejections = Rejections()
        self._queue_time = Histogram()
        self._recent: deque[tuple[float, float]] = deque(maxlen=RECENT_SAMPLES)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._configure(config)

    def _configure(self, config: GatewayConfig) -> None:
        self._config = config
        self._max_queue = max(0, config.max_queue)
        self._max_queue_time = config.max_queue_time
        self._drain_reject = config.drain_mode == "reject"
        self._drain_max_wait = config.drain_max_wait
        self._anonymous_share = config.sessions.anonymous_share
        classes = config.priority.classes or (config.priority.default,)
        self._default = config.priority.default if config.priority.default in classes else classes[-1]
        self._queue.reclass(classes, self._default)
        for cls in classes:
            self._admitted.setdefault(cls, 0)

    # -- properties ------------------------------------------------------------------------------------------

    @property
    def limit(self) -> int:
        """The current cap on requests in flight (the throttle moves it within [1, ceiling])."""
        return self._limit

    @property
    def ceiling(self) -> int:
        """The configured cap (max_in_flight)."""
        return self._ceiling

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet released."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Requests waiting in the queue (drain holds included)."""
        return self._queue.waiting

    @property
    def draining(self) -> bool:
        """Whether admission is stopped for a drain."""
        return self._draining

    # -- admission -------------------------------------------------------------------------------------------

    async def admit(self, session: str | None, priority: str) -> Ticket | Rejection:
        """Admit the request now, after waiting in the queue, or reject it."""
        now = self._monotonic()
        rank = self._queue.rank.get(priority)
        if rank is None:
            priority = self._default
            rank = self._queue.rank[priority]
        if session is not None:
            if self._breakers:
                rejection = self._breaker_rejection(session, now)
                if rejection is not None:
                    return rejection
            wait = self._sessions.take(session)
            if wait > 0.0:
                return self._rejections.session_rate(self._config.sessions.rate, wait)
        if self._draining:
            if self._drain_reject:
                return self._rejections.draining()
        elif self._in_flight < self._limit and self._has_room(session):
            return self._grant(session, priority, now, 0.0)
        return await self._wait(session, priority, rank, now)

    async def readmit(self, session: str | None, priority: str) -> Ticket | Rejection:
        """Admit again a request that was admitted once and lost its upstream (a replay): no breaker, rate or
        queue-length check (the replay has its own caps), and at the head of its class while it waits."""
        now = self._monotonic()
        if priority not in self._queue.rank:
            priority = self._default
        if not self._draining and self._in_flight < self._limit and self._has_room(session):
            return self._grant(session, priority, now, 0.0)
        return await self._wait(session, priority, self._queue.rank[priority], now, front=True)

    async def _wait(
        self, session: str | None, priority: str, rank: int, now: float, front: bool = False
    ) -> Ticket | Rejection:
        waiting = self._queue.waiting
        if not front and waiting >= self._max_queue and not self._shed_below(rank):
            return self._rejections.queue_full(waiting, self._queue_retry_after())
        loop = self._loop = asyncio.get_running_loop()
        waiter: Waiter[Ticket | Rejection] = Waiter(session, priority, rank, now, loop.create_future())
        self._queue.push(waiter, front)
        self._arm(waiter, loop)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            # The client went away. Either we are still queued (leave the queue) or a slot was granted in the
            # same loop iteration as the cancellation (give it back).
            if waiter.future.cancelled() or not waiter.future.done():
                self._queue.remove(waiter)
            else:
                result = waiter.future.result()
                if isinstance(result, Ticket):
                    result.release()
            raise

    def _arm(self, waiter: Waiter[Ticket | Rejection], loop: asyncio.AbstractEventLoop) -> None:
        if waiter.timer is not None:
            waiter.timer.cancel()
        waiter.held = self._draining
        timeout = self._drain_max_wait if self._draining else self._max_queue_time
        waiter.timer = loop.call_later(max(0.0, timeout), self._expire, waiter)

    def _finish(self, waiter: Waiter[Ticket | Rejection], result: Ticket | Rejection) -> None:
        self._queue.remove(waiter)
        if not waiter.future.done():
            waiter.future.set_result(result)
        elif isinstance(result, Ticket):
            result.release()  # pick() skips finished futures; never leak a slot all the same

    def _expire(self, waiter: Waiter[Ticket | Rejection]) -> None:
        waiter.timer = None
        if not waiter.queued or waiter.future.done():
            return
        retry = self._queue_retry_after()
        if waiter.held:
            self._finish(waiter, self._rejections.drain_timeout(self._drain_max_wait))
        elif waiter.session is not None and not self._sessions.has_room(waiter.session):
            cap = self._sessions.max_in_flight
            self._finish(waiter, self._rejections.session_concurrency(cap, self._max_queue_time, retry))
        elif waiter.session is None and self._anonymous >= self._anonymous_cap() < self._limit:
            cap = self._anonymous_cap()  # their share held them back, not the cap of all requests
            self._finish(waiter, self._rejections.anonymous_concurrency(cap, self._max_queue_time, retry))
        else:
            self._finish(waiter, self._rejections.queue_timeout(self._max_queue_time, retry))

    def _shed_below(self, rank: int) -> bool:
        """Make room for a request of `rank` by rejecting the newest waiter of the lowest lower class."""
        victim = self._queue.newest_below(rank)
        if victim is None:
            return False
        self._finish(victim, self._rejections.shed(self._queue_retry_after()))
        return True

    def _dispatch(self) -> None:
        if self._draining:
            return
        now: float | None = None
        while self._queue.waiting and self._in_flight < self._limit:
            waiter = self._queue.pick(self._has_room)
            if waiter is None:
                return
            if now is None:
                now = self._monotonic()
            ticket = self._grant(waiter.session, waiter.priority, now, max(0.0, now - waiter.arrived))
            self._finish(waiter, ticket)

    def _grant(self, session: str | None, priority: str, now: float, queued: float) -> Ticket:
        self._in_flight += 1
        ticket = Ticket(self, session, priority, now, queued, self._in_flight)
        self._tickets[ticket] = None
        if session is not None:
            self._sessions.acquire(session)
        else:
            self._anonymous += 1
        self._admitted[priority] = self._admitted.get(priority, 0) + 1
        self._queue_time.observe(queued)
        self._recent.append((now, queued))
        return ticket

    def _release(self, ticket: Ticket) -> None:
        """Ticket.release() calls this once per ticket."""
        if ticket not in self._tickets:
            return  # not one of ours (or already released)
        del self._tickets[ticket]
        self._in_flight -= 1
        if ticket.session is not None:
            self._sessions.release(ticket.session)
        else:
            self._anonymous -= 1
        if self._queue.waiting:
            self._dispatch()

    def _anonymous_cap(self) -> int:
        """Slots requests without a session may hold together: their share of the current cap, at least 1."""
        return max(1, math.floor(self._anonymous_share * self._limit))

    def _has_room(self, session: str | None) -> bool:
        """Whether a request of `session` (None: without one) is below its own cap."""
        if session is None:
            return self._anonymous < self._anonymous_cap()
        return self._sessions.has_room(session)

    # -- rejections ------------------------------------------------------------------------------------------

    def _queue_retry_after(self) -> float:
        recent = self.recent_queue_time()
        return max(1.0, min(recent if recent is not None else 1.0, self._max_queue_time))

    def _breaker_rejection(self, session: str, now: float) -> Rejection | None:
        breaker = self._breakers.get(session)
        if breaker is None:
            return None
        until, why = breaker
        if until <= now:
            del self._breakers[session]
            return None
        return self._rejections.breaker(until - now, why)

    # -- control ---------------------------------------------------------------------------------------------

    def set_limit(self, limit: int) -> None:
        """Set the in-flight cap, clamped to [1, ceiling]; raising it admits waiters at once."""
        self._limit = min(max(1, int(limit)), self._ceiling)
        self._throttled = self._limit < self._ceiling
        self._dispatch()

    def set_drain(self, drained: bool) -> None:
        """Stop (hold or reject) or resume admission; requests in flight are not touched."""
        if drained == self._draining:
            return
        self._draining = drained
        if drained and self._drain_reject:
            self._reject_all_waiters()
            return
        # Held waiters get the drain timer; after a drain everyone gets a fresh max_queue_time.
        self._rearm_all()
        self._dispatch()

    def _rearm_all(self) -> None:
        if self._loop is None:
            return
        for waiter in self._queue:
            if not waiter.future.done():
                self._arm(waiter, self._loop)

    def _reject_all_waiters(self) -> None:
        for waiter in list(self._queue):
            self._finish(waiter, self._rejections.draining())

    def open_breaker(self, session: str, until: float, reason: str) -> None:
        """Reject the session's requests until `until` (monotonic); its queued requests are rejected now."""
        self._breakers[session] = (until, reason)
        now = self._monotonic()
        if until <= now or not self._queue.waiting:
            return
        for waiter in [w for w in self._queue if w.session == session]:
            rejection = self._breaker_rejection(session, now)
            if rejection is not None:
                self._finish(waiter, rejection)

    def close_breaker(self, session: str) -> None:
        """Admit the session's requests again."""
        self._breakers.pop(session, None)

    def breakers(self) -> dict[str, tuple[float, str]]:
        """Open breakers: session -> (until, reason); expired ones are dropped."""
        now = self._monotonic()
        for session in [s for s, (until, _) in self._breakers.items() if until <= now]:
            del self._breakers[session]
        return dict(self._breakers)

    def apply(self, config: GatewayConfig) -> None:
        """Take a reloaded config: new ceiling (an unthrottled limit follows it), queue and session limits."""
        self._ceiling = max(1, config.max_in_flight)
        self._limit = min(self._limit, self._ceiling) if self._throttled else self._ceiling
        was_reject = self._drain_reject
        self._configure(config)
        self._sessions.apply(config.sessions)
        if self._draining and self._drain_reject and not was_reject:
            self._reject_all_waiters()
        self._dispatch()

    # -- observation -----------------------------------------------------------------------------------------

    def recent_queue_time(self) -> float | None:
        """Median queue time (seconds) of the admissions of the last minute; None if there were none."""
        if not self._recent:
            return None
        horizon = self._monotonic() - RECENT_WINDOW
        while self._recent and self._recent[0][0] < horizon:
            self._recent.popleft()
        if not self._recent:
            return None
        return float(median(q for _, q in self._recent))

    def snapshot(self) -> GateSnapshot:
        """Admission state now."""
        now = self._monotonic()
        oldest = next(iter(self._tickets), None)
        return GateSnapshot(
            limit=self._limit,
            ceiling=self._ceiling,
            in_flight=self._in_flight,
            queued=self._queue.lengths(),
            oldest_in_flight_age=max(0.0, now - oldest.admitted_at) if oldest is not None else 0.0,
            draining=self._draining,
            admitted_total=dict(self._admitted),
            rejected_total=dict(self._rejections.counts),
            queue_time=self._queue_time.snapshot(),
            breakers_open=tuple(sorted(self.breakers())),
            session_in_flight=self._sessions.in_flight_by_session(),
        )
