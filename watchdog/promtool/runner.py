"""`vllm-watchdog test-rules`: run promtool-format rule unit tests exactly as `promtool test rules` 2.42 does.

Per test group: input samples sit at multiples of `interval` from t=0 and become visible step by step; every
rule group is evaluated at each multiple of `evaluation_interval` from 0 to the largest eval_time; alert tests
compare the firing alerts at the last step at or before their eval_time; PromQL tests run afterwards over what
was loaded and written (recording rules, ALERTS). Values compare exactly, like promtool (reflect.DeepEqual).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

from ..errors import ConfigError
from ..formats.gostrconv import format_float, go_quote
from ..promql.engine import Engine, vector_query
from ..promql.values import PromQLError, QueryError, Scalar, Vector
from ..ruler.alerting import AlertState
from ..ruler.files import load_rule_files
from ..ruler.groups import Group
from ..store import Labels, SampleStore
from ..templates.gofmt import go_labels, indent_lines
from ..templates.gotime import model_duration, time_duration
from .testfile import AlertTest, ExprTest, TestFile, TestGroup, load_test_file

_INDENT = " " * 12


@dataclass(frozen=True, order=True)
class _AlertView:
    """A firing alert as compared: labels (with alertname) and annotations, both sorted."""

    labels: Labels
    annotations: Labels

    def render(self) -> str:
        return f"Labels:{go_labels(self.labels)}\nAnnotations:{go_labels(self.annotations)}"


def _render_alerts(alerts: list[_AlertView]) -> str:
    """promtool's labelsAndAnnotations.String()."""
    if not alerts:
        return "[]"
    parts = [f"{i}:" + indent_lines("\n" + a.render(), "  ") for i, a in enumerate(alerts)]
    return "[\n" + ",\n".join(parts) + "\n]"


def _render_samples(samples: list[tuple[Labels, float]]) -> str:
    if not samples:
        return "nil"
    return ", ".join(f"{go_labels(labels)} {format_float(value, 'E')}" for labels, value in samples)


def _same_float(a: float, b: float) -> bool:
    return a == b  # Go's DeepEqual: NaN never equals NaN


def _sorted_pairs(items: Mapping[str, str]) -> Labels:
    return tuple(sorted(items.items()))


class RuleHarness:
    """The rule groups of a test, evaluated in promtool's order over one store and engine."""

    def __init__(
        self,
        rule_files: Sequence[str],
        store: SampleStore,
        *,
        evaluation_interval: float,
        default_interval: float,
        external_labels: Mapping[str, str],
        external_url: str,
        order: Sequence[str],
    ) -> None:
        self.engine = Engine(store, lookback=300.0, default_step=evaluation_interval)
        self.query = vector_query(self.engine)
        specs = load_rule_files(rule_files)
        rank = {name: i for i, name in enumerate(order)}
        # promtool sorts by position in group_eval_order; unlisted groups rank 0, like the first listed one.
        specs = tuple(sorted(specs, key=lambda g: rank.get(g.name, 0)))
        self.groups = [
            Group(spec, spec.interval or default_interval, store, external_labels, external_url)
            for spec in specs
        ]

    def evaluate(self, ts_ms: int) -> list[tuple[str, str]]:
        """Evaluate every group at ts_ms; return (rule name, error) for each rule that failed."""
        failures: list[tuple[str, str]] = []
        for group in self.groups:
            group.eval(ts_ms, self.query, resend_delay=60_000, clock=lambda: 0.0)
            failures += [
                (r.name, r.status.last_error) for r in group.rules if r.status.last_error is not None
            ]
        return failures

    def firing_alerts(self, names: set[str]) -> list[tuple[str, Labels, Mapping[str, str]]]:
        """(alertname, labels, annotations) of each firing alert of the rules with these names."""
        return [
            (rule.name, alert.labels, alert.annotations)
            for group in self.groups
            for rule in group.alerting_rules()
            if rule.name in names
            for alert in rule.active_alerts()
            if alert.state == AlertState.FIRING
        ]


class _Run:
    """One test group run: its store, rules and the errors it collects."""

    def __init__(self, test_file: TestFile, group: TestGroup) -> None:
        self.file = test_file
        self.group = group
        self.errors: list[str] = []
        self.store = SampleStore(retention=math.inf)
        # A series given twice: the last definition wins, as in promtool's loader.
        self.series = [
            (self.store.get(s.labels), s.values) for s in {s.labels: s for s in group.series}.values()
        ]
        self.cursor = [0] * len(self.series)

    def _load(self, upto_ms: int) -> None:
        """Append every input sample at or before upto_ms that is not in the store yet."""
        step_ms = round(self.group.interval * 1000)
        for i, (series, values) in enumerate(self.series):
            while self.cursor[i] < len(values) and self.cursor[i] * step_ms <= upto_ms:
                value = values[self.cursor[i]]
                if value is not None:
                    series.append(self.cursor[i] * step_ms, value)
                self.cursor[i] += 1
            if len(series):
                self.store.register(series)

    def run(self) -> list[str]:
        group = self.group
        try:
            harness = RuleHarness(
                self.file.rule_files,
                self.store,
                evaluation_interval=self.file.evaluation_interval,
                default_interval=group.interval,
                external_labels=group.external_labels,
                external_url=group.external_url,
                order=self.file.group_eval_order,
            )
        except ConfigError as exc:
            return [str(p) for p in exc.problems]
        step_ms = round(self.file.evaluation_interval * 1000)
        max_ms = max(
            [round(t.eval_time * 1000) for t in group.alert_tests]
            + [round(t.eval_time * 1000) for t in group.expr_tests]
            + [0]
        )
        alert_times = sorted({round(t.eval_time * 1000) for t in group.alert_tests})
        curr = 0
        ts = 0
        while ts <= max_ms:
            self._load(ts)
            failures = harness.evaluate(ts)
            if failures:
                self.errors += [
                    f"    rule: {name}, time: {time_duration(ts / 1000)}, err: {err}"
                    for name, err in failures
                ]
                return self.errors
            while curr < len(alert_times) and ts <= alert_times[curr] < ts + step_ms:
                self._check_alerts(harness, alert_times[curr])
                curr += 1
            ts += step_ms
        for test in group.expr_tests:
            self._check_expr(harness, test)
        return self.errors

    def _check_alerts(self, harness: RuleHarness, at_ms: int) -> None:
        tests = [t for t in self.group.alert_tests if round(t.eval_time * 1000) == at_ms]
        got: dict[str, list[_AlertView]] = {}
        for name, labels, notes in harness.firing_alerts({t.alertname for t in tests}):
            got.setdefault(name, []).append(_AlertView(labels, _sorted_pairs(notes)))
        for test in tests:
            self._compare_alerts(test, sorted(got.get(test.alertname, [])))

    def _compare_alerts(self, test: AlertTest, got: list[_AlertView]) -> None:
        expected = sorted(
            _AlertView(_sorted_pairs({**a.labels, "alertname": test.alertname}), _sorted_pairs(a.annotations))
            for a in test.expected
        )
        if expected == got:
            return
        name = f"    name: {self.group.name},\n" if self.group.name else ""
        self.errors.append(
            f"{name}    alertname: {test.alertname}, time: {model_duration(test.eval_time)}, \n"
            f"        exp:{indent_lines(_render_alerts(expected), _INDENT)}, \n"
            f"        got:{indent_lines(_render_alerts(got), _INDENT)}"
        )

    def _check_expr(self, harness: RuleHarness, test: ExprTest) -> None:
        where = f"    expr: {go_quote(test.expr)}, time: {model_duration(test.eval_time)}"
        try:
            value = harness.engine.query(test.expr, test.eval_time)
        except (PromQLError, QueryError) as exc:
            self.errors.append(f"{where}, err: {exc}")
            return
        if isinstance(value, Scalar):
            got: list[tuple[Labels, float]] = [((), value.value)]
        elif isinstance(value, Vector):
            got = [(s.labels, s.value) for s in value]
        else:
            self.errors.append(f"{where}, err: rule result is not a vector or scalar")
            return
        expected: list[tuple[Labels, float]] = []
        for sample in test.expected:
            if sample.labels is None:
                self.errors.append(
                    f"{where}, err: labels {go_quote(sample.labels_text)}: {sample.labels_error}"
                )
                return
            expected.append((sample.labels, sample.value))
        expected.sort(key=lambda s: s[0])
        got.sort(key=lambda s: s[0])
        same = len(expected) == len(got) and all(
            e[0] == g[0] and _same_float(e[1], g[1]) for e, g in zip(expected, got, strict=True)
        )
        if not same:
            self.errors.append(
                f"{where},\n        exp: {_render_samples(expected)}\n        got: {_render_samples(got)}"
            )


def _test_file(path: str, out: TextIO, err: TextIO) -> bool:
    out.write(f"Unit Testing:  {path}\n")
    try:
        test_file = load_test_file(path)
    except ConfigError as exc:
        errors = [str(p) for p in exc.problems]
    else:
        for pattern in test_file.unmatched:
            err.write(f"  WARNING: no file match pattern {pattern}\n")
        errors = []
        for group in test_file.groups:
            errors += _Run(test_file, group).run()
    if errors:
        err.write("  FAILED:\n")
        for message in errors:
            err.write(message + "\n")
            out.write("\n")
    else:
        out.write("  SUCCESS\n")
    out.write("\n")
    return not errors


def run_rule_tests(paths: Iterable[str], out: TextIO, err: TextIO | None = None) -> int:
    """Run every unit-test file like `promtool test rules`; 0 if all pass, 1 if any fails or is invalid."""
    ok = True
    for path in paths:
        ok = _test_file(path, out, err if err is not None else out) and ok
    return 0 if ok else 1
