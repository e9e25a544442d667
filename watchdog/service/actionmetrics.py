"""Own metrics of the action plane: outcomes, budgets, drains, maintenance mode, notification queues."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..actions.store.auditlog import OUTCOMES
from ..fleet.metrics import fleet_families
from ..sources.selffeed import OwnCollector, Want, everything
from .actionplane import ActionPlane


class ActionCollector(OwnCollector):
    """Families built from the action plane's live state at scrape time."""

    def __init__(self, plane: ActionPlane) -> None:
        self.plane = plane

    def collect(self, want: Want = everything) -> Iterator[Metric]:
        """Build every family (only those `want` names, for the self feed)."""
        if want("vllm_watchdog_actions"):
            yield self._outcomes()
        if want("vllm_watchdog_action_budget_remaining"):
            yield self._budgets()
        yield from self._state(want)

    def _outcomes(self) -> Metric:
        p = self.plane
        total = CounterMetricFamily(
            "vllm_watchdog_actions",
            "Actions by outcome (succeeded, failed, rolled_back, skipped, would_do, refused).",
            labels=["action", "target", "outcome"],
        )
        # Every configured action and target by every outcome from 0, so the first action is an increase.
        known = {(a, t.name, o): 0 for a in p.config.actions for t in p.config.targets for o in OUTCOMES}
        for (action, target, outcome), n in sorted((known | p.remediator.audit.counts).items()):
            total.add_metric([action, target, outcome], n)
        return total

    def _budgets(self) -> Metric:
        p = self.plane
        now = p.clock()
        budget = GaugeMetricFamily(
            "vllm_watchdog_action_budget_remaining",
            "Actions left in the current max_per_window.",
            labels=["action", "target"],
        )
        for a in p.config.actions.values():
            for t in p.config.targets:
                left = p.remediator.rails.budget_left(a, t.name, now)
                if left is not None:
                    budget.add_metric([a.name, t.name], left)
        return budget

    def _state(self, want: Want) -> Iterator[Metric]:
        p = self.plane
        if want("vllm_watchdog_action_running"):
            running = GaugeMetricFamily(
                "vllm_watchdog_action_running",
                "1 while an action runs on the target.",
                labels=["target", "action"],
            )
            for target, job in sorted(p.remediator.current.items()):
                running.add_metric([target, job.action.name], 1)
            yield running
        if want("vllm_watchdog_drained"):  # the state database is read only for a family that is wanted
            drained = GaugeMetricFamily(
                "vllm_watchdog_drained", "1 while the target is drained for an action.", labels=["target"]
            )
            for target in sorted(p.store.drains()):
                drained.add_metric([target], 1)
            yield drained
        if want("vllm_watchdog_target_quarantined"):
            yield _quarantined(p)
        if want("vllm_watchdog_paused"):
            yield GaugeMetricFamily(
                "vllm_watchdog_paused", "1 in maintenance mode (no actions).", value=int(p.store.paused()[0])
            )
        yield from (family for family in _gateway_families(p) if want(family.name))
        if want("vllm_watchdog_dry_run"):
            yield GaugeMetricFamily(
                "vllm_watchdog_dry_run",
                "1 when every action only logs what it would do.",
                value=int(p.config.dry_run),
            )
        if any(want(name) for name in _NOTIFIER_FAMILIES):
            yield from (family for family in _notifier_families(p) if want(family.name))
        yield from (family for family in fleet_families(p.fleet) if want(family.name))


def _quarantined(p: ActionPlane) -> Metric:
    """1 for a quarantined target, 0 for every other configured one (a lifted quarantine reads 0)."""
    family = GaugeMetricFamily(
        "vllm_watchdog_target_quarantined",
        "1 while the target is quarantined: its known answers stayed wrong, it is kept drained, no restarts.",
        labels=["target"],
    )
    quarantined = p.store.quarantines()
    for target in sorted({t.name for t in p.config.targets} | set(quarantined)):
        family.add_metric([target], int(target in quarantined))
    return family


_NOTIFIER_FAMILIES = (
    "vllm_watchdog_notifications_queued",
    "vllm_watchdog_notifications_sent",
    "vllm_watchdog_notifications_failed",
    "vllm_watchdog_notification_retries",
    "vllm_watchdog_notifications_dropped",
)


def _notifier_families(p: ActionPlane) -> Iterator[Metric]:
    stats = p.hub.stats()
    queued = GaugeMetricFamily(
        "vllm_watchdog_notifications_queued", "Notifications waiting for delivery.", labels=["notifier"]
    )
    sent = CounterMetricFamily(
        "vllm_watchdog_notifications_sent", "Notifications delivered.", labels=["notifier"]
    )
    failed = CounterMetricFamily(
        "vllm_watchdog_notifications_failed",
        "Notifications a receiver refused for good (4xx).",
        labels=["notifier"],
    )
    retries = CounterMetricFamily(
        "vllm_watchdog_notification_retries", "Delivery attempts to be retried.", labels=["notifier"]
    )
    dropped = CounterMetricFamily(
        "vllm_watchdog_notifications_dropped",
        "Notifications dropped (queue full, rejected).",
        labels=["notifier"],
    )
    for name, s in sorted(stats.items()):
        queued.add_metric([name], s.queued)
        sent.add_metric([name], s.sent)
        failed.add_metric([name], s.failed)
        dropped.add_metric([name], s.dropped)
        retries.add_metric([name], s.retries)
    yield from (queued, sent, failed, dropped, retries)


def _gateway_families(p: ActionPlane) -> Iterator[Metric]:
    """Whether the gateway process answers the daemon, and how often a new one was started."""
    gw = p.gateway
    reachable = GaugeMetricFamily(
        "vllm_watchdog_gateway_reachable",
        "1 while the gateway process answers its control channel; 0 if it is gone or does not answer.",
        labels=["target"],
    )
    restarts = CounterMetricFamily(
        "vllm_watchdog_gateway_process_restarts",
        "Gateway processes started again after one died.",
        labels=["target"],
    )
    if gw is not None:
        reachable.add_metric([gw.target], int(gw.reachable))
        restarts.add_metric([gw.target], gw.restarts)
    yield reachable
    yield restarts
