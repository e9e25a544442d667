"""The group's disruption slots: a semaphore in etcd whose waiters are keys under the member's lease.

To take a slot a member writes `<prefix>/<group>/slots/<member>/<target>/<nonce>` under its lease; etcd gives
the key a create revision no other key has. The member holds a slot while its key is among the first N keys
under `slots/` by create revision, N being `max_disrupted` of the live members (their keys under `members/`).
One transaction reads, at one revision: the slot keys oldest first (names only, at most MAX_LINE), whether
ours still exists, how many members are registered, and the oldest keys' values (to say who holds). Reads
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

    @property
    def holds(self) -> bool:
        """Whether the key is among the first `limit`."""
        return self.exists and self.rank <= self.limit


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
        self.config = session.config

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
        members = range_request(self.session.prefix + b"members/", count_only=True)
        revision, responses = await self.session.client.txn(
            [
                {"request_range": ahead},
                {"request_range": {"key": b64(slot.key)}},
                {"request_range": members},
                {"request_range": oldest},
            ]
        )
        ranges = [parse_range(_range_of(r), revision) for r in responses]
        if len(ranges) != 4:
            raise EtcdError(f"a transaction of 4 reads answered {len(ranges)}")
        live = ranges[2].count
        limit = min(self.config.max_disrupted.limit(live), MAX_LINE)
        holders = tuple(describe_holder(kv.value) for kv in ranges[3].kvs[:limit])
        line = [kv.key for kv in ranges[0].kvs]
        rank = line.index(slot.key) + 1 if slot.key in line else MAX_LINE + 1
        return Standing(revision, rank, bool(ranges[1].kvs), live, limit, holders)

    async def acquire(self, slot: Slot, deadline: float) -> tuple[bool, str, Standing | None]:
        """Wait until `slot` holds (True, "", its standing), or refuse (False, why, the last standing): at
        `deadline` (monotonic), or once the key is gone (its lease expired). A slot is held only when read
        from etcd while the session is sound; a read that fails in between (a leader election, an outage)
        keeps the place in line: etcd keeps the key for as long as the lease lives, and a new leader renews
        every lease. The key is deleted on refusal and cancel."""
        s = self.session
        last: Standing | None = None
        held = False
        problem = ""
        try:
            while True:
                if s.generation != slot.generation:
                    return False, "fleet: the lease expired while waiting for a slot", last
                try:
                    last = await self.standing(slot)
                    problem = s.refusal()
                except EtcdError as exc:
                    problem = f"fleet: etcd cannot be relied on: {exc}"
                if last is not None and not problem:
                    if last.holds:
                        held = True
                        return True, "", last
                    if not last.exists:
                        return False, "fleet: the slot key vanished (its lease expired) while waiting", last
                remaining = deadline - s.monotonic()
                if remaining <= 0:
                    return False, problem or self._timed_out(last), last
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
