"""This watchdog's membership of its group: a lease in etcd, renewed every third of its TTL, under which its
member key, its firing key (the disruptive alerts it fires, correlated.py) and its slots live. When the
watchdog dies the lease expires and etcd deletes them.

The session also decides whether etcd is reachable enough to start a disruptive action: only while the last
renewal that succeeded was sent less than a third of the TTL plus two request timeouts ago, and the last
renewal did not fail. A member cut off from the majority cannot renew (its requests time out or fail), so it
refuses within one renewal period, well before its lease can expire and its slot go to another member.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..config.durations import format_duration
from .config import FleetConfig
from .correlated import FIRING, encode_firing
from .etcd import EtcdClient, EtcdError, b64

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionOptions:
    """What a session is wired to: its etcd client, its member name, the clocks and a sleep."""

    client: EtcdClient
    member: str
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep


class Session:
    """One lease, kept alive; the member key under it; whether etcd can be relied on right now."""

    def __init__(self, config: FleetConfig, options: SessionOptions) -> None:
        self.config = config
        self.client = options.client
        self.member = options.member
        self.clock, self.monotonic, self.sleep = options.clock, options.monotonic, options.sleep
        self.lease = 0  # 0: none granted (yet, or since the last one expired)
        self.generation = 0  # bumped for each new lease: slots of an older one are gone
        self.renewed_at: float | None = None  # monotonic send time of the last renewal that succeeded
        self.problem = "not joined yet"
        self.unhealthy_since: float | None = options.monotonic()
        self.details: dict[str, object] = {}  # published in the member key
        self.firing: tuple[str, ...] = ()  # published in the firing key (none while empty)
        self._changed = asyncio.Event()
        self._writing = asyncio.Lock()
        self._stopped = False

    @property
    def prefix(self) -> bytes:
        """The group's keys."""
        return f"{self.config.prefix}/{self.config.group}/".encode()

    @property
    def member_key(self) -> bytes:
        """This member's registration."""
        return self.prefix + b"members/" + self.member.encode()

    @property
    def firing_key(self) -> bytes:
        """The disruptive alerts this member fires (correlated.py)."""
        return self.prefix + FIRING + self.member.encode()

    @property
    def stopped(self) -> bool:
        """Whether aclose() was called."""
        return self._stopped

    @property
    def interval(self) -> float:
        """Seconds between renewals."""
        return self.config.lease_ttl / 3

    def refusal(self) -> str:
        """Why no disruptive action may start now ("" if one may)."""
        if self.problem:
            return f"fleet: etcd cannot be relied on: {self.problem}"
        if self.renewed_at is None:
            return "fleet: no lease in etcd yet"
        age = self.monotonic() - self.renewed_at
        if age > self.interval + 2 * self.config.request_timeout:
            return f"fleet: the lease in etcd was last renewed {format_duration(age)} ago"
        return ""

    def _ok(self, sent: float) -> None:
        extra = {"group": self.config.group, "member": self.member, "lease": self.lease}
        if self.renewed_at is None:
            log.info("joined the fleet group in etcd", extra=extra)
        elif self.problem:
            log.warning("etcd reachable again", extra=extra)
        self.renewed_at = sent
        self.problem = ""
        self.unhealthy_since = None

    def _failed(self, problem: str) -> None:
        if not self.problem or self.unhealthy_since is None:
            log.error("etcd cannot be relied on", extra={"group": self.config.group, "problem": problem})
            self.unhealthy_since = self.monotonic()
        self.problem = problem

    def publish(self, details: dict[str, object]) -> None:
        """New contents for the member key, written at the next renewal."""
        if details != self.details:
            self.details = details
            self._changed.set()

    def publish_firing(self, names: tuple[str, ...]) -> None:
        """The disruptive alerts this member fires now, written at the next renewal (or flush)."""
        if names != self.firing:
            self.firing = names
            self._changed.set()

    async def flush(self) -> None:
        """Write what changed now rather than at the next renewal (a no-op without a lease). EtcdError if etcd
        refuses or is gone."""
        if self.lease and self._changed.is_set():
            await self._write()

    async def _write(self) -> None:
        """The member key and the firing key (deleted while nothing fires), in one transaction."""
        async with self._writing:
            self._changed.clear()
            lease = str(self.lease)
            firing: dict[str, object] = (
                {
                    "request_put": {
                        "key": b64(self.firing_key),
                        "value": b64(encode_firing(self.firing)),
                        "lease": lease,
                    }
                }
                if self.firing
                else {"request_delete_range": {"key": b64(self.firing_key)}}
            )
            member = {"key": b64(self.member_key), "value": b64(self._value()), "lease": lease}
            try:
                await self.client.txn([{"request_put": member}, firing])
            except EtcdError:
                self._changed.set()
                raise

    async def step(self) -> None:
        """One renewal: grant a lease and register if there is none, else renew it (and register again when
        what is published changed). Failures are recorded, never raised."""
        sent = self.monotonic()
        try:
            if self.lease:
                ttl = await self.client.keepalive(self.lease)
                if ttl <= 0:
                    log.error(
                        "the lease in etcd expired: this member's slots are gone",
                        extra={"group": self.config.group, "lease": self.lease},
                    )
                    self.lease = 0
            if not self.lease:
                self.lease, _ = await self.client.grant(int(self.config.lease_ttl))
                self.generation += 1
                self._changed.set()
            if self._changed.is_set():
                await self._write()
        except EtcdError as exc:
            self._failed(str(exc))
            return
        self._ok(sent)

    def _value(self) -> bytes:
        return json.dumps({"member": self.member, "since": self.clock(), **self.details}).encode()

    async def run(self) -> None:
        """Renew until closed; after a failure, try again at the same pace."""
        while not self._stopped:
            await self.step()
            await self.sleep(self.interval)

    async def aclose(self) -> None:
        """Revoke the lease, so that this member's slots and registration go at once (best effort)."""
        self._stopped = True
        if self.lease:
            with contextlib.suppress(EtcdError):
                await self.client.revoke(self.lease)
            self.lease = 0
