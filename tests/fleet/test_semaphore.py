"""The group's slots in a real etcd cluster, asked by FleetBudgets in this process (no watchdog processes):
order and limits, bounded waits, cancelled waiters, expired leases; and the session's judgement of etcd with
an injected clock, where etcd is unreachable through a transport that fails every connection."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from tests.support.clock import Clock
from tests.support.etcd_cluster import EtcdCluster
from vllm_watchdog.fleet.alerts import RESEND, UNREACHABLE
from vllm_watchdog.fleet.budget import FleetBudget, FleetOptions
from vllm_watchdog.fleet.config import FleetConfig, parse_max_disrupted
from vllm_watchdog.fleet.etcd import range_request

pytestmark = pytest.mark.anyio
LIMIT = 30.0  # bound on each wait; never asserted on
_groups = itertools.count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def members(etcd_cluster: EtcdCluster) -> AsyncIterator[Callable[..., FleetBudget]]:
    """Makes joined members of a fresh group whose leases renew in the background, as a watchdog's do:
    `members(name, max_disrupted=..., slot_wait=..., lease_ttl=..., renew=..., correlated_share=...)`."""
    made: list[FleetBudget] = []
    renewals: list[asyncio.Task[None]] = []
    group = f"unit-{next(_groups)}"

    async def make(
        name: str,
        max_disrupted: str = "1",
        slot_wait: float = 30.0,
        # 10 s: a lease renewed every 3.3 s stays trusted through the seconds a loaded CI starves the test's
        # loop (CI: "last renewed 5s768ms ago" with 3 s); the tests of expiry pass their own, shorter one
        lease_ttl: float = 10,
        renew: bool = True,
        correlated_share: float | None = None,
    ) -> FleetBudget:
        cfg = FleetConfig(
            endpoints=tuple(etcd_cluster.endpoints),
            group=group,
            max_disrupted=parse_max_disrupted(max_disrupted),
            lease_ttl=lease_ttl,
            request_timeout=lease_ttl / 3,
            slot_wait=slot_wait,
            correlated_share=correlated_share,
        )
        budget = FleetBudget(cfg, FleetOptions(name))
        await budget.session.step()
        assert budget.session.refusal() == ""
        made.append(budget)
        if renew:
            renewals.append(asyncio.ensure_future(budget.run()))
        return budget

    yield make  # type: ignore[misc]
    for task in renewals:
        task.cancel()
    for budget in made:
        await budget.aclose()


async def _until(pred: Callable[[], bool]) -> None:
    for _ in range(int(LIMIT / 0.01)):
        if pred():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


async def _slot_keys(budget: FleetBudget) -> list[bytes]:
    found = await budget.client.get_prefix(budget.semaphore.slots_prefix)
    return [kv.key for kv in found.kvs]


async def test_one_slot_goes_to_one_member_at_a_time_in_the_order_they_asked(
    members: Callable[..., FleetBudget],
) -> None:
    group = [await members(f"m{i}") for i in range(4)]  # type: ignore[misc]
    active, peak, order = 0, 0, []

    async def restart(i: int) -> None:
        nonlocal active, peak
        if i:  # they ask in this order: each once the one before is in line (its key written) or holds
            await _until(lambda: f"t{i - 1}" in group[i - 1].waiting or i - 1 in order)
        grant = await group[i].acquire(f"t{i}", "restart")
        assert grant.refusal == ""
        active += 1
        peak = max(peak, active)
        order.append(i)
        await asyncio.sleep(0.1)
        active -= 1
        await group[i].release(grant)

    await asyncio.wait_for(asyncio.gather(*(restart(i) for i in range(4))), LIMIT)
    assert (peak, order) == (1, [0, 1, 2, 3])
    assert await _slot_keys(group[0]) == []


async def test_a_percentage_counts_the_live_members(members: Callable[..., FleetBudget]) -> None:
    group = [await members(f"m{i}", max_disrupted="50%") for i in range(4)]  # type: ignore[misc]
    first = [await group[i].acquire("t", "restart") for i in range(2)]
    assert [g.refusal for g in first] == ["", ""]  # 50% of 4 live members: 2 slots
    waiter = asyncio.ensure_future(group[2].acquire("t", "restart"))
    await _until(lambda: "t" in group[2].waiting)  # in line
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await group[0].release(first[0])
    third = await asyncio.wait_for(waiter, LIMIT)
    assert third.refusal == "" and third.waited > 0
    for grant, budget in ((first[1], group[1]), (third, group[2])):
        await budget.release(grant)


async def test_a_waiter_is_refused_after_slot_wait_naming_the_holder_and_leaves_no_key(
    members: Callable[..., FleetBudget],
) -> None:
    holder = await members("holder")  # type: ignore[misc]
    waiter = await members("waiter", slot_wait=0.5)  # type: ignore[misc]
    held = await holder.acquire("vllm-0", "restart")
    refused = await asyncio.wait_for(waiter.acquire("vllm-1", "disable_draft"), LIMIT)
    assert refused.refusal.startswith("fleet: waited 500ms for one of 1 slots"), refused
    assert "held by holder/vllm-0 (restart)" in refused.refusal and "number 2 in line" in refused.refusal
    assert held.slot is not None and await _slot_keys(holder) == [held.slot.key]  # the waiter's key is gone
    assert waiter.refusals == {"fleet": 1} and waiter.waiting == {}


async def test_a_cancelled_waiter_takes_its_key_out_of_line(members: Callable[..., FleetBudget]) -> None:
    holder, waiter = await members("a"), await members("b")  # type: ignore[misc]
    held = await holder.acquire("t", "restart")
    task = asyncio.ensure_future(waiter.acquire("t", "restart"))
    await _until(lambda: "t" in waiter.waiting)
    assert len(await _slot_keys(holder)) == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert held.slot is not None and await _slot_keys(holder) == [held.slot.key]


async def test_a_dead_members_slot_frees_when_its_lease_expires(members: Callable[..., FleetBudget]) -> None:
    dead = await members("dead", lease_ttl=2, renew=False)  # type: ignore[misc]
    alive = await members("alive", lease_ttl=2)  # type: ignore[misc]
    assert (await dead.acquire("t", "restart")).refusal == ""
    # `dead` never renews again, as a watchdog killed with SIGKILL: etcd deletes its keys after 2 s.
    grant = await asyncio.wait_for(alive.acquire("t", "restart"), LIMIT)
    assert grant.refusal == ""
    members_left = await alive.client.get_prefix(alive.session.prefix + b"members/")
    assert [kv.key.rsplit(b"/", 1)[1] for kv in members_left.kvs] == [b"alive"]


async def test_an_expired_lease_is_replaced_and_counts_the_slot_lost(
    members: Callable[..., FleetBudget],
) -> None:
    member = await members("m", renew=False)  # type: ignore[misc]
    grant = await member.acquire("t", "restart")
    await member.client.revoke(member.session.lease)  # as if etcd let it expire while cut off
    await member.session.step()
    assert member.session.generation == 2 and member.session.refusal() == ""
    await member.release(grant)
    assert member.lost == 1


async def test_a_correlated_fault_holds_every_member_and_waiters_until_it_falls_back(
    members: Callable[..., FleetBudget],
) -> None:
    a, b, c, d = [await members(f"m{i}", correlated_share=0.5) for i in range(4)]  # type: ignore[misc]
    held = await d.acquire("t", "restart")  # d restarts: the others wait in line behind it
    a.note_alert("Hung", "vllm-0", True, until=1e12, now=0.0)
    waiting = asyncio.ensure_future(a.acquire("vllm-0", "restart"))
    await _until(lambda: "vllm-0" in a.waiting)
    assert a.session.firing == ("Hung",)  # published before it asked for a slot
    b.note_alert("Hung", "vllm-1", True, until=1e12, now=0.0)
    c.note_alert("Hung", "vllm-2", True, until=1e12, now=0.0)
    await asyncio.wait_for(_publish_now(b, c), LIMIT)
    refused = await asyncio.wait_for(waiting, LIMIT)  # 3 of 4 > half: out of line at once, not after d
    assert refused.rail == "fleet_hold" and refused.slot is None
    assert refused.refusal.startswith("fleet_hold: 3 of 4 live members of group unit-")
    assert "fire Hung (m0, m1, m2), more than correlated_share 50%" in refused.refusal
    assert held.slot is not None and await _slot_keys(a) == [held.slot.key]  # the waiter's key is gone
    await d.release(held)
    assert (await d.acquire("t", "restart")).rail == "fleet_hold"  # group-wide: d fires nothing itself
    await _until(lambda: bool(d.holds()))  # its background read of the group saw it too
    (alert,) = [x for x in d.alerts(0.0) if x.labels.get("fault")]
    assert (alert.state, alert.annotations["members"]) == ("firing", "m0, m1, m2")
    assert d.refusals == {"fleet_hold": 1} and a.refusals == {"fleet_hold": 1}
    b.note_alert("Hung", "vllm-1", False, until=0.0, now=1.0)
    c.note_alert("Hung", "vllm-2", False, until=0.0, now=1.0)
    await asyncio.wait_for(_publish_now(b, c), LIMIT)
    await _until(lambda: not d.holds())  # 1 of 4 fires it now: the hold ends
    (resolved,) = [x for x in d.alerts(1.0) if x.labels.get("fault")]
    assert resolved.state == "resolved"
    grant = await asyncio.wait_for(a.acquire("vllm-0", "restart"), LIMIT)
    assert grant.refusal == ""
    await a.release(grant)


async def _publish_now(*budgets: FleetBudget) -> None:
    """Write what each budget fires now, rather than at its next renewal."""
    for budget in budgets:
        await budget.session.flush()


def _unreachable(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


async def test_unreachable_etcd_refuses_at_once_alerts_after_a_renewal_period_and_resolves() -> None:
    clock = Clock()
    cfg = FleetConfig(endpoints=("http://127.0.0.1:9",), lease_ttl=6, request_timeout=1)
    budget = FleetBudget(
        cfg,
        FleetOptions(
            "m0", clock=clock, monotonic=clock.monotonic, transport=httpx.MockTransport(_unreachable)
        ),
    )
    try:
        await budget.session.step()
        grant = await budget.acquire("vllm-0", "restart")
        assert grant.refusal.startswith("fleet: etcd cannot be relied on: no etcd endpoint answered"), grant
        assert budget.alerts(clock()) == []  # not for one failed renewal
        clock.advance(cfg.lease_ttl / 3)
        (fired,) = budget.alerts(clock())
        assert (fired.state, fired.labels["alertname"], fired.labels["member"]) == (
            "firing",
            UNREACHABLE,
            "m0",
        )
        clock.advance(RESEND - 1)
        assert budget.alerts(clock()) == []
        clock.advance(1)
        assert [a.state for a in budget.alerts(clock())] == ["firing"]  # resent
        budget.session._ok(clock.monotonic())  # a renewal went through
        assert [a.state for a in budget.alerts(clock())] == ["resolved"]
        assert budget.alerts(clock()) == []
    finally:
        await budget.aclose()


async def test_a_renewal_that_is_late_refuses_before_the_lease_can_expire(etcd_cluster: EtcdCluster) -> None:
    clock = Clock()
    cfg = FleetConfig(endpoints=tuple(etcd_cluster.endpoints), group="late", lease_ttl=9, request_timeout=1)
    budget = FleetBudget(cfg, FleetOptions("m0", clock=clock, monotonic=clock.monotonic))
    try:
        await budget.session.step()
        assert budget.session.refusal() == ""
        clock.advance(cfg.lease_ttl / 3 + 2 * cfg.request_timeout)
        assert budget.session.refusal() == ""
        clock.advance(0.01)  # the renewal loop is stuck: refuse, with a third of the TTL still to go
        assert budget.session.refusal().startswith("fleet: the lease in etcd was last renewed 5s10ms ago")
        assert (await budget.acquire("t", "restart")).refusal
        keys = await budget.client.call(
            "kv/range", range_request(budget.semaphore.slots_prefix, count_only=True)
        )
        assert int(keys.get("count", 0)) == 0  # refused before any key was written
    finally:
        await budget.aclose()
