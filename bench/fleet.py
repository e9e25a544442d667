"""Benchmark: the fleet's slots in a real 3-member etcd cluster on loopback (tests/support/etcd_cluster.py).

Usage: python bench/fleet.py [-n MEMBERS] [--rounds R] [--restart SECONDS]

Prints, against an anchor measured in the same run (one etcd put through the JSON gateway):
- acquire: a slot taken with no one else in line (the key's put, then one transaction of five reads: the
  slots, the key, the members, the holders and what the group fires);
- release: the slot's key deleted;
- handoff: from a holder's release to the next waiter's grant (its watch wakes it, it reads again);
  each the median and the worst of R rounds;
- the schedule of a fleet-wide restart: MEMBERS FleetBudgets ask at once, each holds its slot for a simulated
  restart of SECONDS, with max_disrupted 1 and 25%: when each started, and the whole restart's length next to
  the ideal (ceil(MEMBERS / slots) restarts one after another).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.etcd_cluster import EtcdCluster
from vllm_watchdog.fleet.budget import FleetBudget, FleetOptions
from vllm_watchdog.fleet.config import FleetConfig, parse_max_disrupted


def _config(endpoints: list[str], group: str, max_disrupted: str = "1") -> FleetConfig:
    return FleetConfig(
        endpoints=tuple(endpoints),
        group=group,
        max_disrupted=parse_max_disrupted(max_disrupted),
        lease_ttl=6,
        request_timeout=2,
        slot_wait=600,
    )


RENEWALS: list[asyncio.Task[None]] = []


async def _members(endpoints: list[str], group: str, n: int, max_disrupted: str = "1") -> list[FleetBudget]:
    """Joined members whose leases renew in the background, as a watchdog's do."""
    members = [FleetBudget(_config(endpoints, group, max_disrupted), FleetOptions(f"m{i}")) for i in range(n)]
    for m in members:
        await m.session.step()
        RENEWALS.append(asyncio.ensure_future(m.run()))
    return members


def _ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:7.2f} ms, worst {max(values) * 1000:7.2f} ms"


async def latencies(endpoints: list[str], rounds: int) -> None:
    """Anchor, acquire, release and handoff."""
    a, b = await _members(endpoints, "bench-latency", 2)
    anchor, acquire, release, handoff = [], [], [], []
    try:
        for i in range(rounds):
            began = time.perf_counter()
            await a.client.put(b"/bench/anchor", str(i).encode())
            anchor.append(time.perf_counter() - began)
            began = time.perf_counter()
            grant = await a.acquire("t", "restart")
            acquire.append(time.perf_counter() - began)
            began = time.perf_counter()
            await a.release(grant)
            release.append(time.perf_counter() - began)
            held = await a.acquire("t", "restart")
            waiter = asyncio.ensure_future(b.acquire("t", "restart"))
            for _ in range(5000):  # until the waiter is in line (bounded), then in its watch
                if "t" in b.waiting:
                    break
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.02)
            released = time.perf_counter()
            await a.release(held)
            second = await waiter
            handoff.append(time.perf_counter() - released)
            await b.release(second)
    finally:
        for m in (a, b):
            await m.aclose()
    print(f"anchor  (one put):      {_ms(anchor)}")
    print(f"acquire (uncontended):  {_ms(acquire)}")
    print(f"release:                {_ms(release)}")
    print(f"handoff (release->grant): {_ms(handoff)}")


async def schedule(endpoints: list[str], n: int, restart: float, max_disrupted: str) -> None:
    """N members restart at once under max_disrupted; when each started."""
    members = await _members(endpoints, f"bench-{max_disrupted.rstrip('%')}", n, max_disrupted)
    starts: list[float] = []
    began = time.perf_counter()

    async def one(m: FleetBudget) -> None:
        grant = await m.acquire("vllm-0", "restart")
        assert not grant.refusal, grant.refusal
        starts.append(time.perf_counter() - began)
        await asyncio.sleep(restart)
        await m.release(grant)

    try:
        await asyncio.gather(*(one(m) for m in members))
    finally:
        for m in members:
            await m.aclose()
    total = time.perf_counter() - began
    slots = members[0].config.max_disrupted.limit(n)
    ideal = math.ceil(n / slots) * restart
    shown = " ".join(f"{s:.2f}" for s in sorted(starts))
    print(
        f"max_disrupted {max_disrupted:>4} ({slots} slot{'s' if slots > 1 else ''} of {n}): "
        f"whole restart {total:6.2f} s, ideal {ideal:6.2f} s (+{(total - ideal) * 1000:.0f} ms); "
        f"starts at [{shown}] s"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=8, help="members restarting at once (default 8)")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument(
        "--restart", type=float, default=1.0, help="seconds a simulated restart holds its slot"
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # "fleet slot taken", once per grant
    with tempfile.TemporaryDirectory(prefix="bench-etcd-") as tmp:
        cluster = EtcdCluster(Path(tmp))
        cluster.start()
        try:
            await latencies(cluster.endpoints, args.rounds)
            for setting in ("1", "25%"):
                await schedule(cluster.endpoints, args.n, args.restart, setting)
        finally:
            for task in RENEWALS:
                task.cancel()
            cluster.stop_all()


if __name__ == "__main__":
    asyncio.run(main())
