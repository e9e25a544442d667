"""The ruler's own metrics: ALERTS and ALERTS_FOR_STATE as Prometheus writes them, and how the rule groups
evaluate, built at scrape time from one RuleEvaluation (prometheus_client's custom collector)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..sources.selffeed import OwnCollector, Want, everything
from .evaluation import RuleEvaluation
from .groups import key_name

_ALERT_DOCS = {
    "ALERTS": "Active alerts: 1 per pending or firing alert, labelled with its state.",
    "ALERTS_FOR_STATE": "When each active alert became active (unix seconds).",
}


class RuleCollector(OwnCollector):
    """Exports the active alerts and the evaluations, failures and durations of every rule group."""

    def __init__(self, evaluation: RuleEvaluation) -> None:
        self.evaluation = evaluation

    def collect(self, want: Want = everything) -> Iterator[Metric]:
        """Build every family from current state (only those `want` names, for the self feed)."""
        if want("ALERTS") or want("ALERTS_FOR_STATE"):
            yield from self._alerts()
        yield from (family for family in self._evaluations() if want(family.name))

    def _alerts(self) -> Iterator[Metric]:
        """ALERTS and ALERTS_FOR_STATE, one family each with per-series labels."""
        families: dict[str, Metric] = {}
        for labels, value in self.evaluation.manager.alert_series():
            name = labels.get("__name__", "ALERTS")
            family = families.setdefault(name, Metric(name, _ALERT_DOCS.get(name, name), "gauge"))
            family.add_sample(name, {k: v for k, v in labels.items() if k != "__name__"}, value)
        yield from families.values()

    def _evaluations(self) -> Iterator[Metric]:
        ev = self.evaluation
        total = CounterMetricFamily(
            "vllm_watchdog_rule_group_evaluations", "Rule group evaluations.", labels=["rule_group"]
        )
        duration = GaugeMetricFamily(
            "vllm_watchdog_rule_group_last_duration_seconds",
            "How long the last evaluation of a group took.",
            labels=["rule_group"],
        )
        # Every group from the start, at 0.
        groups = dict.fromkeys((key_name(k) for k in ev.manager.group_keys()), 0)
        for group, n in sorted((groups | ev.stats.evaluations).items()):
            total.add_metric([group], n)
        for group, seconds in sorted(ev.stats.last_duration.items()):
            duration.add_metric([group], seconds)
        yield total
        yield duration
        failures = CounterMetricFamily(
            "vllm_watchdog_rule_evaluation_failures",
            "Rule evaluations that failed (query error, limit exceeded), by group.",
            labels=["rule_group"],
        )
        for group, n in sorted((groups | ev.manager.failures()).items()):
            failures.add_metric([group], n)
        yield failures
        remote = CounterMetricFamily(
            "vllm_watchdog_remote_query_failures", "Queries the remote rule backend failed to answer."
        )
        remote.add_metric([], ev.stats.remote_failures)
        yield remote
