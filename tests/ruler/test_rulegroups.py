"""Rule groups and the RuleManager: recording, staleness, health, reloads, persistence and the HTTP API shapes."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.clock import T0
from vllm_watchdog.promql.values import QueryError, QueryFunc, Sample, Vector, to_ms
from vllm_watchdog.ruler.files import RuleGroup, parse_rule_file
from vllm_watchdog.ruler.groups import RuleManager, RuleManagerOptions
from vllm_watchdog.store import SampleStore, is_stale, make_labels


def store_query(store: SampleStore, calls: list[str] | None = None) -> QueryFunc:
    """A tiny stand-in for the engine: `name` or `name > N` over the newest samples (5m lookback)."""

    def query(expr: str, at: float) -> Vector:
        if calls is not None:
            calls.append(expr)
        name, _, threshold = expr.partition(" > ")
        t = to_ms(at)
        out = Vector()
        for series in store.select(name):
            got = series.at(t, 300_000)
            if got is not None and (not threshold or got[1] > float(threshold)):
                out.append(Sample(series.labels, got[1], t))
        return out

    return query


def groups(text: str, file: str = "rules.yml") -> list[RuleGroup]:
    return parse_rule_file(text, file)


def newest(store: SampleStore, name: str, **labels: str) -> float | None:
    series = store.get(make_labels(name, labels))
    return series.vals[-1] if len(series) else None


RULES = """
groups:
  - name: g
    rules:
      - record: job:up:sum
        expr: up
        labels: {source: rule}
      - alert: Down
        expr: job:up:sum > 0
        for: 2m
        labels: {severity: page}
        annotations: {summary: "{{ $labels.instance }} is down"}
"""


def manager(
    store: SampleStore, text: str = RULES, *, state_path: Path | None = None, state_heartbeat: float = 60.0
) -> RuleManager:
    return RuleManager(
        groups(text),
        RuleManagerOptions(
            store_query(store),
            store,
            default_interval=60.0,
            state_path=state_path,
            state_heartbeat=state_heartbeat,
        ),
    )


def test_recorded_series_are_written_and_read_by_later_rules() -> None:
    store = SampleStore(retention=3600)
    store.append(make_labels("up", {"instance": "a"}), to_ms(T0), 1.0)
    m = manager(store)
    m.evaluate_group(("rules.yml", "g"), T0)
    assert newest(store, "job:up:sum", instance="a", source="rule") == 1.0
    (alert,) = [a for _, a in m.active_alerts()]
    assert dict(alert.labels) == {"alertname": "Down", "instance": "a", "severity": "page", "source": "rule"}
    assert alert.annotations == {"summary": "a is down"}
    assert (
        newest(
            store,
            "ALERTS",
            alertname="Down",
            alertstate="pending",
            instance="a",
            severity="page",
            source="rule",
        )
        == 1.0
    )
    assert newest(
        store, "ALERTS_FOR_STATE", alertname="Down", instance="a", severity="page", source="rule"
    ) == math.floor(T0)


def test_vanished_series_get_staleness_markers() -> None:
    store = SampleStore(retention=3600)
    up = make_labels("up", {"instance": "a"})
    store.append(up, to_ms(T0), 1.0)
    m = manager(store)
    key = ("rules.yml", "g")
    m.evaluate_group(key, T0)
    store.get(up).mark_stale(to_ms(T0 + 30))
    m.evaluate_group(key, T0 + 60)
    assert is_stale(newest(store, "job:up:sum", instance="a", source="rule") or 0.0)
    assert is_stale(
        newest(
            store,
            "ALERTS",
            alertname="Down",
            alertstate="pending",
            instance="a",
            severity="page",
            source="rule",
        )
        or 0.0
    )
    assert m.active_alerts() == []  # the pending alert was dropped


def test_firing_alert_changes_its_alerts_series_and_stales_the_pending_one() -> None:
    store = SampleStore(retention=3600)
    store.append(make_labels("up", {"instance": "a"}), to_ms(T0), 1.0)
    m = manager(store)
    key = ("rules.yml", "g")
    for i in range(3):
        store.append(make_labels("up", {"instance": "a"}), to_ms(T0 + 60 * i), 1.0)
        m.evaluate_group(key, T0 + 60 * i)
    labels = {"alertname": "Down", "instance": "a", "severity": "page", "source": "rule"}
    assert newest(store, "ALERTS", alertstate="firing", **labels) == 1.0
    assert is_stale(newest(store, "ALERTS", alertstate="pending", **labels) or 0.0)
    assert m.alert_series() == [
        ({"__name__": "ALERTS", "alertstate": "firing", **labels}, 1.0),
        ({"__name__": "ALERTS_FOR_STATE", **labels}, math.floor(T0)),
    ]
    sent = m.alerts_to_send(T0 + 120)
    assert [(a.state, a.starts_at, a.ends_at) for a in sent] == [("firing", T0 + 120, T0 + 120 + 240)]
    assert m.alerts_to_send(T0 + 120) == []  # drained


def test_scalar_result_is_recorded_without_labels() -> None:
    store = SampleStore(retention=3600)
    m = RuleManager(
        groups("groups: [{name: s, rules: [{record: one, expr: '1'}]}]"),
        RuleManagerOptions(
            lambda expr, at: Vector([Sample((), 1.0, to_ms(at))]), store, default_interval=10.0
        ),
    )
    m.evaluate_all(T0)
    assert newest(store, "one") == 1.0


def test_query_error_marks_rule_unhealthy_and_keeps_state_and_series() -> None:
    store = SampleStore(retention=3600)
    up = make_labels("up", {"instance": "a"})
    store.append(up, to_ms(T0), 1.0)
    m = manager(store)
    key = ("rules.yml", "g")
    m.evaluate_group(key, T0)
    before = m.active_alerts()

    def failing(expr: str, at: float) -> Vector:
        raise QueryError("connection refused")

    m.evaluate_group(key, T0 + 60, query=failing)
    assert m.active_alerts() == before
    rules = m.rules_json()["data"]["groups"][0]["rules"]
    assert [(r["health"], r["lastError"]) for r in rules] == [("err", "connection refused")] * 2
    assert m.failures() == {"rules.yml;g": 2}
    # Prometheus writes no staleness markers for a rule whose evaluation failed.
    assert newest(store, "job:up:sum", instance="a", source="rule") == 1.0
    m.evaluate_group(key, T0 + 120)
    rules = m.rules_json()["data"]["groups"][0]["rules"]
    assert [(r["health"], "lastError" in r) for r in rules] == [("ok", False)] * 2


def test_recording_rule_errors_for_duplicates_and_limit() -> None:
    store = SampleStore(retention=3600)
    text = """
groups:
  - name: dup
    rules: [{record: r, expr: metric, labels: {label: same}}]
  - name: lim
    limit: 1
    rules: [{record: r2, expr: metric}]
"""
    m = manager(store, text)
    for second in range(3):  # the later evaluations find the recorded labels in the rule's cache
        for i in ("1", "2"):
            store.append(make_labels("metric", {"label": i}), to_ms(T0 + second), 1.0)
        m.evaluate_all(T0 + second)
        errors = [g["rules"][0]["lastError"] for g in m.rules_json()["data"]["groups"]]
        assert errors == [
            "vector contains metrics with the same labelset after applying rule labels",
            "exceeded limit of 1 with 2 series",
        ]


def test_update_keeps_unchanged_groups_and_carries_state_to_a_longer_for() -> None:
    store = SampleStore(retention=3600)
    up = make_labels("up", {"instance": "a"})
    m = manager(store)
    key = ("rules.yml", "g")
    for i in range(2):
        store.append(up, to_ms(T0 + 60 * i), 1.0)
        m.evaluate_group(key, T0 + 60 * i)
    same = m.groups[key]
    m.update(groups(RULES))
    assert m.groups[key] is same  # unchanged: the same group keeps running

    m.update(groups(RULES.replace("for: 2m", "for: 5m")))
    assert m.groups[key] is not same
    for i in range(2, 6):
        store.append(up, to_ms(T0 + 60 * i), 1.0)
        m.evaluate_group(key, T0 + 60 * i)
        (alert,) = [a for _, a in m.active_alerts()]
        assert alert.active_at == to_ms(T0)  # the countdown carried over
        assert str(alert.state) == ("firing" if i >= 5 else "pending"), i
    assert m.interval(key) == 60.0


def test_update_changes_default_interval_and_stales_removed_rules_and_groups() -> None:
    store = SampleStore(retention=3600)
    store.append(make_labels("up", {"instance": "a"}), to_ms(T0), 1.0)
    text = RULES + "  - name: other\n    rules: [{record: copy, expr: up}]\n"
    m = manager(store, text)
    m.evaluate_all(T0)
    assert newest(store, "copy", instance="a") == 1.0
    # Drop the recording rule of g and the whole group "other".
    m.update(
        groups(RULES.replace("labels: {source: rule}", "labels: {source: rule2}")),
        replace(m.options, default_interval=30.0),
    )
    assert m.interval(("rules.yml", "g")) == 30.0 and m.group_keys() == [("rules.yml", "g")]
    m.evaluate_group(("rules.yml", "g"), T0 + 30)
    # A changed rule is a different rule: its old series go stale at the end of the next evaluation.
    assert is_stale(newest(store, "job:up:sum", instance="a", source="rule") or 0.0)
    assert newest(store, "job:up:sum", instance="a", source="rule2") == 1.0
    # A removed group's series go stale two of its intervals later, at the time of the first evaluation after.
    assert newest(store, "copy", instance="a") == 1.0
    m.evaluate_group(("rules.yml", "g"), T0 + 150)
    series = store.get(make_labels("copy", {"instance": "a"}))
    assert is_stale(series.vals[-1]) and series.ts[-1] == to_ms(T0 + 30)


def test_alerts_json_and_rules_json_shapes() -> None:
    store = SampleStore(retention=3600)
    store.append(make_labels("up", {"instance": "a"}), to_ms(T0), 1.0)
    m = manager(store)
    doc = m.rules_json()
    group = doc["data"]["groups"][0]
    assert group["lastEvaluation"] == "0001-01-01T00:00:00Z" and group["rules"][0]["health"] == "unknown"
    m.evaluate_all(T0)
    assert m.alerts_json() == {
        "status": "success",
        "data": {
            "alerts": [
                {
                    "labels": {"alertname": "Down", "instance": "a", "severity": "page", "source": "rule"},
                    "annotations": {"summary": "a is down"},
                    "state": "pending",
                    "activeAt": "2023-11-14T22:13:20Z",
                    "value": "1e+00",
                }
            ]
        },
    }
    doc = m.rules_json()
    assert doc["status"] == "success"
    group = doc["data"]["groups"][0]
    assert set(group) == {"name", "file", "rules", "interval", "limit", "evaluationTime", "lastEvaluation"}
    assert (group["name"], group["file"], group["interval"], group["limit"]) == ("g", "rules.yml", 60.0, 0)
    assert group["lastEvaluation"] == "2023-11-14T22:13:20Z"
    record, alert = group["rules"]
    assert set(record) == {"name", "query", "labels", "health", "evaluationTime", "lastEvaluation", "type"}
    assert record["type"] == "recording" and alert["type"] == "alerting" and alert["state"] == "pending"
    assert [r["type"] for r in m.rules_json("record")["data"]["groups"][0]["rules"]] == ["recording"]
    json.dumps(doc)


def test_undrained_notices_keep_only_the_newest_per_alert() -> None:
    store = SampleStore(retention=7200)
    m = manager(store, SLOW)
    for i in range(40):
        feed(store, T0 + 60 * i)
        m.evaluate_group(("rules.yml", "slow"), T0 + 60 * i)
    sent = m.alerts_to_send(T0 + 60 * 39)
    # One notice per alert: its latest re-send (Slow fired at 30m and was last re-sent at 38m, Quick at 39m).
    assert sorted((a.labels["alertname"], a.ends_at) for a in sent) == [
        ("Quick", T0 + 60 * 39 + 240),
        ("Slow", T0 + 60 * 38 + 240),
    ]


def test_reload_matches_duplicate_rules_in_order() -> None:
    text = """
groups:
  - name: d
    rules:
      - {alert: Same, expr: latency > 1, for: 10m}
      - {alert: Same, expr: latency > 1, for: 20m}
"""
    store = SampleStore(retention=7200)
    m = manager(store, text)
    key = ("rules.yml", "d")
    feed(store, T0)
    m.evaluate_group(key, T0)
    firsts = [id(next(iter(r.active.values()))) for r in m.groups[key].alerting_rules()]
    m.update(groups(text.replace("20m", "30m")))
    assert [id(next(iter(r.active.values()))) for r in m.groups[key].alerting_rules()] == firsts


# --- persistence across restarts ------------------------------------------------------------------------------

SLOW = """
groups:
  - name: slow
    rules:
      - alert: Slow
        expr: latency > 1
        for: 30m
      - alert: Quick
        expr: latency > 1
        for: 1m
        labels: {speed: quick}
"""


def feed(store: SampleStore, t: float, value: float = 2.0) -> None:
    store.append(make_labels("latency", {"instance": "a"}), to_ms(t), value)


def slow_states(m: RuleManager) -> dict[str, tuple[str, int]]:
    return {rule.name: (str(a.state), a.active_at) for rule, a in m.active_alerts()}


def test_restart_restores_for_countdown_like_prometheus(tmp_path: Path) -> None:
    state = tmp_path / "alerts.json"
    store = SampleStore(retention=7200)
    m = manager(store, SLOW, state_path=state)
    key = ("rules.yml", "slow")
    for i in range(11):  # 10 minutes pending
        feed(store, T0 + 60 * i)
        m.evaluate_group(key, T0 + 60 * i)
    assert slow_states(m) == {"Slow": ("pending", to_ms(T0)), "Quick": ("firing", to_ms(T0))}
    assert json.loads(state.read_text())["groups"][0]["evaluated_at"] == to_ms(T0 + 600)

    # Down for 5 minutes: the outage does not count towards `for` (20 minutes remain, more than the grace).
    store2 = SampleStore(retention=7200)
    m2 = manager(store2, SLOW, state_path=state)
    feed(store2, T0 + 900)
    m2.evaluate_group(key, T0 + 900)
    assert slow_states(m2) == {"Slow": ("pending", to_ms(T0 + 300)), "Quick": ("firing", to_ms(T0))}
    sent = m2.alerts_to_send(T0 + 900)  # re-sent (the delay has passed) as the same alert, FiredAt kept
    assert [(a.labels["alertname"], a.state, a.starts_at) for a in sent] == [("Quick", "firing", T0 + 60)]


def test_restart_keeps_at_least_the_grace_period(tmp_path: Path) -> None:
    state = tmp_path / "alerts.json"
    store = SampleStore(retention=7200)
    m = manager(store, SLOW, state_path=state, state_heartbeat=0.0)
    key = ("rules.yml", "slow")
    for i in range(26):  # 25 minutes pending: 5 left, less than the 10 minute grace period
        feed(store, T0 + 60 * i)
        m.evaluate_group(key, T0 + 60 * i)
    m2 = manager(store, SLOW, state_path=state)
    feed(store, T0 + 1560)
    m2.evaluate_group(key, T0 + 1560)
    # Fires the grace period after the restart: ActiveAt = now + grace - for.
    assert slow_states(m2)["Slow"] == ("pending", to_ms(T0 + 1560 + 600 - 1800))


def test_restart_after_the_outage_tolerance_starts_over(tmp_path: Path) -> None:
    state = tmp_path / "alerts.json"
    store = SampleStore(retention=7200)
    m = manager(store, SLOW, state_path=state)
    key = ("rules.yml", "slow")
    feed(store, T0)
    m.evaluate_group(key, T0)
    m2 = manager(store, SLOW, state_path=state)
    later = T0 + 3601 + 60
    feed(store, later)
    m2.evaluate_group(key, later)
    assert slow_states(m2) == {"Slow": ("pending", to_ms(later)), "Quick": ("pending", to_ms(later))}


def test_resolved_alert_survives_a_restart_and_is_resent(tmp_path: Path) -> None:
    state = tmp_path / "alerts.json"
    store = SampleStore(retention=7200)
    m = manager(store, SLOW, state_path=state)
    key = ("rules.yml", "slow")
    for i in range(3):
        feed(store, T0 + 60 * i)
        m.evaluate_group(key, T0 + 60 * i)
    feed(store, T0 + 180, 0.0)
    m.evaluate_group(key, T0 + 180)
    m.alerts_to_send(T0 + 180)
    m2 = manager(store, SLOW, state_path=state)
    m2.evaluate_group(key, T0 + 300)
    sent = m2.alerts_to_send(T0 + 300)
    assert [(a.labels["alertname"], a.state, a.ends_at) for a in sent] == [("Quick", "resolved", T0 + 180)]


def test_missing_and_corrupt_state_files_start_empty_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SampleStore(retention=3600)
    state = tmp_path / "alerts.json"
    with caplog.at_level(logging.INFO):
        manager(store, SLOW, state_path=state)
    # a first start is normal: noted at info level, naming the file, and never a warning
    assert str(state) in caplog.text and not [r for r in caplog.records if r.levelno >= logging.WARNING]
    for junk in (
        "{not json",
        '{"version": 1, "groups": [{"file": 3}]}',
        "[]",
        '{"version": 99, "groups": []}',
    ):
        caplog.clear()
        state.write_text(junk)
        with caplog.at_level(logging.WARNING):
            m = manager(store, SLOW, state_path=state)
        assert "corrupt" in caplog.text and str(state) in caplog.text
        feed(store, T0)
        m.evaluate_group(("rules.yml", "slow"), T0)
        assert len(m.active_alerts()) == 2
        assert json.loads(state.read_text())["version"] == 1  # replaced by a good file


def test_unwritable_state_dir_counts_errors_and_keeps_running(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = SampleStore(retention=3600)
    m = manager(store, SLOW, state_path=blocker / "alerts.json")
    with caplog.at_level(logging.ERROR):
        for i in range(3):
            feed(store, T0 + 60 * i)
            m.evaluate_group(("rules.yml", "slow"), T0 + 60 * i)
    assert m.persistence_errors >= 1
    assert caplog.text.count("cannot write alert state") == 1  # logged once per failure streak
    assert len(m.active_alerts()) == 2


def test_state_is_written_only_on_change_or_heartbeat(tmp_path: Path) -> None:
    state = tmp_path / "alerts.json"
    store = SampleStore(retention=7200)
    m = manager(store, SLOW, state_path=state, state_heartbeat=300.0)
    key = ("rules.yml", "slow")
    writes = []
    for i in range(8):
        feed(store, T0 + 60 * i, 2.0 + i)  # the value changes every time; that alone is not worth a write
        m.evaluate_group(key, T0 + 60 * i)
        writes.append(json.loads(state.read_text())["groups"][0]["evaluated_at"])
    # Written when alerts appear (0), when Quick fires (1m), then by the 5-minute heartbeat while Slow pends.
    assert sorted({(w - to_ms(T0)) // 60_000 for w in writes}) == [0, 1, 6]


def test_state_of_groups_not_yet_evaluated_survives_writes(tmp_path: Path) -> None:
    state = tmp_path / "alerts.json"
    two = SLOW + "  - name: other\n    rules: [{alert: Other, expr: latency > 1, for: 1h}]\n"
    store = SampleStore(retention=7200)
    m = manager(store, two, state_path=state, state_heartbeat=0.0)
    for t in (T0, T0 + 60):
        feed(store, t)
        m.evaluate_all(t)
    m2 = manager(store, two, state_path=state)
    feed(store, T0 + 120)
    m2.evaluate_group(("rules.yml", "slow"), T0 + 120)  # changes state and writes the file
    m3 = manager(store, two, state_path=state)
    feed(store, T0 + 180)
    m3.evaluate_group(("rules.yml", "other"), T0 + 180)
    # Pending for 60s when last evaluated (T0+60); the 120s until now do not count.
    assert {r.name: a.active_at for r, a in m3.active_alerts()} == {"Other": to_ms(T0 + 120)}


def test_real_engine_integration() -> None:
    engine_mod = pytest.importorskip("vllm_watchdog.promql.engine")
    store = SampleStore(retention=3600)
    for i in range(6):
        store.append(make_labels("http_requests_total", {"job": "api"}), to_ms(T0 + 15 * i), 10.0 * i)
    text = """
groups:
  - name: rates
    rules:
      - record: job:http_requests:rate1m
        expr: sum by (job) (rate(http_requests_total[1m]))
      - alert: Busy
        expr: job:http_requests:rate1m > 0.5
        annotations: {summary: "{{ $labels.job }}"}
"""
    query = engine_mod.vector_query(engine_mod.Engine(store))
    m = RuleManager(groups(text), RuleManagerOptions(query, store, default_interval=15.0))
    m.evaluate_all(T0 + 75)
    rate = newest(store, "job:http_requests:rate1m", job="api")
    assert rate is not None and rate == pytest.approx(10.0 / 15.0)
    assert [a.labels["alertname"] for a in m.alerts_to_send(T0 + 75)] == ["Busy"]


def test_restored_alert_waits_for_history_before_resolving(tmp_path: Path) -> None:
    """After a restart the store is empty: a restored alert on rate(x[5m]) holds until 5m of data exist."""
    groups = tuple(
        parse_rule_file("groups: [{name: g, rules: [{alert: Hot, expr: 'rate(x[5m]) > 0'}]}]", "r.yml")
    )
    hits = Vector([Sample((("instance", "a"),), 1.0, 0)])
    state = tmp_path / "alerts.json"
    first = RuleManager(
        groups,
        RuleManagerOptions(lambda e, t: hits, SampleStore(600), default_interval=1.0, state_path=state),
    )
    (key,) = first.group_keys()
    first.evaluate_group(key, 1000.0)
    ((_, alert),) = first.active_alerts()
    assert str(alert.state) == "firing"

    empty = Vector()
    again = RuleManager(
        groups,
        RuleManagerOptions(lambda e, t: empty, SampleStore(600), default_interval=1.0, state_path=state),
    )
    again.evaluate_group(key, 1010.0)
    ((_, held),) = again.active_alerts()
    assert str(held.state) == "firing" and held.active_at == alert.active_at
    again.evaluate_group(key, 1010.0 + 300.0)  # 5m of history could exist now: absence means resolved
    assert again.active_alerts() == [] or all(str(a.state) == "inactive" for _, a in again.active_alerts())
