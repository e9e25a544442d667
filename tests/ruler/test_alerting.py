"""The alert state machine of one rule, after Prometheus' rules/alerting_test.go and manager_test.go."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from vllm_watchdog.promql.values import QueryError, QueryFunc, Sample, Vector
from vllm_watchdog.ruler.alerting import (
    LOGGED_CHANGES,
    RESOLVED_RETENTION_MS,
    Alert,
    AlertingRule,
    AlertState,
    alert_json,
    rule_json,
)
from vllm_watchdog.ruler.files import Rule
from vllm_watchdog.store import Labels

MIN = 60_000


def sample(value: float, name: str = "http_requests", **labels: str) -> Sample:
    pairs = dict(labels, __name__=name) if name else dict(labels)
    return Sample(tuple(sorted(pairs.items())), value, 0)


def table(rows: dict[int, list[Sample]]) -> QueryFunc:
    """A query answering, at each evaluation time (ms), with the samples listed for it (none otherwise)."""

    def query(expr: str, at: float) -> Vector:
        return Vector(rows.get(round(at * 1000), []))

    return query


def alerting(
    for_: float = 0.0,
    keep: float = 0.0,
    *,
    name: str = "HTTPRequestRateLow",
    expr: str = "http_requests < 100",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    external_labels: dict[str, str] | None = None,
) -> AlertingRule:
    rule = Rule(
        name=name,
        kind="alert",
        expr=expr,
        file="rules.yml",
        line=1,
        for_=for_,
        keep_firing_for=keep,
        labels=labels or {},
        annotations=annotations or {},
    )
    return AlertingRule(rule, external_labels=external_labels)


def alerts_of(out: list[tuple[Labels, float]]) -> list[tuple[str, str]]:
    """(instance, alertstate) of the ALERTS samples of one evaluation."""
    got = []
    for labels, value in out:
        d = dict(labels)
        if d["__name__"] == "ALERTS":
            assert value == 1.0
            got.append((d.get("instance", ""), d["alertstate"]))
    return sorted(got)


def test_pending_then_firing_then_resolved_like_prometheus() -> None:
    # Prometheus' TestAlertingRule: http_requests{instance="0"} 75 85 95 105 105 95 85 and instance 1
    # 80 90 100 110 120 130 140 every 5m, `< 100` with for: 1m, evaluated every 5m.
    series = {"0": [75, 85, 95, 105, 105, 95, 85], "1": [80, 90, 100, 110, 120, 130, 140]}
    rows = {
        i * 5 * MIN: [sample(v[i], instance=k, job="app-server") for k, v in series.items() if v[i] < 100]
        for i in range(7)
    }
    rule = alerting(for_=60, labels={"severity": "critical"})
    query = table(rows)
    expected = [
        [("0", "pending"), ("1", "pending")],
        [("0", "firing"), ("1", "firing")],
        [("0", "firing")],
        [],
        [],
        [("0", "pending")],
        [("0", "firing")],
    ]
    for i, want in enumerate(expected):
        out = rule.eval(i * 5 * MIN, query)
        assert alerts_of(out) == want, i
    out = rule.eval(35 * MIN, table({35 * MIN: [sample(1, instance="0", job="app-server")]}))
    assert next(dict(labels) for labels, _ in out) == {
        "__name__": "ALERTS",
        "alertname": "HTTPRequestRateLow",
        "alertstate": "firing",
        "instance": "0",
        "job": "app-server",
        "severity": "critical",
    }


def test_alert_labels_drop_name_apply_rule_labels_and_alertname() -> None:
    rule = alerting(labels={"severity": "page", "alertname": "ignored", "instance": ""}, name="High")
    rule.eval(0, table({0: [sample(5, instance="a", job="j", alertname="x")]}))
    (alert,) = rule.active_alerts()
    # An empty rule label deletes the series label of that name, as Prometheus' label builder does.
    assert dict(alert.labels) == {"alertname": "High", "job": "j", "severity": "page"}
    assert alert.state == AlertState.FIRING  # no `for`: fires on the first evaluation


def test_labels_and_annotations_are_templated() -> None:
    rule = alerting(
        labels={"severity": "{{ $labels.job }}-crit"},
        annotations={"summary": "{{ $labels.instance }} at {{ $value }}", "env": "{{ $externalLabels.env }}"},
        external_labels={"env": "prod"},
    )
    rule.eval(0, table({0: [sample(42, instance="i1", job="api")]}))
    (alert,) = rule.active_alerts()
    assert dict(alert.labels)["severity"] == "api-crit"
    assert alert.annotations == {"summary": "i1 at 42", "env": "prod"}
    rule.eval(MIN, table({MIN: [sample(43, instance="i1", job="api")]}))
    assert rule.active_alerts()[0].annotations["summary"] == "i1 at 43"  # value and annotations refresh


def test_bad_template_renders_the_error_like_prometheus() -> None:
    rule = alerting(annotations={"summary": "{{ $labels.instance "})
    rule.eval(0, table({0: [sample(1, instance="a")]}))
    assert rule.active_alerts()[0].annotations["summary"].startswith("<error expanding template: ")


def test_duplicate_label_sets_after_alert_labels_are_an_error() -> None:
    rule = alerting(labels={"test": "test"})
    query = table({0: [sample(0, name="", test="x"), sample(0, name="")]})
    with pytest.raises(
        QueryError, match=r"^vector contains metrics with the same labelset after applying alert labels$"
    ):
        rule.eval(0, query)
    assert rule.active == {}


@pytest.mark.parametrize(
    ("limit", "error"), [(0, None), (-1, None), (2, None), (1, "exceeded limit of 1 with 2 alerts")]
)
def test_limit(limit: int, error: str | None) -> None:
    rule = alerting(for_=60, labels={"test": "test"})
    query = table({0: [sample(1, name="metric", label="1"), sample(1, name="metric", label="2")]})
    if error is None:
        rule.eval(0, query, limit)
        assert len(rule.active) == 2
    else:
        with pytest.raises(QueryError, match=f"^{error}$"):
            rule.eval(0, query, limit)
        assert rule.active == {}  # Prometheus drops every alert of the rule


def test_query_error_leaves_alert_state_untouched() -> None:
    rule = alerting(for_=60)
    rule.eval(0, table({0: [sample(1, instance="a")]}))
    before = rule.current_alerts()

    def failing(expr: str, at: float) -> Vector:
        raise QueryError("backend down")

    with pytest.raises(QueryError):
        rule.eval(MIN, failing)
    assert rule.current_alerts() == before


def test_keep_firing_for_like_prometheus() -> None:
    # TestKeepFiringFor: 75 85 70 70 10x5 every 1m, `> 50`, for 1m, keep_firing_for 1m.
    values = [75, 85, 70, 70, 10, 10, 10]
    rows = {i * MIN: [sample(v, instance="0")] for i, v in enumerate(values) if v > 50}
    rule = alerting(for_=60, keep=60, expr="http_requests > 50")
    query = table(rows)
    states = [alerts_of(rule.eval(i * MIN, query)) for i in range(6)]
    assert states == [[("0", "pending")]] + [[("0", "firing")]] * 4 + [[]]
    alert = rule.current_alerts()[0]
    assert alert.state == AlertState.INACTIVE and alert.resolved_at == 5 * MIN


def test_keep_firing_since_is_reported_and_reset() -> None:
    rule = alerting(keep=600, expr="x > 1")
    rule.eval(0, table({0: [sample(2)]}))
    rule.eval(MIN, table({}))
    doc = alert_json(rule.active_alerts()[0])
    assert doc["keepFiringSince"] == "1970-01-01T00:01:00Z" and doc["state"] == "firing"
    rule.eval(2 * MIN, table({2 * MIN: [sample(3)]}))
    assert "keepFiringSince" not in alert_json(rule.active_alerts()[0])


def test_pending_alert_does_not_keep_firing() -> None:
    # TestPendingAndKeepFiringFor: a pending alert that clears is dropped, keep_firing_for notwithstanding.
    rule = alerting(for_=60, keep=60)
    assert alerts_of(rule.eval(0, table({0: [sample(75, instance="0")]}))) == [("0", "pending")]
    assert rule.eval(MIN, table({})) == []
    assert rule.active == {}


def test_pending_that_clears_sends_nothing() -> None:
    rule = alerting(for_=300)
    rule.eval(0, table({0: [sample(1)]}))
    assert rule.send(0, MIN, MIN) == []  # pending alerts are never sent
    rule.eval(MIN, table({}))
    assert rule.send(MIN, MIN, MIN) == [] and rule.active == {}


def test_notify_resend_delay_and_resolution_like_prometheus() -> None:
    # TestNotify: a = 2 (1s), 3 (2s), 3 (5s), 0 (6s); `a > 1`, resend delay 2s, interval 1s.
    rule = alerting(expr="a > 1", name="aTooHigh")
    data = {1000: 2.0, 2000: 3.0, 3000: 3.0, 4000: 3.0, 5000: 3.0, 6000: 0.0}
    query = table({t: [sample(v, name="a")] for t, v in data.items() if v > 1})
    sent = {}
    for t in (1000, 2000, 5000, 6000):
        rule.eval(t, query)
        sent[t] = rule.send(t, 2000, 1000)
    assert [len(sent[t]) for t in (1000, 2000, 5000, 6000)] == [1, 0, 1, 1]
    first = sent[1000][0]
    assert first.state == "firing" and first.starts_at == 1.0 and first.ends_at == 1.0 + 4 * 2.0
    assert first.labels == {"alertname": "aTooHigh"}
    assert first.generator_url == "/graph?g0.expr=a+%3E+1&g0.tab=1"
    resolved = sent[6000][0]
    assert resolved.state == "resolved" and resolved.ends_at == 6.0 and resolved.starts_at == 1.0


def test_resolved_alert_is_resent_until_retention_ends() -> None:
    rule = alerting()
    rule.eval(0, table({0: [sample(1)]}))
    assert len(rule.send(0, MIN, MIN)) == 1
    rule.eval(MIN, table({}))
    assert [a.state for a in rule.send(MIN, MIN, MIN)] == ["resolved"]
    assert rule.send(MIN + 1000, MIN, MIN) == []  # within the resend delay
    ts = MIN
    resent = 0
    while ts < MIN + RESOLVED_RETENTION_MS + 2 * MIN:
        ts += MIN
        rule.eval(ts, table({}))
        resent += len(rule.send(ts, MIN, MIN))
    assert rule.active == {}  # dropped once older than 15 minutes
    # Re-sent once the resend delay has strictly passed: every other 1m evaluation, at 3m, 5m, ... 15m; the
    # evaluation at 17m (16m after resolution) drops it.
    assert resent == 7


def test_resolved_alert_that_returns_starts_pending_again() -> None:
    rule = alerting(for_=120)
    rows = {0: [sample(1)], MIN: [sample(1)], 2 * MIN: [sample(1)], 4 * MIN: [sample(1)]}
    for t in (0, MIN, 2 * MIN, 3 * MIN, 4 * MIN):
        rule.eval(t, table(rows))
    (alert,) = rule.current_alerts()
    assert alert.state == AlertState.PENDING and alert.active_at == 4 * MIN and alert.resolved_at is None


def test_alerts_for_state_value_is_active_at_seconds() -> None:
    rule = alerting(for_=600)
    out = rule.eval(90_500, table({90_500: [sample(1, instance="x")]}))
    for_state = [v for labels, v in out if dict(labels)["__name__"] == "ALERTS_FOR_STATE"]
    assert for_state == [90.0]
    assert rule.state() == AlertState.PENDING


def test_needs_sending() -> None:
    alert = Alert((), {}, AlertState.FIRING, 1.0, active_at=0)
    assert alert.needs_sending(0, 1000)
    alert.last_sent_at = 0
    assert not alert.needs_sending(1000, 1000) and alert.needs_sending(1001, 1000)
    alert.resolved_at = 500
    assert alert.needs_sending(600, 1000)  # resolved since it was last sent


def test_api_json_shapes() -> None:
    rule = alerting(
        for_=300,
        keep=60,
        labels={"severity": "page"},
        annotations={"summary": "s"},
    )
    assert rule_json(rule)["health"] == "unknown"
    rule.eval(1_700_000_000_123, table({1_700_000_000_123: [sample(0.25, instance="a")]}))
    rule.status.record(None, 1_700_000_000_123, 0.002)
    doc = rule_json(rule)
    assert doc == {
        "state": "pending",
        "name": "HTTPRequestRateLow",
        "query": "http_requests < 100",
        "duration": 300.0,
        "keepFiringFor": 60.0,
        "labels": {"severity": "page"},
        "annotations": {"summary": "s"},
        "alerts": [
            {
                "labels": {"alertname": "HTTPRequestRateLow", "instance": "a", "severity": "page"},
                "annotations": {"summary": "s"},
                "state": "pending",
                "activeAt": "2023-11-14T22:13:20.123Z",
                "value": "2.5e-01",
            }
        ],
        "health": "ok",
        "evaluationTime": 0.002,
        "lastEvaluation": "2023-11-14T22:13:20.123Z",
        "type": "alerting",
    }
    rule.status.record("boom", 0, 0.0)
    assert rule_json(rule)["lastError"] == "boom" and rule_json(rule)["health"] == "err"


def test_rule_labels_templated_to_empty_are_dropped_from_alerts() -> None:
    # TestAlertingRuleEmptyLabelFromTemplate
    rule = alerting(for_=60, labels={"empty_label": ""}, name="EmptyLabel")
    out = rule.eval(0, table({0: [sample(75, instance="0", job="app-server")]}))
    names: Callable[[Labels], set[str]] = lambda labels: {k for k, _ in labels}  # noqa: E731
    assert all("empty_label" not in names(labels) for labels, _ in out)


def test_alert_series_labels_follow_the_state_and_stay_bounded() -> None:
    rule = alerting(for_=60.0, labels={"severity": "page", "empty": ""})
    rows = {i * MIN: [sample(float(i), instance=f"i{j}") for j in range(i, i + 30)] for i in range(40)}
    query = table(rows)
    out = rule.eval(0, query)
    assert dict(out[0][0]) == {
        "__name__": "ALERTS",
        "alertname": "HTTPRequestRateLow",
        "alertstate": "pending",
        "instance": "i0",
        "severity": "page",
    }
    assert dict(out[1][0])["__name__"] == "ALERTS_FOR_STATE" and "alertstate" not in dict(out[1][0])
    for ts in sorted(rows)[1:]:
        out = rule.eval(ts, query)
    # i39 is returned from 10m on, so it fires; i68 only now. Each label set gets the state it has now.
    assert ("i39", "firing") in alerts_of(out) and ("i68", "pending") in alerts_of(out)
    assert len(rule._series_labels) <= 4 * len(rule.active) + 64 + 2


def test_each_state_change_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Pending, firing and resolved each give one line, naming the alert and its labels; a resolved alert
    kept for re-sending, a pending one that clears and an unchanged one give none."""
    rows = {0: [sample(5, instance="a")], MIN: [sample(5, instance="a"), sample(7, instance="b")]}
    rule = alerting(for_=60)
    caplog.set_level("INFO", logger="vllm_watchdog.ruler.alerting")
    seen = []
    for ts in (0, MIN, 2 * MIN, 3 * MIN):
        caplog.clear()
        rule.eval(ts, table(rows))
        seen.append([(r.getMessage(), getattr(r, "labels", "")) for r in caplog.records])
        assert {getattr(r, "alertname", None) for r in caplog.records} <= {"HTTPRequestRateLow"}
    assert seen == [
        [("alert pending", 'instance="a"')],
        [("alert firing", 'instance="a"'), ("alert pending", 'instance="b"')],
        [("alert resolved", 'instance="a"')],  # b was pending: dropped without a line
        [],
    ]
    assert (
        all(getattr(r, "alertname", None) == "HTTPRequestRateLow" for r in caplog.records)
        or not caplog.records
    )


def test_a_rule_with_many_changes_logs_a_count_past_the_cap(caplog: pytest.LogCaptureFixture) -> None:
    many = [sample(1, instance=str(i)) for i in range(LOGGED_CHANGES + 7)]
    caplog.set_level("INFO", logger="vllm_watchdog.ruler.alerting")
    alerting().eval(0, table({0: many}))
    lines = [r.getMessage() for r in caplog.records]
    assert lines.count("alert firing") == LOGGED_CHANGES and lines[-1] == "alert changes"
    assert caplog.records[-1].more == 7  # type: ignore[attr-defined]
