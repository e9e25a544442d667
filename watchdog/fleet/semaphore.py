"""The group's disruption slots: a semaphore in etcd whose waiters are keys under the member's lease.

To take a slot a member writes `<prefix>/<group>/slots/<member>/<target>/<nonce>` under its lease; etcd gives
the key a create revision no other key has. The member holds a slot while its key is among the first N keys
under `slots/` by create revision, N being `max_disrupted` of the live members (their keys under `members/`).
One transaction reads, at one revision: the slot keys oldest first (names only, at most MAX_LINE), whether
ours still exists, how many members are registered, the oldest keys' values (to say who holds) and what the
group fires (correlated.py: while a correlated fault holds the group, the waiter is refused at once). Reads
are linearizable and a key's create revision never changes, while every later key gets a higher one: a key
among the first N stays there until it is deleted, so at any revision at most N keys hold a slot, whichever
member asks and whatever etcd member answers, across leader changes. A waiter's key is deleted when it gives
up or is cancelled, and by etcd when its lease expires.

A waiter that does not hold waits for a change under `slots/` (a watch, at most a third of the lease TTL, then
it reads again), until `slot_wait` has passed: then it deletes its key and is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config.durations import format_duration
from .config import FleetConfig
from .correlated import Hold, View, firing_request, members_count_request, parse_view
from .etcd import EtcdError, b64, parse_range, range_request
from .session import Session

log = logging.getLogger(__name__)
SHOWN_HOLDERS = 8  # holders named in a refusal or a status
MAX_LINE = 1024  # slot keys read to find one's place; a key further back holds none (limits stop below)
MIN_WAIT = 0.05  # a watch that ends at once (an error) is not retried sooner than this
RETRY = 0.5  # a waiter whose read failed reads again this soon


@dataclass(frozen=True)
class Slot:
    """A slot key this member wrote, and the lease generation it lives under."""

    key: bytes
    revision: int
    generation: int  # the session's lease generation it was written under


@dataclass(frozen=True)
class Standing:
    """What one read of the semaphore found, at one revision."""

    revision: int
    rank: int  # 1 for the oldest key
    exists: bool
    live: int
    limit: int
    holders: tuple[str, ...]  # "member/target (action)" of the oldest keys, at most SHOWN_HOLDERS
    view: View  # what the group fires, at the same revision

    @property
    def holds(self) -> bool:
        """Whether the key is among the first `limit`."""
        return self.exists and self.rank <= self.limit


@dataclass(frozen=True)
class Waited:
    """How a wait for a slot ended: held, or refused (why, and the correlated fault if that was the cause)."""

    held: bool
    why: str = ""
    standing: Standing | None = None
    hold: Hold | None = None


def describe_holder(value: bytes) -> str:
    """ "member/target (action)" from a slot key's value; what could be read of it."""
    try:
        data = json.loads(value)
        return f"{data['member']}/{data['target']} ({data['action']})"
    except (ValueError, KeyError, TypeError):
        return "?"


class Semaphore:
    """Acquire and release this member's slots in its group."""

    def __init__(self, session: Session) -> None:
        self.session = session

    @property
    def config(self) -> FleetConfig:
        """The session's (a reload may change the budget's numbers)."""
        return self.session.config

    @property
    def slots_prefix(self) -> bytes:
        """Every slot key of the group."""
        return self.session.prefix + b"slots/"

    async def write(self, target: str, action: str) -> Slot:
        """Queue for a slot: write this member's key under its lease. EtcdError if etcd refuses or is gone."""
        s = self.session
        nonce = secrets.token_hex(6)
        key = self.slots_prefix + f"{s.member}/{target}/{nonce}".encode()
        value = {"member": s.member, "target": target, "action": action, "since": s.clock()}
        revision = await s.client.put(key, json.dumps(value).encode(), s.lease)
        return Slot(key, revision, s.generation)

    async def standing(self, slot: Slot) -> Standing:
        """Where `slot` stands now (one linearizable transaction)."""
        ahead = range_request(self.slots_prefix, limit=MAX_LINE, by_create=True, keys_only=True)
        oldest = range_request(self.slots_prefix, limit=SHOWN_HOLDERS, by_create=True)
        prefix = self.session.prefix
        revision, responses = await self.session.client.txn(
            [
                {"request_range": ahead},
                {"request_range": {"key": b64(slot.key)}},
                {"request_range": members_count_request(prefix)},
                {"request_range": oldest},
                {"request_range": firing_request(prefix)},
            ]
        )
        ranges = [parse_range(_range_of(r), revision) for r in responses]
        if len(ranges) != 5:
            raise EtcdError(f"a transaction of 5 reads answered {len(ranges)}")
        live = ranges[2].count
        limit = min(self.config.max_disrupted.limit(live), MAX_LINE)
        holders = tuple(describe_holder(kv.value) for kv in ranges[3].kvs[:limit])
        line = [kv.key for kv in ranges[0].kvs]
        rank = line.index(slot.key) + 1 if slot.key in line else MAX_LINE + 1
        view = parse_view(revision, ranges[2], ranges[4])
        return Standing(revision, rank, bool(ranges[1].kvs), live, limit, holders, view)

    async def acquire(self, slot: Slot, deadline: float) -> Waited:
        """Wait until `slot` holds, or refuse: at `deadline` (monotonic), once the key is gone (its lease
        expired), or at once while a correlated fault holds the group. A slot is held only when read from
        etcd while the session is sound and no fault holds; a read that fails in between (a leader election,
        an outage) keeps the place in line: etcd keeps the key for as long as the lease lives, and a new
        leader renews every lease. The key is deleted on refusal and cancel."""
        s = self.session
        last: Standing | None = None
        held = False
        problem = ""
        try:
            while True:
                if s.generation != slot.generation:
                    return Waited(False, "fleet: the lease expired while waiting for a slot", last)
                try:
                    last = await self.standing(slot)
                    problem = s.refusal()
                except EtcdError as exc:
                    problem = f"fleet: etcd cannot be relied on: {exc}"
                if last is not None and not problem:
                    holds = last.view.holds(self.config.correlated_share)
                    if holds:
                        return Waited(False, holds[0].reason(self.config.group), last, holds[0])
                    if last.holds:
                        held = True
                        return Waited(True, "", last)
                    if not last.exists:
                        return Waited(
                            False, "fleet: the slot key vanished (its lease expired) while waiting", last
                        )
                remaining = deadline - s.monotonic()
                if remaining <= 0:
                    return Waited(False, problem or self._timed_out(last), last)
                began = s.monotonic()
                wait = min(remaining, s.interval)
                if problem:
                    await s.sleep(min(wait, RETRY))
                else:
                    assert last is not None
                    await s.client.watch_once(self.slots_prefix, last.revision, wait)
                if s.monotonic() - began < MIN_WAIT:
                    await s.sleep(MIN_WAIT)
        finally:
            if not held:
                await self._forget(slot)

    def _timed_out(self, standing: Standing | None) -> str:
        c = self.config
        if standing is None:
            return f"fleet: waited {format_duration(c.slot_wait)} for a slot; etcd never answered"
        return (
            f"fleet: waited {format_duration(c.slot_wait)} for one of {standing.limit} slots of group "
            f"{c.group} ({standing.live} live members, max_disrupted {c.max_disrupted}); "
            f"number {standing.rank} in line; held by {', '.join(standing.holders) or 'nobody'}"
        )

    async def release(self, slot: Slot) -> bool:
        """Give a slot back; False if etcd could not be told (the lease's expiry frees it)."""
        try:
            await self.session.client.delete(slot.key)
        except EtcdError as exc:
            log.warning("could not release a fleet slot", extra={"key": slot.key.decode(), "error": str(exc)})
            return False
        return True

    async def _forget(self, slot: Slot) -> None:
        """Delete a waiter's key, even while the waiting task is being cancelled."""
        task = asyncio.ensure_future(self.release(slot))
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)


def _range_of(response: Mapping[str, Any]) -> Mapping[str, Any]:
    found = response.get("response_range")
    return found if isinstance(found, Mapping) else {}
