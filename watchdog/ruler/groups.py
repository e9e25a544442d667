"""Rule groups: recording rules, group evaluation and the RuleManager, as Prometheus' rules/manager.go.

Rules of a group are evaluated in order at one timestamp; what they produce (recorded series, ALERTS and
ALERTS_FOR_STATE) is written to the sample store at that timestamp, so later rules read it, and series a rule
produced last time but not now get a staleness marker. A rule whose query fails keeps its alert state and its
series, and is marked unhealthy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import WatchdogError
from ..formats.gostrconv import go_number
from ..formats.rfc3339 import format_rfc3339
from ..notifiers.alert import OutgoingAlert
from ..promql.values import QueryError, QueryFunc, to_ms
from ..store import Exposure, Labels, SampleStore
from .alerting import (
    RESOLVED_RETENTION_MS,
    Alert,
    AlertingRule,
    AlertState,
    RuleStatus,
    alert_json,
    rule_identity,
    rule_json,
    status_json,
)
from .files import Rule, RuleGroup
from .state import FOR_GRACE_PERIOD, OUTAGE_TOLERANCE, StateFile

log = logging.getLogger(__name__)

GroupKey = tuple[str, str]
"""(file, name): group names are unique per file only."""


class RecordingRule:
    """A rule whose result is stored under a new metric name."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.name = rule.name
        self.status = RuleStatus()
        self._keys: dict[Labels, Labels] = {}  # result labels -> recorded labels, from earlier evaluations

    def _key(self, labels: Labels) -> Labels:
        """A result's labels with `__name__` and the rule's labels set (empty values remove a label)."""
        pairs = dict(labels)
        pairs["__name__"] = self.name
        for name, value in self.rule.labels.items():
            if value == "":
                pairs.pop(name, None)
            else:
                pairs[name] = value
        return tuple(sorted(pairs.items()))

    def eval(self, ts: int, query: QueryFunc, limit: int = 0) -> list[tuple[Labels, float]]:
        """The samples to record at ts: result labels with `__name__` and the rule's labels set."""
        out: dict[Labels, float] = {}
        keys = self._keys
        vector = query(self.rule.expr, ts / 1000)
        if len(keys) > 4 * len(vector) + 64:  # keep it to about the series recorded
            keys.clear()
        for sample in vector:
            if (key := keys.get(sample.labels)) is None:
                key = keys[sample.labels] = self._key(sample.labels)
            if key in out:
                raise QueryError("vector contains metrics with the same labelset after applying rule labels")
            out[key] = sample.value
        if limit > 0 and len(out) > limit:
            raise QueryError(f"exceeded limit of {limit} with {len(out)} series")
        return list(out.items())

    def json(self) -> dict[str, Any]:
        """The rule in the shape of Prometheus' /api/v1/rules."""
        out: dict[str, Any] = {"name": self.name, "query": self.rule.expr}
        if self.rule.labels:
            out["labels"] = dict(sorted(self.rule.labels.items()))
        out["health"] = self.status.health
        return out | status_json(self.status) | {"type": "recording"}


AnyRule = AlertingRule | RecordingRule


def _signature(rule: Rule) -> tuple[object, ...]:
    """What makes two rules equal across a reload (Prometheus compares their YAML; lines do not count)."""
    return (
        rule.kind,
        rule.name,
        rule.expr,
        rule.for_,
        rule.keep_firing_for,
        sorted(rule.labels.items()),
        sorted(rule.annotations.items()),
    )


class Group:
    """One rule group: its rules, what each exposed last time, and the timing of its last evaluation."""

    def __init__(
        self,
        spec: RuleGroup,
        interval: float,
        store: SampleStore,
        external_labels: Mapping[str, str],
        external_url: str,
        runbook_base: str = "",
    ) -> None:
        self.spec = spec
        self.key: GroupKey = (spec.file, spec.name)
        self.interval = interval
        self.store = store
        self.rules: list[AnyRule] = [
            AlertingRule(
                r, external_labels=external_labels, external_url=external_url, runbook_base=runbook_base
            )
            if r.kind == "alert"
            else RecordingRule(r)
            for r in spec.rules
        ]
        self.exposures = [Exposure(store) for _ in self.rules]
        self.stale: list[
            Exposure
        ] = []  # of rules dropped by a reload: marked stale after the next evaluation
        self.evaluation_seconds = 0.0
        self.last_evaluation: int | None = None

    def equals(self, other: Group) -> bool:
        """Whether a reload left this group unchanged (then it keeps running as it is)."""
        return (
            self.key == other.key
            and self.interval == other.interval
            and self.spec.limit == other.spec.limit
            and [_signature(r.rule) for r in self.rules] == [_signature(r.rule) for r in other.rules]
        )

    def copy_state(self, old: Group) -> None:
        """Take over alerts and exposed series of rules matched by name and labels (Prometheus' CopyState)."""
        self.evaluation_seconds, self.last_evaluation = old.evaluation_seconds, old.last_evaluation
        unmatched: dict[object, list[int]] = {}
        for i, rule in enumerate(old.rules):
            unmatched.setdefault(rule_identity(rule.rule), []).append(i)
        for i, rule in enumerate(self.rules):
            indexes = unmatched.get(rule_identity(rule.rule))
            if not indexes:
                continue
            j = indexes.pop(0)
            self.exposures[i] = old.exposures[j]
            was = old.rules[j]
            if isinstance(rule, AlertingRule) and isinstance(was, AlertingRule):
                rule.active.update(was.active)
        self.stale = list(old.stale) + [old.exposures[j] for left in unmatched.values() for j in left]

    def alerting_rules(self) -> list[AlertingRule]:
        """The group's alerting rules, in file order."""
        return [r for r in self.rules if isinstance(r, AlertingRule)]

    def eval(
        self, ts: int, query: QueryFunc, resend_delay: int, clock: Callable[[], float]
    ) -> tuple[list[OutgoingAlert], int]:
        """Evaluate every rule in order at ts; return the alerts to send and how many rules failed."""
        start = clock()
        outgoing: list[OutgoingAlert] = []
        failed = 0
        interval_ms = round(self.interval * 1000)
        for rule, exposure in zip(self.rules, self.exposures, strict=True):
            began = clock()
            error: str | None = None
            try:
                samples = rule.eval(ts, query, self.spec.limit)
            except WatchdogError as exc:
                error = str(exc)
                log.warning(
                    "evaluating rule failed",
                    extra={"group": self.spec.name, "file": self.spec.file, "rule": rule.name, "err": error},
                )
            except Exception as exc:  # a bug in one evaluator must not stop the other rules or groups
                error = f"{type(exc).__name__}: {exc}"
                log.error("evaluating rule crashed", extra={"rule": rule.name, "err": error}, exc_info=True)
            else:
                if isinstance(rule, AlertingRule):
                    outgoing.extend(rule.send(ts, resend_delay, interval_ms))
                get = self.store.get
                exposure.commit([(get(labels), value, ts) for labels, value in samples], ts)
            failed += error is not None
            rule.status.record(error, ts, clock() - began)
        for gone in self.stale:
            gone.stale_all(ts)
        self.stale = []
        self.evaluation_seconds = clock() - start
        self.last_evaluation = ts
        return outgoing, failed

    def json(self, kind: str = "") -> dict[str, Any]:
        """The group in the shape of Prometheus' /api/v1/rules; kind "alert" or "record" keeps only those."""
        rules = [
            rule_json(r) if isinstance(r, AlertingRule) else r.json()
            for r in self.rules
            if not kind or (kind == "alert") == isinstance(r, AlertingRule)
        ]
        return {
            "name": self.spec.name,
            "file": self.spec.file,
            "rules": rules,
            "interval": go_number(self.interval),
            "limit": self.spec.limit,
            "evaluationTime": self.evaluation_seconds,
            "lastEvaluation": format_rfc3339(self.last_evaluation),
        }


@dataclass
class _Retired:
    """Series of a group removed by a reload: marked stale two intervals after the next evaluation."""

    exposures: list[Exposure]
    interval_ms: int
    stale_at: int | None = None


@dataclass(frozen=True)
class RuleManagerOptions:
    """How a RuleManager evaluates, links and keeps its alerts, as Prometheus' rules.ManagerOptions: every
    field set at construction. A reload (`RuleManager.update`) takes a new query, default interval, external
    labels and URL and runbook base; the state file's settings and the clock stay those it started with."""

    query: QueryFunc
    store: SampleStore
    default_interval: float
    external_labels: Mapping[str, str] = field(default_factory=dict)
    external_url: str = ""
    runbook_base: str = ""  # a relative runbook_url annotation resolves against it
    state_path: Path | None = None  # None: alert state does not survive a restart
    resend_delay: float = 60.0
    outage_tolerance: float = OUTAGE_TOLERANCE
    for_grace_period: float = FOR_GRACE_PERIOD
    state_heartbeat: float = 60.0
    clock: Callable[[], float] = time.perf_counter

    def links(self) -> tuple[dict[str, str], str, str]:
        """What the alerts carry and link to: a change rebuilds every group on reload."""
        return dict(self.external_labels), self.external_url, self.runbook_base


class RuleManager:
    """Every rule group, their alert state across reloads and restarts, and what they report."""

    def __init__(self, groups: Sequence[RuleGroup], options: RuleManagerOptions) -> None:
        self.options = options
        self.store = options.store
        self.resend_delay_ms = round(options.resend_delay * 1000)
        self.clock = options.clock
        self.groups: dict[GroupKey, Group] = {}
        self._failures: dict[GroupKey, int] = {}
        # Alerts to send, newest notice per label set; notices nobody collected within the resolved retention
        # are dropped, so the queue stays bounded while no notifier is configured.
        self._outbox: dict[tuple[tuple[str, str], ...], tuple[int, OutgoingAlert]] = {}
        self._retired: list[_Retired] = []
        self.state = StateFile(
            options.state_path,
            outage_tolerance=options.outage_tolerance,
            for_grace_period=options.for_grace_period,
            heartbeat=options.state_heartbeat,
        )
        self.update(groups)

    @property
    def persistence_errors(self) -> int:
        """How many times writing the alert state file failed."""
        return self.state.errors

    def _build(self, spec: RuleGroup) -> Group:
        o = self.options
        interval = spec.interval if spec.interval is not None else o.default_interval
        return Group(spec, interval, self.store, dict(o.external_labels), o.external_url, o.runbook_base)

    def update(self, groups: Sequence[RuleGroup], options: RuleManagerOptions | None = None) -> None:
        """Replace the groups (and, from `options`, the query, default interval and links); unchanged groups
        keep running, changed ones take over matching rules' state."""
        rebuild = options is not None and options.links() != self.options.links()
        if options is not None:
            self.options = replace(
                self.options,
                query=options.query,
                default_interval=options.default_interval,
                external_labels=dict(options.external_labels),
                external_url=options.external_url,
                runbook_base=options.runbook_base,
            )
        old, new = self.groups, {}
        for spec in groups:
            group = self._build(spec)
            previous = old.pop(group.key, None)
            if previous is not None and not rebuild and previous.equals(group):
                group = previous
            elif previous is not None:
                group.copy_state(previous)
            new[group.key] = group
        for gone in old.values():
            self._retired.append(_Retired(gone.exposures + gone.stale, round(gone.interval * 1000)))
            self._failures.pop(gone.key, None)
        self.groups = new
        self.state.keep_only(set(new))

    def group_keys(self) -> list[GroupKey]:
        """(file, name) of every group, in the order the rule files list them."""
        return list(self.groups)

    def interval(self, key: GroupKey) -> float:
        """How often a group is evaluated, in seconds."""
        return self.groups[key].interval

    def evaluate_group(self, key: GroupKey, now: float, query: QueryFunc | None = None) -> None:
        """Evaluate one group at `now` (unix seconds); alerts to send are queued for alerts_to_send."""
        group = self.groups[key]
        ts = to_ms(now)
        self.state.restore(key, group.alerting_rules(), ts)
        outgoing, failed = group.eval(ts, query or self.options.query, self.resend_delay_ms, self.clock)
        for alert in outgoing:
            ident = tuple(sorted(alert.labels.items()))
            self._outbox.pop(ident, None)
            self._outbox[ident] = (ts, alert)
        horizon = ts - RESOLVED_RETENTION_MS
        self._outbox = {k: v for k, v in self._outbox.items() if v[0] >= horizon}
        self._failures[key] = self._failures.get(key, 0) + failed
        self._retire(ts)
        self.state.save({k: (g.last_evaluation, g.alerting_rules()) for k, g in self.groups.items()}, ts)

    def evaluate_all(self, now: float) -> None:
        """Evaluate every group once at `now`, in order."""
        for key in list(self.groups):
            self.evaluate_group(key, now)

    def _retire(self, ts: int) -> None:
        keep: list[_Retired] = []
        for r in self._retired:
            if r.stale_at is None:
                r.stale_at = ts
            # Like Prometheus, wait two intervals so a renamed rule can write the same series first; the
            # markers carry the earlier time, so they are ignored for series written since.
            if ts >= r.stale_at + 2 * r.interval_ms:
                for exposure in r.exposures:
                    exposure.stale_all(r.stale_at)
            else:
                keep.append(r)
        self._retired = keep

    def alerts_to_send(self, now: float) -> list[OutgoingAlert]:
        """Alerts that evaluations up to `now` decided to send (firing, resolved, re-sent); drains them."""
        limit = to_ms(now)
        out = [a for ts, a in self._outbox.values() if ts <= limit]
        self._outbox = {k: v for k, v in self._outbox.items() if v[0] > limit}
        return out

    def alerting_rules(self) -> list[AlertingRule]:
        """Every alerting rule: groups by file and name, rules in file order, as /api/v1/alerts lists them."""
        return [r for key in sorted(self.groups) for r in self.groups[key].alerting_rules()]

    def active_alerts(self) -> list[tuple[AlertingRule, Alert]]:
        """Pending and firing alerts (copies), with their rule."""
        return [(r, a) for r in self.alerting_rules() for a in r.active_alerts()]

    def alert_series(self) -> list[tuple[dict[str, str], float]]:
        """ALERTS and ALERTS_FOR_STATE of every pending or firing alert, `__name__` included."""
        out: list[tuple[dict[str, str], float]] = []
        for group in self.groups.values():
            for rule in group.alerting_rules():
                for _, alert in sorted(rule.active.items()):
                    if alert.state != AlertState.INACTIVE:
                        out.extend((dict(labels), value) for labels, value in rule.series(alert))
        return out

    def failures(self) -> dict[str, int]:
        """Failed rule evaluations per group, keyed "file;name" as Prometheus labels rule_group."""
        return {key_name(k): n for k, n in self._failures.items()}

    def alerts_json(self) -> dict[str, Any]:
        """GET /api/v1/alerts."""
        alerts = [alert_json(a) for _, a in self.active_alerts()]
        return {"status": "success", "data": {"alerts": alerts}}

    def rules_json(self, kind: str = "") -> dict[str, Any]:
        """GET /api/v1/rules; kind "alert" or "record" keeps only those rules, as the API's ?type= does."""
        groups = [self.groups[key].json(kind) for key in sorted(self.groups)]
        return {"status": "success", "data": {"groups": groups}}


def key_name(key: GroupKey) -> str:
    """A group key as Prometheus' rule_group label writes it: "file;name"."""
    return f"{key[0]};{key[1]}"
