"""The gate on a real event loop: fast path, priority queueing, session limits, cancellation, drains, breakers.

Waiting is real asyncio; measured times (queue time, ages, breakers, token buckets) use an injected clock.
Timeouts that must fire are a few milliseconds long; nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

import pytest

from tests.support.clock import Clock
from vllm_watchdog.gateway.config import GatewayConfig, PriorityConfig, SessionConfig
from vllm_watchdog.gateway.dataplane.admission import Gate, Ticket
from vllm_watchdog.gateway.dataplane.rejections import Rejection

pytestmark = pytest.mark.anyio
SHORT = 0.02  # a timeout that must fire during the test
LONG = 60.0  # a timeout that must not


def config(**kw: Any) -> GatewayConfig:
    kw.setdefault("max_queue_time", LONG)
    kw.setdefault("drain_max_wait", LONG)
    # Most tests admit requests without a session to try other limits: their share is lifted unless asked for.
    kw.setdefault("sessions", SessionConfig(anonymous_share=1.0))
    return GatewayConfig(target="gpu0", upstream="http://127.0.0.1:1", **kw)


def admit_now(gate: Gate, session: str | None = None, priority: str = "interactive") -> Ticket | Rejection:
    """Run admit() to its end without an event loop: it must not suspend (the fast path and rejections)."""
    coro: Coroutine[Any, Any, Ticket | Rejection] = gate.admit(session, priority)
    with pytest.raises(StopIteration) as stop:
        coro.send(None)
    result: Ticket | Rejection = stop.value.value
    return result


def ticket(result: Ticket | Rejection) -> Ticket:
    assert isinstance(result, Ticket), result
    return result


def rejection(result: Ticket | Rejection) -> Rejection:
    assert isinstance(result, Rejection), result
    return result


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class Clients:
    """Starts admit() calls as tasks and records the order in which they were answered."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.order: list[str] = []
        self.tasks: dict[str, asyncio.Task[Ticket | Rejection]] = {}

    async def start(self, name: str, session: str | None = None, priority: str = "interactive") -> None:
        async def run() -> Ticket | Rejection:
            result = await self.gate.admit(session, priority)
            self.order.append(name)
            return result

        self.tasks[name] = asyncio.create_task(run())
        await settle()

    def result(self, name: str) -> Ticket | Rejection:
        task = self.tasks[name]
        assert task.done(), f"{name} still waiting"
        return task.result()

    def pending(self) -> set[str]:
        return {name for name, task in self.tasks.items() if not task.done()}


def test_fast_path_does_not_suspend_and_release_is_idempotent() -> None:
    clock = Clock(500.0)
    gate = Gate(config(max_in_flight=2), monotonic=clock)
    a = ticket(admit_now(gate, "s1", "batch"))
    assert (a.session, a.priority, a.admitted_at, a.queued_seconds) == ("s1", "batch", 500.0, 0.0)
    b = ticket(admit_now(gate))
    assert gate.in_flight == 2 and gate.limit == gate.ceiling == 2
    a.release()
    a.release()
    assert gate.in_flight == 1 and a.released
    b.release()
    assert gate.in_flight == 0
    snap = gate.snapshot()
    assert snap.admitted_total == {"interactive": 1, "batch": 1}
    assert snap.queue_time.count == 2 and snap.session_in_flight == {}


def test_unknown_priority_counts_as_default() -> None:
    gate = Gate(config(priority=PriorityConfig(classes=("hi", "lo"), default="lo")))
    t = ticket(admit_now(gate, None, "weird"))
    assert t.priority == "lo"


async def test_priority_order_then_fifo_within_class() -> None:
    gate = Gate(config(max_in_flight=1))
    holder = ticket(await gate.admit(None, "interactive"))
    c = Clients(gate)
    for name, prio in [("b1", "batch"), ("i1", "interactive"), ("b2", "batch"), ("i2", "interactive")]:
        await c.start(name, None, prio)
    assert c.pending() == {"b1", "i1", "b2", "i2"}
    assert gate.snapshot().queued == {"interactive": 2, "batch": 2}
    holder.release()
    for _ in range(4):
        await settle()
        ticket(c.result(c.order[-1])).release()
    await settle()
    assert c.order == ["i1", "i2", "b1", "b2"]
    assert gate.in_flight == 0 and gate.waiting == 0
    assert all(ticket(c.result(n)).queued_seconds >= 0 for n in c.order)


async def test_newcomer_does_not_jump_the_queue() -> None:
    gate = Gate(config(max_in_flight=1))
    holder = ticket(await gate.admit(None, "batch"))
    c = Clients(gate)
    await c.start("waiting")
    holder.release()  # the slot goes to the waiter, not to whoever calls admit() next
    assert gate.in_flight == 1
    await c.start("late")
    await settle()
    assert c.order == ["waiting"] and c.pending() == {"late"}
    ticket(c.result("waiting")).release()
    await settle()
    assert c.order == ["waiting", "late"]
    ticket(c.result("late")).release()


async def test_queue_full_and_lower_class_is_shed_first() -> None:
    gate = Gate(config(max_in_flight=1, max_queue=2))
    holder = ticket(await gate.admit(None, "interactive"))
    c = Clients(gate)
    await c.start("b1", None, "batch")
    await c.start("b2", None, "batch")
    full = rejection(await gate.admit(None, "batch"))
    assert (full.status, full.reason) == (429, "queue_full") and full.retry_after >= 1
    assert "retry" in full.message
    # An interactive request takes the place of the newest batch one.
    await c.start("i1", None, "interactive")
    assert rejection(c.result("b2")).reason == "queue_full"
    assert c.pending() == {"b1", "i1"}
    await c.start("i2", None, "interactive")  # and the next one takes b1's place
    assert rejection(c.result("b1")).reason == "queue_full"
    assert c.pending() == {"i1", "i2"}
    assert rejection(admit_now(gate, None, "interactive")).reason == "queue_full"  # nothing lower left
    assert rejection(admit_now(gate, None, "batch")).reason == "queue_full"
    assert gate.snapshot().rejected_total["queue_full"] == 5
    holder.release()
    await settle()
    assert c.order[-1] == "i1"
    ticket(c.result("i1")).release()
    await settle()
    ticket(c.result("i2")).release()
    assert gate.in_flight == 0 and gate.waiting == 0


async def test_queue_timeout() -> None:
    gate = Gate(config(max_in_flight=1, max_queue_time=SHORT))
    holder = ticket(await gate.admit(None, "interactive"))
    result = rejection(await gate.admit("s", "interactive"))
    assert (result.status, result.reason) == (429, "queue_timeout")
    assert result.retry_after >= 1
    assert gate.waiting == 0 and gate.in_flight == 1
    assert gate.snapshot().rejected_total["queue_timeout"] == 1
    holder.release()
    assert gate.in_flight == 0


def test_session_rate_retry_after_is_time_to_next_token() -> None:
    clock = Clock()
    gate = Gate(config(sessions=SessionConfig(rate=2.0, burst=2)), monotonic=clock)
    ticket(admit_now(gate, "s")).release()
    ticket(admit_now(gate, "s")).release()
    r = rejection(admit_now(gate, "s"))
    assert (r.status, r.reason) == (429, "session_rate")
    assert r.retry_after == pytest.approx(0.5)
    ticket(admit_now(gate, "other")).release()
    ticket(admit_now(gate, None)).release()  # anonymous requests have no session bucket
    clock.advance(0.5)
    ticket(admit_now(gate, "s")).release()
    assert gate.snapshot().rejected_total["session_rate"] == 1


async def test_session_at_cap_waits_without_blocking_others() -> None:
    gate = Gate(config(max_in_flight=2, sessions=SessionConfig(max_in_flight=1)))
    a1 = ticket(await gate.admit("A", "interactive"))
    c = Clients(gate)
    await c.start("A2", "A")  # A is at its cap: waits although a global slot is free
    assert c.pending() == {"A2"}
    x = ticket(await gate.admit("B", "batch"))  # a lower class still gets the free slot
    await c.start("C1", "C")  # no slot: queued behind A2
    assert c.pending() == {"A2", "C1"}
    x.release()  # A2 is first in line but capped: C1 is admitted
    await settle()
    assert c.order == ["C1"]
    a1.release()
    await settle()
    assert c.order == ["C1", "A2"]
    snap = gate.snapshot()
    assert snap.session_in_flight == {"A": 1, "C": 1}
    ticket(c.result("A2")).release()
    ticket(c.result("C1")).release()
    assert gate.in_flight == 0 and gate.snapshot().session_in_flight == {}


async def test_session_concurrency_timeout() -> None:
    gate = Gate(config(max_in_flight=4, max_queue_time=SHORT, sessions=SessionConfig(max_in_flight=1)))
    a1 = ticket(await gate.admit("A", "interactive"))
    r = rejection(await gate.admit("A", "interactive"))
    assert (r.status, r.reason) == (429, "session_concurrency") and r.retry_after >= 1
    assert gate.waiting == 0
    a1.release()
    ticket(await gate.admit("A", "interactive")).release()


async def test_cancelled_waiter_leaves_no_trace() -> None:
    gate = Gate(config(max_in_flight=1, sessions=SessionConfig(max_in_flight=1)))
    holder = ticket(await gate.admit("A", "interactive"))
    c = Clients(gate)
    await c.start("gone", "B")
    await c.start("next", "C")
    c.tasks["gone"].cancel()
    await settle()
    assert c.tasks["gone"].cancelled()
    assert gate.waiting == 1 and gate.snapshot().queued["interactive"] == 1
    holder.release()
    await settle()
    assert c.order == ["next"]
    ticket(c.result("next")).release()
    assert gate.in_flight == 0 and gate.waiting == 0
    assert gate.snapshot().session_in_flight == {}


async def test_cancel_in_the_same_iteration_as_the_grant_gives_the_slot_back() -> None:
    gate = Gate(config(max_in_flight=1))
    holder = ticket(await gate.admit(None, "interactive"))
    c = Clients(gate)
    await c.start("racer")
    await c.start("after")
    holder.release()  # grants "racer" a ticket; its task has not run yet
    c.tasks["racer"].cancel()
    await settle()
    assert c.tasks["racer"].cancelled()
    assert c.order == ["after"]  # the racer's slot went on to the next waiter
    ticket(c.result("after")).release()
    assert gate.in_flight == 0 and gate.waiting == 0


async def test_cancel_everyone_then_timers_do_nothing() -> None:
    gate = Gate(config(max_in_flight=1, max_queue_time=SHORT))
    holder = ticket(await gate.admit(None, "interactive"))
    c = Clients(gate)
    for i in range(5):
        await c.start(f"w{i}", None, "batch" if i % 2 else "interactive")
    for task in c.tasks.values():
        task.cancel()
    await settle()
    await asyncio.sleep(SHORT * 2)
    assert gate.waiting == 0 and gate.snapshot().rejected_total["queue_timeout"] == 0
    holder.release()
    assert gate.in_flight == 0


async def test_set_limit_lower_and_higher() -> None:
    gate = Gate(config(max_in_flight=3))
    held = [ticket(await gate.admit(None, "interactive")) for _ in range(3)]
    gate.set_limit(1)
    assert gate.limit == 1 and gate.in_flight == 3  # in flight requests are not touched
    c = Clients(gate)
    await c.start("w1")
    await c.start("w2")
    await c.start("w3")
    held[0].release()
    held[1].release()
    await settle()
    assert c.order == []  # still at the limit of 1
    gate.set_limit(3)  # raising admits waiters at once
    await settle()
    assert c.order == ["w1", "w2"] and c.pending() == {"w3"}
    gate.set_limit(0)
    assert gate.limit == 1
    gate.set_limit(10_000)
    assert gate.limit == 3
    held[2].release()
    await settle()
    assert c.order == ["w1", "w2", "w3"]
    for name in c.order:
        ticket(c.result(name)).release()
    assert gate.in_flight == 0


async def test_drain_hold_then_undrain_admits() -> None:
    gate = Gate(config(max_in_flight=2))
    inflight = ticket(await gate.admit(None, "interactive"))
    gate.set_drain(True)
    assert gate.draining and gate.snapshot().draining
    c = Clients(gate)
    await c.start("h1")
    await c.start("h2", None, "batch")
    await c.start("h3")
    inflight.release()  # a free slot does not end the hold
    await settle()
    assert c.order == [] and gate.snapshot().queued == {"interactive": 2, "batch": 1}
    gate.set_drain(False)
    await settle()
    assert c.order == ["h1", "h3"] and c.pending() == {"h2"}
    ticket(c.result("h1")).release()
    await settle()
    assert c.order == ["h1", "h3", "h2"]
    for name in ("h2", "h3"):
        ticket(c.result(name)).release()
    assert gate.in_flight == 0 and gate.waiting == 0


async def test_drain_hold_gives_waiters_the_drain_timer_then_a_fresh_queue_timer() -> None:
    gate = Gate(config(max_in_flight=1, max_queue_time=SHORT, drain_max_wait=LONG))
    holder = ticket(await gate.admit(None, "interactive"))
    c = Clients(gate)
    await c.start("queued")
    gate.set_drain(True)  # the queued request is now held and may wait through the drain
    await asyncio.sleep(SHORT * 3)
    assert c.pending() == {"queued"}
    gate.set_drain(False)  # back to max_queue_time, and the slot is still taken
    result = await c.tasks["queued"]
    assert rejection(result).reason == "queue_timeout"
    holder.release()


async def test_drain_timeout() -> None:
    gate = Gate(config(drain_max_wait=SHORT))
    gate.set_drain(True)
    r = rejection(await gate.admit("s", "interactive"))
    assert (r.status, r.reason) == (503, "drain_timeout") and r.retry_after > 0
    assert gate.waiting == 0 and gate.in_flight == 0


async def test_drain_reject_mode() -> None:
    gate = Gate(config(max_in_flight=1, drain_mode="reject"))
    holder = ticket(await gate.admit(None, "interactive"))
    c = Clients(gate)
    await c.start("queued")
    gate.set_drain(True)
    await settle()
    assert rejection(c.result("queued")).status == 503  # held ones are turned away at once
    r = rejection(admit_now(gate))
    assert (r.status, r.reason) == (503, "draining") and r.retry_after > 0
    assert gate.snapshot().rejected_total["draining"] == 2
    holder.release()
    gate.set_drain(False)
    ticket(admit_now(gate)).release()


async def test_breaker_open_expiry_and_close() -> None:
    clock = Clock()
    gate = Gate(config(max_in_flight=1), monotonic=clock)
    holder = ticket(await gate.admit(None, "interactive"))
    c = Clients(gate)
    await c.start("loop-queued", "loopy")
    await c.start("other-queued", "fine")
    gate.open_breaker("loopy", clock.now + 120.0, "tool-call loop")
    await settle()
    assert rejection(c.result("loop-queued")).reason == "session_breaker"  # queued requests are rejected too
    r = rejection(admit_now(gate, "loopy"))
    assert (r.status, r.reason) == (429, "session_breaker")
    assert r.retry_after == pytest.approx(120.0) and "tool-call loop" in r.message and "120 s" in r.message
    assert gate.breakers() == {"loopy": (clock.now + 120.0, "tool-call loop")}
    assert gate.snapshot().breakers_open == ("loopy",)
    holder.release()
    await settle()
    ticket(c.result("other-queued")).release()
    clock.advance(120.0)
    assert gate.breakers() == {}
    ticket(admit_now(gate, "loopy")).release()
    gate.open_breaker("loopy", clock.now + 5, "again")
    gate.open_breaker("past", clock.now - 1, "already over")
    assert set(gate.breakers()) == {"loopy"}
    gate.close_breaker("loopy")
    gate.close_breaker("never-opened")
    ticket(admit_now(gate, "loopy")).release()
    assert gate.snapshot().rejected_total["session_breaker"] == 2


def test_breaker_is_checked_before_rate() -> None:
    clock = Clock()
    gate = Gate(config(sessions=SessionConfig(rate=1.0, burst=1)), monotonic=clock)
    gate.open_breaker("s", clock.now + 10, "loop")
    assert rejection(admit_now(gate, "s")).reason == "session_breaker"
    gate.close_breaker("s")
    ticket(admit_now(gate, "s")).release()  # the breaker did not spend the token


async def test_snapshot_and_recent_queue_time() -> None:
    clock = Clock()
    gate = Gate(config(max_in_flight=1), monotonic=clock)
    assert gate.recent_queue_time() is None
    first = ticket(await gate.admit("s", "interactive"))
    c = Clients(gate)
    await c.start("w", "s", "batch")
    clock.advance(4.0)
    snap = gate.snapshot()
    assert snap.oldest_in_flight_age == 4.0 and snap.queued == {"interactive": 0, "batch": 1}
    assert snap.session_in_flight == {"s": 1} and snap.limit == 1 and snap.ceiling == 1
    first.release()
    await settle()
    waited = ticket(c.result("w"))
    assert waited.queued_seconds == 4.0 and waited.admitted_at == clock.now
    assert gate.recent_queue_time() == pytest.approx(2.0)  # median of 0 and 4
    snap = gate.snapshot()
    assert snap.queue_time.count == 2 and snap.queue_time.sum == 4.0
    assert snap.admitted_total == {"interactive": 1, "batch": 1}
    assert snap.rejected_total["queue_full"] == 0  # every reason is present from the start
    waited.release()
    assert gate.snapshot().oldest_in_flight_age == 0.0
    clock.advance(61.0)
    assert gate.recent_queue_time() is None


async def test_apply_reload() -> None:
    gate = Gate(config(max_in_flight=4))
    gate.apply(config(max_in_flight=8))
    assert (gate.limit, gate.ceiling) == (8, 8)  # unthrottled: the limit follows the ceiling
    gate.set_limit(6)
    gate.apply(config(max_in_flight=10))
    assert (gate.limit, gate.ceiling) == (6, 10)  # throttled: kept
    gate.apply(config(max_in_flight=3))
    assert (gate.limit, gate.ceiling) == (3, 3)  # clamped
    gate.apply(config(max_in_flight=10))
    assert (gate.limit, gate.ceiling) == (3, 10)  # still throttled: the throttle brings it back up
    gate.set_limit(10)
    gate.apply(config(max_in_flight=3))
    held = [ticket(await gate.admit(None, "batch")) for _ in range(3)]
    c = Clients(gate)
    await c.start("b", None, "batch")
    await c.start("i", None, "interactive")
    # New classes: waiters of a class that is gone move to the default class, in arrival order.
    vip = PriorityConfig(classes=("vip", "interactive"), default="interactive")
    gate.apply(config(max_in_flight=3, priority=vip))
    assert gate.snapshot().queued == {"vip": 0, "interactive": 2}
    await c.start("v", None, "vip")
    gate.apply(config(max_in_flight=5, priority=vip))
    await settle()
    assert c.order == ["v", "b"]  # unthrottled: the limit followed the ceiling to 5, two waiters went in
    held[0].release()
    await settle()
    assert c.order == ["v", "b", "i"]
    for t in held[1:]:
        t.release()
    for name in c.order:
        ticket(c.result(name)).release()
    assert gate.in_flight == 0


async def test_apply_switching_to_reject_while_drained_rejects_held() -> None:
    gate = Gate(config())
    gate.set_drain(True)
    c = Clients(gate)
    await c.start("held")
    gate.apply(config(drain_mode="reject"))
    await settle()
    assert rejection(c.result("held")).reason == "draining"


async def test_apply_session_cap_raise_admits_capped_waiter() -> None:
    gate = Gate(config(sessions=SessionConfig(max_in_flight=1)))
    a = ticket(await gate.admit("A", "interactive"))
    c = Clients(gate)
    await c.start("A2", "A")
    gate.apply(config(sessions=SessionConfig(max_in_flight=None)))
    await settle()
    ticket(c.result("A2")).release()
    a.release()
    assert gate.in_flight == 0


async def test_many_clients_never_exceed_limits() -> None:
    gate = Gate(config(max_in_flight=3, max_queue=1000, sessions=SessionConfig(max_in_flight=2)))
    peak = 0
    per_session_peak = 0

    async def client(i: int) -> None:
        nonlocal peak, per_session_peak
        session = "s1" if i % 5 == 0 else "s0"
        result = await gate.admit(session, "batch" if i % 3 else "interactive")
        t = ticket(result)
        peak = max(peak, gate.in_flight)
        per_session_peak = max(per_session_peak, *gate.snapshot().session_in_flight.values())
        await asyncio.sleep(0)
        t.release()

    tasks = [asyncio.create_task(client(i)) for i in range(200)]
    for i in range(0, 200, 7):
        tasks[i].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert sum(isinstance(r, asyncio.CancelledError) for r in results) >= 1
    assert peak == 3 and per_session_peak == 2
    assert gate.in_flight == 0 and gate.waiting == 0 and gate.snapshot().session_in_flight == {}


def test_rejection_is_a_value() -> None:
    r = Rejection(429, "queue_full", "full", 1.0)
    assert r == replace(r) and r.retry_after == 1.0


# -- requests without a session ------------------------------------------------------------------------------


def shared(share: float, **kw: Any) -> GatewayConfig:
    return config(sessions=SessionConfig(anonymous_share=share), **kw)


async def test_requests_without_a_session_hold_at_most_their_share_and_others_pass() -> None:
    gate = Gate(shared(0.5, max_in_flight=4))
    held = [ticket(admit_now(gate)) for _ in range(2)]
    c = Clients(gate)
    await c.start("anon-3")  # a free slot, but requests without a session hold their half
    assert c.pending() == {"anon-3"} and gate.in_flight == 2
    keyed = [ticket(admit_now(gate, f"s{i}")) for i in range(2)]  # a session takes a slot at once
    assert gate.in_flight == 4
    keyed[0].release()  # a slot frees, but requests without a session still hold theirs
    await settle()
    assert c.pending() == {"anon-3"}
    held[0].release()  # one of theirs frees: the waiter takes it
    await settle()
    assert not c.pending() and gate.in_flight == 3
    for t in [*held, *keyed, ticket(c.result("anon-3"))]:
        t.release()
    assert gate.in_flight == 0


async def test_the_share_follows_the_throttled_cap_and_times_out_with_its_own_reason() -> None:
    gate = Gate(shared(0.5, max_in_flight=8, max_queue_time=SHORT))
    gate.set_limit(2)  # half of 2: one slot for requests without a session
    held = ticket(admit_now(gate))
    r = rejection(await gate.admit(None, "interactive"))
    assert (r.status, r.reason) == (429, "anonymous_concurrency") and "anonymous_share" in r.message
    assert gate.snapshot().rejected_total["anonymous_concurrency"] == 1
    gate.set_limit(8)  # four now
    extra = [ticket(admit_now(gate)) for _ in range(3)]
    assert gate.in_flight == 4
    for t in [held, *extra]:
        t.release()


def test_a_share_of_one_lets_requests_without_a_session_take_every_slot() -> None:
    gate = Gate(shared(1.0, max_in_flight=3))
    assert all(isinstance(admit_now(gate), Ticket) for _ in range(3)) and gate.in_flight == 3
    tiny = Gate(shared(0.01, max_in_flight=3))
    assert isinstance(admit_now(tiny), Ticket)  # at least one slot whatever the share
