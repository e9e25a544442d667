"""Own metrics of the fleet: whether etcd can be relied on, who waits for or holds a slot, refusals."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .budget import FleetBudget


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
    refusals = CounterMetricFamily(
        "vllm_watchdog_fleet_refusals",
        "Disruptive actions refused on the fleet rail (etcd not reliable, or no slot within slot_wait).",
        labels=["group"],
    )
    refusals.add_metric([group], fleet.refusals)
    yield refusals
    lost = CounterMetricFamily(
        "vllm_watchdog_fleet_slots_lost",
        "Slots whose lease expired while their action ran (this member was cut off from etcd).",
        labels=["group"],
    )
    lost.add_metric([group], fleet.lost)
    yield lost
