"""The disruption budget the remediator asks before a disruptive action: a slot of the group's semaphore in
etcd (FleetBudget), or always yes for a watchdog that decides alone (NO_BUDGET).

The remediator takes a Grant before the action's audit row is written and gives it back when the flow ends,
whatever the outcome. A grant with a refusal means the action must not start: the `fleet` rail.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..notifiers.alert import OutgoingAlert
from .alerts import FleetAlerts
from .config import FleetConfig
from .etcd import EtcdClient, EtcdError
from .semaphore import Semaphore, Slot
from .session import Session, SessionOptions

log = logging.getLogger(__name__)
RAIL = "fleet"
# The action types that take a slot: those that stop the server, and a GPU power limit, which slows it.
BUDGETED = frozenset({"restart", "disable_draft", "enable_draft", "reconfigure", "gpu_power_limit"})


@dataclass
class Grant:
    """A slot taken for one action ("" refusal), or why not; `waited` seconds in line."""

    target: str
    action: str
    refusal: str = ""
    waited: float = 0.0
    slot: Slot | None = field(default=None, repr=False)


class DisruptionBudget(Protocol):
    """What the remediator needs of a disruption budget."""

    async def acquire(self, target: str, action: str) -> Grant:
        """Wait for a slot (bounded); a Grant whose refusal says why when none was given."""
        ...

    async def release(self, grant: Grant) -> None:
        """Give the slot back."""
        ...

    def json(self) -> dict[str, Any]:
        """What the budget holds and waits for, for /api/v1/actions."""
        ...

    def alerts(self, now: float) -> list[OutgoingAlert]:
        """Own alerts to send (or resend, or resolve) now."""
        ...


class NoBudget:
    """A watchdog outside any fleet: every disruptive action may start."""

    async def acquire(self, target: str, action: str) -> Grant:
        """A grant at once."""
        return Grant(target, action)

    async def release(self, grant: Grant) -> None:
        """Nothing to give back."""

    def json(self) -> dict[str, Any]:
        """No fleet."""
        return {"enabled": False}

    def alerts(self, now: float) -> list[OutgoingAlert]:
        """None."""
        return []


NO_BUDGET = NoBudget()


@dataclass(frozen=True)
class FleetOptions:
    """What a FleetBudget is wired to: this member's name, the clocks, a sleep and an HTTP transport."""

    member: str
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    transport: Any | None = None  # an httpx transport (tests); None: the network


class FleetBudget:
    """This member's session in etcd, its slots, and the alerts about them."""

    def __init__(self, config: FleetConfig, options: FleetOptions) -> None:
        self.config = config
        self.client = EtcdClient(config.endpoints, config.http, config.request_timeout, options.transport)
        self.session = Session(
            config,
            SessionOptions(self.client, options.member, options.clock, options.monotonic, options.sleep),
        )
        self.semaphore = Semaphore(self.session)
        self.own_alerts = FleetAlerts(config, options.member)
        self.waiting: dict[str, tuple[str, float]] = {}  # target -> (action, since), wall clock
        self.holding: dict[str, tuple[str, float]] = {}
        self.refusals = 0
        self.lost = 0  # slots whose lease expired while their action ran
        self.acquired_seconds: list[float] = []  # the waits of the last grants (bench, status)
        self._releases: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Keep the lease (until cancelled)."""
        await self.session.run()

    async def acquire(self, target: str, action: str) -> Grant:
        """Write this member's key and wait for it to hold a slot, at most `slot_wait`."""
        s = self.session
        refusal = s.refusal()
        if refusal:
            return self._refused(Grant(target, action, refusal))
        began = s.monotonic()
        try:
            slot = await self.semaphore.write(target, action)
            self.waiting[target] = (action, s.clock())  # in line from here on
            held, why, standing = await self.semaphore.acquire(slot, began + self.config.slot_wait)
        except EtcdError as exc:
            return self._refused(Grant(target, action, f"fleet: etcd cannot be relied on: {exc}"))
        finally:
            self.waiting.pop(target, None)
        waited = s.monotonic() - began
        if not held:
            return self._refused(Grant(target, action, why, waited))
        self.holding[target] = (action, s.clock())
        self.acquired_seconds = [*self.acquired_seconds[-63:], waited]
        log.warning(
            "fleet slot taken",
            extra={
                "target": target,
                "action": action,
                "waited": round(waited, 3),
                "slots": standing.limit if standing else None,
                "live_members": standing.live if standing else None,
            },
        )
        return Grant(target, action, "", waited, slot)

    def _refused(self, grant: Grant) -> Grant:
        self.refusals += 1
        return grant

    async def release(self, grant: Grant) -> None:
        """Delete the slot key; if etcd cannot be told now, keep trying in the background until the key is
        deleted or its lease is gone (which frees it anyway)."""
        self.holding.pop(grant.target, None)
        slot = grant.slot
        if slot is None:
            return
        if slot.generation != self.session.generation:
            self.lost += 1
            log.error(
                "the fleet slot was lost while the action ran: the lease expired (etcd cut off)",
                extra={"target": grant.target, "action": grant.action},
            )
            return
        if not await self.semaphore.release(slot):
            task = asyncio.get_running_loop().create_task(self._release_later(slot))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    async def _release_later(self, slot: Slot) -> None:
        while slot.generation == self.session.generation and not await self.semaphore.release(slot):
            await self.session.sleep(self.session.interval)

    def json(self) -> dict[str, Any]:
        """The group, this member, etcd's health, and what waits for or holds a slot here."""
        s = self.session
        return {
            "enabled": True,
            "group": self.config.group,
            "member": s.member,
            "max_disrupted": str(self.config.max_disrupted),
            "refusal": s.refusal(),
            "lease": s.lease,
            "waiting": {t: {"action": a, "since": at} for t, (a, at) in self.waiting.items()},
            "holding": {t: {"action": a, "since": at} for t, (a, at) in self.holding.items()},
            "refusals": self.refusals,
            "lost": self.lost,
            "alerts": [
                {"labels": dict(a.labels), "annotations": dict(a.annotations), "startsAt": a.starts_at}
                for a in self.own_alerts.firing.values()
            ],
        }

    def alerts(self, now: float) -> list[OutgoingAlert]:
        """The unreachable alert: firing while etcd cannot be relied on, resolved once it can."""
        s = self.session
        since = s.unhealthy_since
        down = since is not None and s.monotonic() - since >= s.interval
        return self.own_alerts.unreachable(down, s.problem or s.refusal(), now)

    async def aclose(self) -> None:
        """Stop renewing and revoke the lease (its slots and membership go with it)."""
        for task in list(self._releases):
            task.cancel()
        await self.session.aclose()
        await self.client.aclose()
