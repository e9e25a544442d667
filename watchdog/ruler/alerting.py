"""The state machine of one alerting rule, as Prometheus' rules/alerting.go defines it.

An alert is identified by its label set: the series labels (minus `__name__`), the rule's templated labels
and `alertname`. It is pending until its expression has returned it for `for`, then firing; when the
expression stops returning it, a firing alert stays firing for `keep_firing_for` and is then resolved; a
resolved alert is kept (and re-sent) for 15 minutes; a pending alert that clears is dropped without a
resolved notice. Times are integer milliseconds since the epoch; None stands for Go's zero time.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any
from urllib.parse import quote_plus, urljoin

from ..formats.gostrconv import format_float, go_number
from ..formats.rfc3339 import format_rfc3339
from ..notifiers.alert import OutgoingAlert
from ..promql.values import QueryError, QueryFunc, Sample, Vector
from ..store import Labels
from .expansion import Expander
from .files import Rule

log = logging.getLogger(__name__)

ALERT_METRIC = "ALERTS"
FOR_STATE_METRIC = "ALERTS_FOR_STATE"
RESOLVED_RETENTION_MS = 15 * 60 * 1000
"""How long a resolved alert is kept in memory and re-sent to notifiers."""
LOGGED_CHANGES = (
    10  # state-change lines per rule and evaluation; a rule with thousands of alerts logs a count
)


class AlertState(enum.IntEnum):
    """The state of one alert; the order is the one rule state is maximised over."""

    INACTIVE = 0
    PENDING = 1
    FIRING = 2

    def __str__(self) -> str:
        return self.name.lower()


_CHANGES = frozenset(
    {
        (AlertState.INACTIVE, "pending"),
        (AlertState.INACTIVE, "firing"),  # `for: 0s`: it fires on its first evaluation
        (AlertState.PENDING, "firing"),
        (AlertState.FIRING, "resolved"),
    }
)


@dataclass
class Alert:
    """One instance of an alerting rule (mutable: the state machine updates it in place)."""

    labels: Labels  # sorted, without __name__, with alertname
    annotations: dict[str, str]
    state: AlertState
    value: float
    active_at: int
    fired_at: int | None = None
    resolved_at: int | None = None
    last_sent_at: int | None = None
    valid_until: int | None = None
    keep_firing_since: int | None = None

    def needs_sending(self, ts: int, resend_delay: int) -> bool:
        """Whether a notifier must hear about this alert at ts (Prometheus' needsSending)."""
        if self.state == AlertState.PENDING:
            return False
        last = self.last_sent_at
        if self.resolved_at is not None and (last is None or self.resolved_at > last):
            return True
        # ts < last: the wall clock went back; re-send now rather than once it has caught up again.
        return last is None or last + resend_delay < ts or ts < last


@dataclass
class RuleStatus:
    """Health of a rule's last evaluation, as /api/v1/rules reports it."""

    health: str = "unknown"  # "ok", "err" or "unknown" (never evaluated)
    last_error: str | None = None
    evaluation_seconds: float = 0.0
    last_evaluation: int | None = None

    def record(self, error: str | None, ts: int, seconds: float) -> None:
        """Remember the outcome of an evaluation at ts that took `seconds`."""
        self.health = "err" if error is not None else "ok"
        self.last_error = error
        self.last_evaluation = ts
        self.evaluation_seconds = seconds


def rule_identity(rule: Rule) -> tuple[str, tuple[tuple[str, str], ...]]:
    """How reloads and restores match rules: name and labels, as Prometheus' nameAndLabels."""
    return rule.name, tuple(sorted(rule.labels.items()))


def _set(pairs: dict[str, str], name: str, value: str) -> None:
    """Prometheus' labels.Builder.Set: an empty value deletes the label."""
    if value == "":
        pairs.pop(name, None)
    else:
        pairs[name] = value


class AlertingRule:
    """One alerting rule and its active alerts, keyed by label set."""

    def __init__(
        self,
        rule: Rule,
        *,
        external_labels: Mapping[str, str] | None = None,
        external_url: str = "",
        runbook_base: str = "",
    ) -> None:
        self.rule = rule
        self.name = rule.name
        self.hold_ms = round(rule.for_ * 1000)
        self.keep_firing_ms = round(rule.keep_firing_for * 1000)
        self.external_labels = dict(external_labels or {})
        self.external_url = external_url
        self.runbook_base = runbook_base  # "": a relative runbook_url annotation stays as it is
        self.label_templates = {k: Expander(v, rule.name) for k, v in rule.labels.items()}
        self.annotation_templates = {k: Expander(v, rule.name) for k, v in rule.annotations.items()}
        self._expanded_with = (dict(self.external_labels), external_url)
        self._generator_url: tuple[str, str] | None = None  # (external_url, link): sent with every alert
        self.active: dict[Labels, Alert] = {}
        # The label sets of each alert's ALERTS and ALERTS_FOR_STATE series, written every evaluation.
        self._series_labels: dict[tuple[Labels, AlertState], tuple[Labels, Labels]] = {}
        self.warm_until: int | None = None  # ms; set when alerts are restored after a restart
        self.status = RuleStatus()

    def _expand(
        self, templates: dict[str, Expander], key: Labels, labels: Mapping[str, str], value: float
    ) -> dict[str, str]:
        ext, url = self.external_labels, self.external_url
        return {k: t.expand_for(key, labels, value, ext, url) for k, t in templates.items()}

    def eval(self, ts: int, query: QueryFunc, limit: int = 0) -> list[tuple[Labels, float]]:
        """Run the expression at ts, advance every alert, and return the ALERTS/ALERTS_FOR_STATE samples.

        Raises QueryError (or PromQLError) with the alert state untouched when the query fails or two results
        share a label set; clears every alert and raises when more than `limit` alerts are active.
        """
        fresh = self._results(query(self.rule.expr, ts / 1000), ts)
        before = {key: alert.state for key, alert in self.active.items() if alert.resolved_at is None}
        self._take(fresh)
        out, live = self._advance(fresh, ts)
        if limit > 0 and live > limit:
            self.active = {}
            raise QueryError(f"exceeded limit of {limit} with {live} alerts")
        self._log_changes(before)
        return out

    def _log_changes(self, before: Mapping[Labels, AlertState]) -> None:
        """One line per alert that went pending, firing or resolved in this evaluation (at most
        LOGGED_CHANGES; then one line that counts the rest): with no notifier, the log is where a person
        sees the alerts. A pending alert that clears is not a resolution (Prometheus sends none either)."""
        changes = []
        for key, alert in self.active.items():
            was = before.get(key, AlertState.INACTIVE)
            now = "resolved" if alert.resolved_at is not None else alert.state.name.lower()
            if (was, now) in _CHANGES:
                changes.append((now, key, alert.value))
        for now, key, value in changes[:LOGGED_CHANGES]:
            labels = ", ".join(f'{k}="{v}"' for k, v in key if k != "alertname")
            log.info(f"alert {now}", extra={"alertname": self.name, "labels": labels, "value": value})
        if len(changes) > LOGGED_CHANGES:
            log.info("alert changes", extra={"alertname": self.name, "more": len(changes) - LOGGED_CHANGES})

    def _results(self, vector: Vector, ts: int) -> dict[Labels, Alert]:
        """A pending alert for each sample of the result, by its label set (Prometheus' first loop)."""
        templates = [*self.label_templates.values(), *self.annotation_templates.values()]
        if self._expanded_with != (self.external_labels, self.external_url):
            self._expanded_with = (dict(self.external_labels), self.external_url)
            for template in templates:
                template.forget()
        fresh: dict[Labels, Alert] = {}
        for sample in vector:
            alert = self._alert_of(sample, ts)
            if alert.labels in fresh:
                raise QueryError("vector contains metrics with the same labelset after applying alert labels")
            fresh[alert.labels] = alert
        for template in templates:
            template.next_evaluation()
        return fresh

    def _alert_of(self, sample: Sample, ts: int) -> Alert:
        """The alert one sample stands for: its labels with the rule's templated ones and alertname set."""
        labels, series = sample.labels, dict(sample.labels)
        pairs = {k: v for k, v in labels if k != "__name__"}
        for name, value in self._expand(self.label_templates, labels, series, sample.value).items():
            _set(pairs, name, value)
        pairs["alertname"] = self.name
        annotations = self._expand(self.annotation_templates, labels, series, sample.value)
        if self.runbook_base and "runbook_url" in annotations:
            annotations["runbook_url"] = resolve_runbook(self.runbook_base, annotations["runbook_url"])
        key: Labels = tuple(sorted(pairs.items()))
        return Alert(key, annotations, AlertState.PENDING, sample.value, active_at=ts)

    def _take(self, fresh: dict[Labels, Alert]) -> None:
        """An alert already active takes the new value and annotations; any other becomes active."""
        for key, alert in fresh.items():
            existing = self.active.get(key)
            if existing is not None and existing.state != AlertState.INACTIVE:
                existing.value = alert.value
                existing.annotations = alert.annotations
            else:
                self.active[key] = alert

    def _advance(self, fresh: dict[Labels, Alert], ts: int) -> tuple[list[tuple[Labels, float]], int]:
        """Move every held alert on at ts; return the series of those still active and how many they are."""
        out: list[tuple[Labels, float]] = []
        live = 0
        for key, alert in list(self.active.items()):
            if key not in fresh and self.warm_until is not None and ts < self.warm_until:
                # Restored after a restart while the store still lacks the history the expression reads:
                # absence proves nothing yet, so the alert neither resolves nor advances.
                live += 1
                out.extend(self.series(alert))
                continue
            if key not in fresh:
                if not self._absent(key, alert, ts):
                    continue
            else:
                alert.keep_firing_since = None
            live += 1
            self._hold(alert, ts)
            out.extend(self.series(alert))
        return out, live

    def _absent(self, key: Labels, alert: Alert, ts: int) -> bool:
        """An alert the expression no longer returns: resolve it, or keep it firing for keep_firing_for
        (then True). A pending one is forgotten; a resolved one is kept for a while to be re-sent."""
        keep_firing = False
        if alert.state == AlertState.FIRING and self.keep_firing_ms > 0:
            if alert.keep_firing_since is None or ts < alert.keep_firing_since:
                alert.keep_firing_since = ts  # (later than ts: the wall clock went back)
            keep_firing = ts - alert.keep_firing_since < self.keep_firing_ms
        if alert.state == AlertState.PENDING or (
            alert.resolved_at is not None and ts - alert.resolved_at > RESOLVED_RETENTION_MS
        ):
            del self.active[key]
        if alert.state != AlertState.INACTIVE and not keep_firing:
            alert.state = AlertState.INACTIVE
            alert.resolved_at = ts
        return keep_firing

    def _hold(self, alert: Alert, ts: int) -> None:
        """A pending alert held for `for` fires."""
        if alert.state == AlertState.PENDING and ts < alert.active_at:
            alert.active_at = ts  # the wall clock went back: `for` counts from now, not from the future
        if alert.state == AlertState.PENDING and ts - alert.active_at >= self.hold_ms:
            alert.state = AlertState.FIRING
            alert.fired_at = ts

    def series(self, alert: Alert) -> list[tuple[Labels, float]]:
        """The ALERTS (value 1) and ALERTS_FOR_STATE (ActiveAt in whole seconds) series of an active alert."""
        key = (alert.labels, alert.state)
        names = self._series_labels.get(key)
        if names is None:
            if len(self._series_labels) > 4 * len(self.active) + 64:  # keep it to about the alerts held
                self._series_labels.clear()
            base = {k: v for k, v in self.rule.labels.items() if v != ""}
            base.update(alert.labels)
            base["alertname"] = self.name
            alerts = dict(base, __name__=ALERT_METRIC, alertstate=str(alert.state))
            for_state = dict(base, __name__=FOR_STATE_METRIC)
            names = self._series_labels[key] = (
                tuple(sorted(alerts.items())),
                tuple(sorted(for_state.items())),
            )
        return [(names[0], 1.0), (names[1], float(math.floor(alert.active_at / 1000)))]

    def state(self) -> AlertState:
        """The highest state of any alert of this rule."""
        return max((a.state for a in self.active.values()), default=AlertState.INACTIVE)

    def active_alerts(self) -> list[Alert]:
        """Copies of the pending and firing alerts (not the resolved ones), sorted by labels."""
        return [replace(a) for _, a in sorted(self.active.items()) if a.resolved_at is None]

    def current_alerts(self) -> list[Alert]:
        """Copies of every alert held, resolved ones included, sorted by labels."""
        return [replace(a) for _, a in sorted(self.active.items())]

    def generator_url(self) -> str:
        """Where the alert came from, as Prometheus links it: the table view of the expression."""
        cached = self._generator_url
        if cached is None or cached[0] != self.external_url:
            url = f"{self.external_url}/graph?g0.expr={quote_plus(self.rule.expr, safe='')}&g0.tab=1"
            cached = self._generator_url = (self.external_url, url)
        return cached[1]

    def send(self, ts: int, resend_delay: int, interval: int) -> list[OutgoingAlert]:
        """Mark the alerts that need sending at ts as sent and return them for the notifiers."""
        out: list[OutgoingAlert] = []
        url = self.generator_url()
        for _, alert in sorted(self.active.items()):
            if not alert.needs_sending(ts, resend_delay):
                continue
            alert.last_sent_at = ts
            # Allow for two missed evaluations or failed sends before the notifier's copy expires.
            alert.valid_until = ts + 4 * max(resend_delay, interval)
            ends = alert.resolved_at if alert.resolved_at is not None else alert.valid_until
            out.append(
                OutgoingAlert(
                    labels=dict(alert.labels),
                    annotations=dict(sorted(alert.annotations.items())),
                    state="resolved" if alert.resolved_at is not None else "firing",
                    starts_at=(alert.fired_at if alert.fired_at is not None else alert.active_at) / 1000,
                    ends_at=ends / 1000,
                    value=alert.value,
                    generator_url=url,
                )
            )
        return out


@lru_cache(maxsize=1024)
def resolve_runbook(base: str, url: str) -> str:
    """A runbook link made absolute against `base` (a directory: its trailing slash is implied)."""
    return urljoin(base if base.endswith("/") else base + "/", url)


def own_runbook(base: str, alertname: str) -> str:
    """The runbook link of an alert the watchdog raises itself (no rule): its section of docs/runbooks.md,
    resolved as the bundled rules' relative links are ("" base: left relative)."""
    link = f"docs/runbooks.md#{alertname.lower()}"
    return resolve_runbook(base, link) if base else link


def alert_json(alert: Alert) -> dict[str, Any]:
    """One alert in the shape of Prometheus' /api/v1/alerts."""
    out: dict[str, Any] = {
        "labels": dict(alert.labels),
        "annotations": dict(sorted(alert.annotations.items())),
        "state": str(alert.state),
        "activeAt": format_rfc3339(alert.active_at),
        "value": format_float(alert.value, "e"),
    }
    if alert.keep_firing_since is not None:
        out["keepFiringSince"] = format_rfc3339(alert.keep_firing_since)
    return out


def rule_json(rule: AlertingRule) -> dict[str, Any]:
    """An alerting rule in the shape of Prometheus' /api/v1/rules."""
    out: dict[str, Any] = {
        "state": str(rule.state()),
        "name": rule.name,
        "query": rule.rule.expr,
        "duration": go_number(rule.hold_ms / 1000),
        "keepFiringFor": go_number(rule.keep_firing_ms / 1000),
        "labels": dict(sorted(rule.rule.labels.items())),
        "annotations": dict(sorted(rule.rule.annotations.items())),
        "alerts": [alert_json(a) for a in rule.active_alerts()],
        "health": rule.status.health,
    }
    return out | status_json(rule.status) | {"type": "alerting"}


def status_json(status: RuleStatus) -> dict[str, Any]:
    """lastError (omitted when empty), evaluationTime and lastEvaluation of a rule."""
    out: dict[str, Any] = {}
    if status.last_error:
        out["lastError"] = status.last_error
    out["evaluationTime"] = status.evaluation_seconds
    out["lastEvaluation"] = format_rfc3339(status.last_evaluation)
    return out
