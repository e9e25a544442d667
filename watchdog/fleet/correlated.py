"""Correlated faults: when more than `correlated_share` of a group's live members fire the same disruptive
alert, restarts will not fix it (a bad rollout, a wrong rule pushed everywhere, a traffic surge), so every
member holds its disruptive actions until the share falls back.

What counts is an alert that this member's routes send to a disruptive action (one that takes a slot), about
one of its targets, firing now. "The same alert" is the same alertname: its other labels name the host, the
target or the GPU and differ from member to member. Each member publishes the names it fires in
`<prefix>/<group>/firing/<member>` under its lease (a dead member's names vanish with it), and deletes the key
when it fires none.

Members agree without a leader and without talking to each other: each reads the same keys (the firing keys
and the number of member keys, in one linearizable transaction, at one revision) and applies the same rule,
so two members reading at one revision decide alike. A member decides whether to start an action with a read
made in the same transaction that finds its slot, never with an older one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .etcd import EtcdClient, EtcdError, Range, parse_range, range_request

FIRING = b"firing/"
HOLD_RAIL = "fleet_hold"
FIRING_HOLD = 300.0  # an alert without an end (an Alertmanager's firing alert) counts this long after it came
MAX_PUBLISHED = 16  # alert names one member publishes
MAX_NAME = 128  # characters of one published name
MAX_FIRING_READ = 1024  # firing keys read: 1024 x 16 x 128 characters stay below the client's MAX_BODY
MAX_TRACKED = 1024  # (alertname, target) pairs one member tracks
SHOWN = 16  # members named in a refusal or an alert
MAX_HOLDS = 16  # alerts that hold the group at once, reported (alerts, metrics): the most fired first


class FiringAlerts:
    """This member's firing disruptive alerts, (alertname, target) -> until (wall clock)."""

    def __init__(self) -> None:
        self.until: dict[tuple[str, str], float] = {}

    def note(self, alertname: str, target: str, firing: bool, until: float) -> None:
        """An alert fired (until `until`, renewed by its resends) or resolved."""
        key = (alertname[:MAX_NAME], target)
        if not firing:
            self.until.pop(key, None)
        elif key in self.until or len(self.until) < MAX_TRACKED:
            self.until[key] = until

    def forget(self, target: str) -> None:
        """A target that left the config fires nothing any more."""
        for key in [k for k in self.until if k[1] == target]:
            del self.until[key]

    def names(self, now: float) -> tuple[str, ...]:
        """The alert names firing at `now`, sorted, at most MAX_PUBLISHED (expired ones are forgotten)."""
        for key, until in list(self.until.items()):
            if until < now:
                del self.until[key]
        return tuple(sorted({name for name, _ in self.until}))[:MAX_PUBLISHED]


def encode_firing(names: Iterable[str]) -> bytes:
    """A firing key's value."""
    return json.dumps({"alerts": list(names)}).encode()


def decode_firing(value: bytes) -> tuple[str, ...]:
    """The names a firing key holds, bounded as a member publishes them; () for what cannot be read."""
    try:
        doc = json.loads(value)
    except ValueError:
        return ()
    names = doc.get("alerts") if isinstance(doc, dict) else None
    if not isinstance(names, list):
        return ()
    return tuple(dict.fromkeys(n[:MAX_NAME] for n in names[:MAX_PUBLISHED] if isinstance(n, str) and n))


@dataclass(frozen=True)
class Hold:
    """One alert fired by more than the share of the group: disruptive actions wait until it falls back."""

    alertname: str
    members: tuple[str, ...]  # every member firing it, sorted
    live: int
    share: float

    def named(self) -> str:
        """The members firing it, at most SHOWN of them."""
        shown = ", ".join(self.members[:SHOWN])
        more = len(self.members) - SHOWN
        return shown + (f" and {more} more" if more > 0 else "")

    def reason(self, group: str) -> str:
        """Why a disruptive action is refused on the `fleet_hold` rail."""
        return (
            f"fleet_hold: {len(self.members)} of {self.live} live members of group {group} fire "
            f"{self.alertname} ({self.named()}), more than correlated_share {self.share * 100:g}%: "
            "restarts do not fix a correlated fault; disruptive actions are held group-wide until it ends"
        )


@dataclass(frozen=True)
class View:
    """What the group fires, read at one revision: alertname -> members firing it, and the live members."""

    revision: int = 0
    live: int = 0
    firing: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def holds(self, share: float | None) -> tuple[Hold, ...]:
        """The alerts fired by more than `share` of the live members (and by two at least: one member alone is
        no correlation), the most fired first, at most MAX_HOLDS; none when the hold is off (`share` None)."""
        if share is None:
            return ()
        everyone = {m for members in self.firing.values() for m in members}
        live = max(self.live, len(everyone))
        limit = round(share * live, 9)  # 0.3 * 10 is 3.0000000000000004 in floats: 3 of 10 is not more
        held = [(n, m) for n, m in self.firing.items() if len(m) >= 2 and len(m) > limit]
        held.sort(key=lambda nm: (-len(nm[1]), nm[0]))
        return tuple(Hold(name, members, live, share) for name, members in held[:MAX_HOLDS])

    def json(self) -> dict[str, Any]:
        """For /api/v1/actions and /api/v1/fleet."""
        firing = {name: list(members) for name, members in self.firing.items()}
        return {"revision": self.revision, "live": self.live, "firing": firing}


def firing_request(prefix: bytes) -> dict[str, Any]:
    """The range of every firing key of the group under `prefix`, bounded."""
    return range_request(prefix + FIRING, limit=MAX_FIRING_READ)


def members_count_request(prefix: bytes) -> dict[str, Any]:
    """How many member keys the group has (its live members)."""
    return range_request(prefix + b"members/", count_only=True)


def parse_view(revision: int, members: Range, firing: Range) -> View:
    """A View from the two ranges read in one transaction."""
    by_name: dict[str, list[str]] = {}
    for kv in firing.kvs:
        member = kv.key.rsplit(b"/", 1)[-1][:MAX_NAME].decode("utf-8", "replace")
        for name in decode_firing(kv.value):
            by_name.setdefault(name, []).append(member)
    return View(revision, members.count, {k: tuple(sorted(v)) for k, v in by_name.items()})


async def read_view(client: EtcdClient, prefix: bytes) -> View:
    """What the group under `prefix` fires, read in one transaction; EtcdError if etcd cannot be read."""
    revision, responses = await client.txn(
        [{"request_range": members_count_request(prefix)}, {"request_range": firing_request(prefix)}]
    )
    ranges = [parse_range(r.get("response_range") or {}, revision) for r in responses]
    if len(ranges) != 2:
        raise EtcdError(f"a transaction of 2 reads answered {len(ranges)}")
    return parse_view(revision, ranges[0], ranges[1])
