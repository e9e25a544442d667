"""Correlated faults with injected clocks: what a member publishes (bounded), when the group holds (more than
the share of live members, two at least, by alertname), the fleet alert (sent, resent, resolved), a view too
old to act on, and the keys a reload may change. No etcd: the end-to-end case is in test_semaphore.py and
test_fleet_watchdogs.py."""

from __future__ import annotations

import json

from tests.support.clock import Clock
from vllm_watchdog.fleet.alerts import CORRELATED, RESEND, FleetAlerts
from vllm_watchdog.fleet.budget import FleetBudget, FleetOptions
from vllm_watchdog.fleet.config import FleetConfig, parse_max_disrupted
from vllm_watchdog.fleet.correlated import (
    MAX_HOLDS,
    MAX_NAME,
    MAX_PUBLISHED,
    MAX_TRACKED,
    SHOWN,
    FiringAlerts,
    View,
    decode_firing,
    encode_firing,
    parse_view,
)
from vllm_watchdog.fleet.etcd import KeyValue, Range

GROUP = FleetConfig(group="llama", correlated_share=0.5, lease_ttl=9)


def view(live: int, **firing: tuple[str, ...]) -> View:
    return View(revision=1, live=live, firing=firing)


def test_a_member_publishes_the_alert_names_it_fires_until_they_resolve_or_end() -> None:
    firing = FiringAlerts()
    firing.note("Hung", "vllm-0", True, until=100.0)
    firing.note("Hung", "vllm-1", True, until=200.0)  # one name however many targets fire it
    firing.note("SpecBad", "vllm-0", True, until=50.0)
    assert firing.names(10.0) == ("Hung", "SpecBad")
    assert firing.names(60.0) == ("Hung",)  # SpecBad's end passed without a resend
    firing.note("Hung", "vllm-1", False, until=0.0)
    assert firing.names(60.0) == ("Hung",)  # vllm-0 still fires it
    firing.note("Hung", "vllm-0", True, until=300.0)  # a resend moves the end
    assert firing.names(250.0) == ("Hung",)
    firing.note("Hung", "vllm-0", False, until=0.0)
    assert firing.names(250.0) == ()
    firing.note("Hung", "vllm-0", True, until=300.0)
    firing.note("Slow", "vllm-1", True, until=300.0)
    firing.forget("vllm-0")  # the target left the config: its resolution will never come
    assert firing.names(250.0) == ("Slow",)


def test_what_a_member_publishes_and_reads_is_bounded() -> None:
    firing = FiringAlerts()
    for i in range(MAX_TRACKED + 10):
        firing.note(f"A{i:05d}", "t", True, until=1e9)
    firing.note("X" * 1000, "t", True, until=1e9)  # past MAX_TRACKED: not tracked
    names = firing.names(0.0)
    assert len(names) == MAX_PUBLISHED and len(firing.until) == MAX_TRACKED
    assert decode_firing(encode_firing(names)) == names
    hostile = json.dumps({"alerts": ["Y" * 1000, 7, "", "Y" * 1000, *[f"B{i}" for i in range(100)]]})
    read = decode_firing(hostile.encode())
    assert read[0] == "Y" * MAX_NAME and len(read) <= MAX_PUBLISHED and all(isinstance(n, str) for n in read)
    for junk in (b"", b"not json", b"[1, 2]", b'{"alerts": "Hung"}', b'{"alerts": null}'):
        assert decode_firing(junk) == ()
    long_member = KeyValue(b"/p/g/firing/" + b"m" * 5000, encode_firing(["Hung"]), 1, 1, 1)
    other = KeyValue(b"/p/g/firing/m2", b"junk", 2, 2, 2)
    read_view = parse_view(7, Range((), 3, 7), Range((long_member, other), 2, 7))
    assert read_view.firing == {"Hung": ("m" * MAX_NAME,)} and (read_view.revision, read_view.live) == (7, 3)


def test_the_group_holds_when_more_than_the_share_of_live_members_fire_one_alert() -> None:
    assert [h.alertname for h in view(3, Hung=("a", "b")).holds(0.5)] == ["Hung"]  # 2 > 1.5
    assert view(4, Hung=("a", "b")).holds(0.5) == ()  # 2 of 4 is not more than half
    assert [h.members for h in view(4, Hung=("a", "b", "c")).holds(0.5)] == [("a", "b", "c")]
    assert view(1, Hung=("a",)).holds(0.1) == ()  # one member alone is no correlation
    assert view(2, Hung=("a",), Slow=("b",)).holds(0.3) == ()  # different alerts do not add up
    assert view(3, Hung=("a", "b", "c")).holds(None) == ()  # off
    assert view(10, Hung=tuple("abc")).holds(0.3) == ()  # 3 of 10 is not more than 30% (floats say 3.0000…4)
    assert len(view(10, Hung=tuple("abcd")).holds(0.3)) == 1
    (hold,) = view(1, Hung=("a", "b")).holds(0.5)  # a member whose key lags still counts as live
    assert hold.live == 2
    many = view(4, **{f"A{i:02d}": ("a", "b") for i in range(40)}, Z=("a", "b", "c"))
    assert [h.alertname for h in many.holds(0.25)][:3] == ["Z", "A00", "A01"]  # the most fired first
    assert len(many.holds(0.25)) == MAX_HOLDS


def test_the_refusal_names_the_alert_the_members_and_the_share_boundedly() -> None:
    members = tuple(f"gpu-{i:02d}" for i in range(SHOWN + 4))
    (hold,) = view(30, Hung=members).holds(0.5)
    reason = hold.reason("llama")
    assert reason.startswith(f"fleet_hold: {SHOWN + 4} of 30 live members of group llama fire Hung (gpu-00, ")
    assert "and 4 more), more than correlated_share 50%" in reason and f"gpu-{SHOWN:02d}" not in reason


def test_the_fleet_alert_fires_is_resent_follows_the_members_and_resolves_when_the_hold_ends() -> None:
    clock = Clock()
    alerts = FleetAlerts(GROUP, "m0", "http://w.example:9460/")
    holds = view(3, Hung=("a", "b")).holds(0.5)
    (fired,) = alerts.correlated(holds, clock())
    assert fired.state == "firing"
    assert dict(fired.labels) == {
        "alertname": CORRELATED,
        "group": "llama",
        "fault": "Hung",
        "severity": "critical",
    }
    assert (
        fired.annotations["members"] == "a, b"
        and "2 of 3 live members fire Hung" in fired.annotations["summary"]
    )
    # its section of the runbooks the watchdog serves (tests/api/test_runbooks.py checks the anchor exists)
    runbook = "http://w.example:9460/docs/runbooks.md#vllmwatchdogfleetcorrelatedfault"
    assert fired.annotations["runbook_url"] == runbook
    clock.advance(RESEND - 1)
    assert alerts.correlated(holds, clock()) == []
    clock.advance(1)
    assert [a.state for a in alerts.correlated(holds, clock())] == ["firing"]  # resent
    clock.advance(1)
    (changed,) = alerts.correlated(
        view(3, Hung=("a", "b", "c")).holds(0.5), clock()
    )  # not waiting for RESEND
    assert changed.annotations["members"] == "a, b, c" and changed.starts_at == fired.starts_at
    clock.advance(1)
    (resolved,) = alerts.correlated((), clock())
    assert (resolved.state, resolved.labels["fault"], resolved.ends_at) == ("resolved", "Hung", clock())
    assert alerts.correlated((), clock()) == []


def test_a_view_older_than_a_lease_holds_nothing_and_the_alert_resolves() -> None:
    clock = Clock()
    budget = FleetBudget(GROUP, FleetOptions("m0", clock=clock, monotonic=clock.monotonic))
    budget._seen(view(3, Hung=("a", "b")))
    assert [h.alertname for h in budget.holds()] == ["Hung"]
    assert [(a.labels["alertname"], a.state) for a in budget.alerts(clock())][-1] == (CORRELATED, "firing")
    clock.advance(GROUP.lease_ttl + 0.01)  # no read since: etcd cannot be read, the fleet rail refuses anyway
    assert budget.holds() == ()
    assert [(a.labels["alertname"], a.state) for a in budget.alerts(clock()) if a.labels.get("fault")] == [
        (CORRELATED, "resolved")
    ]
    budget._seen(View(revision=0, live=3, firing={"Hung": ("a", "b")}))  # an older revision is ignored
    assert budget.holds() == ()


def test_a_reload_changes_the_budgets_numbers_and_nothing_else() -> None:
    budget = FleetBudget(GROUP, FleetOptions("m0"))
    off = FleetConfig(
        group="llama", correlated_share=None, lease_ttl=9, max_disrupted=parse_max_disrupted("25%")
    )
    assert budget.apply(off)
    assert budget.config is off and budget.session.config is off and budget.semaphore.config is off
    assert budget.view.holds(budget.config.correlated_share) == ()
    assert not budget.apply(FleetConfig(group="other", correlated_share=None, lease_ttl=9))
    assert budget.config is off
