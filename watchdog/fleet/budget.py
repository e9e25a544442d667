"""The disruption budget the remediator asks before a disruptive action: a slot of the group's semaphore in
etcd (FleetBudget), or always yes for a watchdog that decides alone (NO_BUDGET).

The remediator takes a Grant before the action's audit row is written and gives it back when the flow ends,
whatever the outcome. A grant with a refusal means the action must not start: the `fleet` rail, or the
`fleet_hold` rail while a correlated fault holds the group (correlated.py). The remediator also tells the
budget which disruptive alerts fire here, which this member publishes for the group to count.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..notifiers.alert import OutgoingAlert
from .alerts import FleetAlerts
from .config import FleetConfig
from .correlated import FIRING_HOLD, HOLD_RAIL, FiringAlerts, Hold, View, read_view
from .etcd import EtcdClient, EtcdError
from .members import read_members
from .semaphore import Semaphore, Slot
from .session import Session, SessionOptions

log = logging.getLogger(__name__)
RAIL = "fleet"
RELOADABLE = ("max_disrupted", "slot_wait", "correlated_share")  # read at each decision; the rest: restart
GROUP_CACHE = 1.0  # seconds one read of the member keys answers /api/v1/fleet (any local client may ask)


@dataclass
class Grant:
    """A slot taken for one action ("" refusal), or why not (and on which rail); `waited` seconds in line."""

    target: str
    action: str
    refusal: str = ""
    waited: float = 0.0
    slot: Slot | None = field(default=None, repr=False)
    rail: str = RAIL


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

    def note_alert(self, alertname: str, target: str, firing: bool, until: float, now: float) -> None:
        """An alert routed to a disruptive action fired here (until `until`, wall clock) or resolved."""
        ...

    def retired(self, target: str, now: float) -> None:
        """`target` left the config: its alerts no longer count."""
        ...

    async def group(self) -> dict[str, Any]:
        """The group as etcd has it now, for /api/v1/fleet; {"enabled": False} outside a fleet."""
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

    def note_alert(self, alertname: str, target: str, firing: bool, until: float, now: float) -> None:
        """Nobody to tell."""

    def retired(self, target: str, now: float) -> None:
        """Nothing counted."""

    async def group(self) -> dict[str, Any]:
        """No fleet."""
        return {"enabled": False}


NO_BUDGET = NoBudget()


def note_routed(
    budget: DisruptionBudget, alert: OutgoingAlert, target: str, takes_slot: bool, now: float
) -> None:
    """Tell the budget about an alert on `target`, if it routes to an action that takes a slot (the caller
    asks the actions' kinds): it fires (until its end, or FIRING_HOLD from now without one) or resolved."""
    alertname = alert.labels.get("alertname", "")
    if alertname and takes_slot:
        until = alert.ends_at if alert.ends_at > now else now + FIRING_HOLD
        budget.note_alert(alertname, target, alert.state == "firing", until, now)


@dataclass(frozen=True)
class FleetOptions:
    """What a FleetBudget is wired to: this member's name, the clocks, a sleep and an HTTP transport."""

    member: str
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    transport: Any | None = None  # an httpx transport (tests); None: the network
    runbook_base: str = ""  # where the fleet alerts' runbook_url points (the config's, at start)


class FleetBudget:
    """This member's session in etcd, its slots, what it and the group fire, and the alerts about them."""

    def __init__(self, config: FleetConfig, options: FleetOptions) -> None:
        self.config = config
        self.client = EtcdClient(config.endpoints, config.http, config.request_timeout, options.transport)
        self.session = Session(
            config,
            SessionOptions(self.client, options.member, options.clock, options.monotonic, options.sleep),
        )
        self.semaphore = Semaphore(self.session)
        self.own_alerts = FleetAlerts(config, options.member, options.runbook_base)
        self.waiting: dict[str, tuple[str, float]] = {}  # target -> (action, since), wall clock
        self.holding: dict[str, tuple[str, float]] = {}
        self.refusals: Counter[str] = Counter()  # by rail
        self.lost = 0  # slots whose lease expired while their action ran
        self.acquired_seconds: list[float] = []  # the waits of the last grants (bench, status)
        self.firing = FiringAlerts()
        self.view = View()  # what the group fires, by the newest read
        self.view_at: float | None = None  # monotonic time of that read
        self._group: tuple[float, list[dict[str, Any]] | EtcdError] | None = None  # /api/v1/fleet's last read
        self._group_lock = asyncio.Lock()
        self._releases: set[asyncio.Task[None]] = set()

    def apply(self, config: FleetConfig) -> bool:
        """A reloaded `fleet:` section: its RELOADABLE keys take effect at the next decision. False (and
        nothing changed) when anything else differs: that needs a restart."""
        if replace(config, **{k: getattr(self.config, k) for k in RELOADABLE}) != self.config:
            return False
        self.config = self.session.config = config
        return True

    async def run(self) -> None:
        """Keep the lease, and read what the group fires every renewal period (until cancelled)."""
        await asyncio.gather(self.session.run(), self._watch())

    async def _watch(self) -> None:
        s = self.session
        while not s.stopped:
            if s.lease:
                try:
                    self._seen(await read_view(self.client, s.prefix))
                except EtcdError as exc:
                    log.debug("could not read what the fleet fires", extra={"error": str(exc)})
            await s.sleep(s.interval)

    def _seen(self, view: View) -> None:
        if view.revision >= self.view.revision:
            self.view, self.view_at = view, self.session.monotonic()

    def holds(self) -> tuple[Hold, ...]:
        """The correlated faults that hold the group by the newest read, if it is at most a lease TTL old (an
        older one says nothing: etcd cannot be read, and the `fleet` rail refuses anyway)."""
        at = self.view_at
        if at is None or self.session.monotonic() - at > self.config.lease_ttl:
            return ()
        return self.view.holds(self.config.correlated_share)

    def note_alert(self, alertname: str, target: str, firing: bool, until: float, now: float) -> None:
        """Track a disruptive alert of this member; what fires is published at the next renewal, or at once
        when this member asks for a slot."""
        self.firing.note(alertname, target, firing, until)
        self.session.publish_firing(self.firing.names(now))

    def retired(self, target: str, now: float) -> None:
        """`target` left the config (a reload, discovery): its alerts no longer count, though their resolution
        (about a target this member no longer has) never comes."""
        self.firing.forget(target)
        self.session.publish_firing(self.firing.names(now))

    def publish(self, details: dict[str, object], now: float) -> None:
        """What this member shows the fleet (its member key), and the disruptive alerts it fires at `now`."""
        self.session.publish(details)
        self.session.publish_firing(self.firing.names(now))

    async def acquire(self, target: str, action: str) -> Grant:
        """Publish what fires here, write this member's key and wait for it to hold a slot, at most
        `slot_wait`; refused at once while a correlated fault holds the group."""
        s = self.session
        refusal = s.refusal()
        if refusal:
            return self._refused(Grant(target, action, refusal))
        began = s.monotonic()
        try:
            s.publish_firing(self.firing.names(s.clock()))
            await s.flush()  # this member's own alert counts before it asks for a slot
            slot = await self.semaphore.write(target, action)
            self.waiting[target] = (action, s.clock())  # in line from here on
            waited = await self.semaphore.acquire(slot, began + self.config.slot_wait)
        except EtcdError as exc:
            return self._refused(Grant(target, action, f"fleet: etcd cannot be relied on: {exc}"))
        finally:
            self.waiting.pop(target, None)
        standing = waited.standing
        if standing is not None:
            self._seen(standing.view)
        seconds = s.monotonic() - began
        if not waited.held:
            rail = HOLD_RAIL if waited.hold is not None else RAIL
            return self._refused(Grant(target, action, waited.why, seconds, rail=rail))
        self.holding[target] = (action, s.clock())
        self.acquired_seconds = [*self.acquired_seconds[-63:], seconds]
        log.warning(
            "fleet slot taken",
            extra={
                "target": target,
                "action": action,
                "waited": round(seconds, 3),
                "slots": standing.limit if standing else None,
                "live_members": standing.live if standing else None,
            },
        )
        return Grant(target, action, "", seconds, slot)

    def _refused(self, grant: Grant) -> Grant:
        self.refusals[grant.rail] += 1
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
        """The group, this member, etcd's health, what waits for or holds a slot here, and the holds."""
        s, c = self.session, self.config
        return {
            "enabled": True,
            "group": c.group,
            "member": s.member,
            "max_disrupted": str(c.max_disrupted),
            "correlated_share": c.correlated_share,
            "refusal": s.refusal(),
            "lease": s.lease,
            "waiting": {t: {"action": a, "since": at} for t, (a, at) in self.waiting.items()},
            "holding": {t: {"action": a, "since": at} for t, (a, at) in self.holding.items()},
            "firing": list(s.firing),
            "holds": [
                {"alertname": h.alertname, "members": list(h.members), "live": h.live} for h in self.holds()
            ],
            "refusals": sum(self.refusals.values()),
            "refusals_by_rail": dict(self.refusals),
            "lost": self.lost,
            "alerts": [
                {"labels": dict(a.labels), "annotations": dict(a.annotations), "startsAt": a.starts_at}
                for a in self.own_alerts.firing.values()
            ],
        }

    def alerts(self, now: float) -> list[OutgoingAlert]:
        """The unreachable alert (firing while etcd cannot be relied on, resolved once it can), and one per
        correlated fault that holds the group (resolved once it falls back)."""
        s = self.session
        since = s.unhealthy_since
        down = since is not None and s.monotonic() - since >= s.interval
        out = self.own_alerts.unreachable(down, s.problem or s.refusal(), now)
        return out + self.own_alerts.correlated(self.holds(), now)

    async def group(self) -> dict[str, Any]:
        """Every member's key (targets, firing alerts, running and waiting actions), read at most once per
        GROUP_CACHE seconds, with this member's status. EtcdError if etcd cannot be read."""
        async with self._group_lock:
            cached = self._group
            if cached is None or not 0 <= self.session.monotonic() - cached[0] < GROUP_CACHE:
                members: list[dict[str, Any]] | EtcdError
                try:
                    members = await read_members(self.client, self.session.prefix)
                except EtcdError as exc:
                    members = exc
                cached = self._group = (self.session.monotonic(), members)
        if isinstance(cached[1], EtcdError):
            raise cached[1]
        return self.json() | {"members": cached[1]}

    async def aclose(self) -> None:
        """Stop renewing and revoke the lease (its slots and membership go with it)."""
        for task in list(self._releases):
            task.cancel()
        await self.session.aclose()
        await self.client.aclose()
