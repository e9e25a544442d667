"""Own metrics of the fleet: whether etcd can be relied on, who waits for or holds a slot, the correlated
faults that hold the group, refusals by rail."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .budget import RAIL, FleetBudget
from .correlated import HOLD_RAIL


def fleet_families(fleet: FleetBudget | None) -> Iterator[Metric]:
    """The fleet's families; none for a watchdog outside a fleet."""
    if fleet is None:
        return
    group = fleet.config.group
    reachable = GaugeMetricFamily(
        "vllm_watchdog_fleet_reachable",
        "1 while etcd can be relied on (the lease renews); 0 while disruptive actions are refused.",
        labels=["group"],
    )
    reachable.add_metric([group], int(not fleet.session.refusal()))
    yield reachable
    waiting = GaugeMetricFamily(
        "vllm_watchdog_fleet_waiting",
        "1 while a disruptive action waits in line for a slot of the group.",
        labels=["group", "target", "action"],
    )
    holding = GaugeMetricFamily(
        "vllm_watchdog_fleet_holding",
        "1 while a disruptive action holds a slot of the group.",
        labels=["group", "target", "action"],
    )
    for family, found in ((waiting, fleet.waiting), (holding, fleet.holding)):
        for target, (action, _) in sorted(found.items()):
            family.add_metric([group, target, action], 1)
        yield family
    hold = GaugeMetricFamily(
        "vllm_watchdog_fleet_hold",
        "1 while more than correlated_share of the group's live members fire this disruptive alert: "
        "disruptive actions are held group-wide.",
        labels=["group", "alertname"],
    )
    for h in fleet.holds():
        hold.add_metric([group, h.alertname], 1)
    yield hold
    refusals = CounterMetricFamily(
        "vllm_watchdog_fleet_refusals",
        "Disruptive actions refused on a fleet rail: fleet (etcd not reliable, or no slot within slot_wait) "
        "or fleet_hold (a correlated fault holds the group).",
        labels=["group", "rail"],
    )
    for rail in (RAIL, HOLD_RAIL):
        refusals.add_metric([group, rail], fleet.refusals[rail])
    yield refusals
    lost = CounterMetricFamily(
        "vllm_watchdog_fleet_slots_lost",
        "Slots whose lease expired while their action ran (this member was cut off from etcd).",
        labels=["group"],
    )
    lost.add_metric([group], fleet.lost)
    yield lost
