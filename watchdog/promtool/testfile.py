"""The promtool rule unit-test file format (`promtool test rules`), read with file:line problems."""

from __future__ import annotations

import glob
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml

from ..config.durations import parse_duration
from ..config.files import UnreadableFileError, read_text
from ..config.yamlnodes import Node, Problems, compose
from ..errors import ConfigError, Problem
from ..store import Labels
from .series import NotationError, SeriesValues, parse_metric, parse_series, parse_values

_YAML_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
_SPECIAL = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}


@dataclass(frozen=True)
class InputSeries:
    """One input series: its labels and one value (or None: missing) per interval step."""

    labels: Labels
    values: SeriesValues
    line: int


@dataclass(frozen=True)
class ExpectedAlert:
    """A firing alert an alert test expects (labels without `alertname`, which is added)."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class AlertTest:
    """Which alerts of one name must be firing at eval_time (seconds)."""

    eval_time: float
    alertname: str
    expected: tuple[ExpectedAlert, ...]
    line: int


@dataclass(frozen=True)
class ExpectedSample:
    """One sample a PromQL test expects; `labels` None when the labels string does not parse."""

    labels_text: str
    labels: Labels | None
    labels_error: str
    value: float


@dataclass(frozen=True)
class ExprTest:
    """An expression and the samples it must return at eval_time (seconds)."""

    expr: str
    eval_time: float
    expected: tuple[ExpectedSample, ...]
    line: int


@dataclass(frozen=True)
class TestGroup:
    """Input series and the tests run over them."""

    interval: float
    series: tuple[InputSeries, ...]
    alert_tests: tuple[AlertTest, ...]
    expr_tests: tuple[ExprTest, ...]
    external_labels: Mapping[str, str] = field(default_factory=dict)
    external_url: str = ""
    name: str = ""
    line: int = 1


@dataclass(frozen=True)
class TestFile:
    """A whole unit-test file; rule file globs are resolved relative to it."""

    path: str
    rule_files: tuple[str, ...]
    unmatched: tuple[str, ...]
    evaluation_interval: float
    group_eval_order: tuple[str, ...]
    groups: tuple[TestGroup, ...]


def _yaml_float(node: Node) -> float | None:
    """A YAML number as Go's yaml.v2 reads it into a float64."""
    text = _string(node)
    if node.node.tag == "tag:yaml.org,2002:str" and getattr(node.node, "style", None) in ("'", '"'):
        node.error(f"cannot read the quoted string {text!r} as a number")
        return None
    if text.lower() in _SPECIAL:
        return _SPECIAL[text.lower()]
    if _YAML_FLOAT.fullmatch(text.replace("_", "")) or re.fullmatch(r"[-+]?0x[0-9a-fA-F]+", text):
        return float(int(text, 16)) if "x" in text else float(text.replace("_", ""))
    node.error(f"must be a number, got {text!r}")
    return None


def _duration(node: Node | None) -> float:
    if node is None or node.is_null():
        return 0.0
    try:
        return parse_duration(_string(node))
    except ValueError as exc:
        node.error(str(exc))
        return 0.0


def _string(node: Node | None) -> str:
    """A scalar's text as written (promtool substitutes no environment variables); null is ""."""
    if node is None or node.is_null():
        return ""
    if not isinstance(node.node, yaml.ScalarNode):
        node.error("must be a scalar value")
        return ""
    return str(node.node.value)


def _map(node: Node | None) -> dict[str, str]:
    if node is None or node.is_null():
        return {}
    children = node.mapping()
    return {k: _string(v) for k, v in (children or {}).items()}


def _list(node: Node | None) -> list[str]:
    if node is None or node.is_null():
        return []
    return [_string(item) for item in node.items()]


def _series(node: Node) -> InputSeries | None:
    m = node.mapping({"series", "values"})
    if m is None:
        return None
    text, values = _string(m.get("series")), _string(m.get("values"))
    try:
        labels, parsed = parse_series(text, values)
    except NotationError as exc:
        try:
            parse_values(values)
            blame, shown = m.get("series"), text
        except NotationError:
            blame, shown = m.get("values"), values
        (blame or node).error(f"{exc.message} in {shown!r} at character {exc.position + 1}")
        return None
    return InputSeries(labels, parsed, node.line)


def _alert_test(node: Node) -> AlertTest | None:
    m = node.mapping({"eval_time", "alertname", "exp_alerts"})
    if m is None:
        return None
    expected = []
    for a in m["exp_alerts"].items() if "exp_alerts" in m and not m["exp_alerts"].is_null() else []:
        am = a.mapping({"exp_labels", "exp_annotations"})
        if am is not None:
            expected.append(ExpectedAlert(_map(am.get("exp_labels")), _map(am.get("exp_annotations"))))
    name = _string(m.get("alertname"))
    eval_time = _duration(m.get("eval_time"))
    if not name:
        node.error("an item under alert_rule_test misses required attribute alertname")
    return AlertTest(eval_time, name, tuple(expected), node.line)


def _expected_sample(node: Node) -> ExpectedSample | None:
    m = node.mapping({"labels", "value"})
    if m is None:
        return None
    text = _string(m.get("labels"))
    value = _yaml_float(m["value"]) if "value" in m else 0.0
    try:
        labels: Labels | None = parse_metric(text)
        error = ""
    except NotationError as exc:
        labels, error = None, exc.message
    return ExpectedSample(text, labels, error, 0.0 if value is None else value)


def _expr_test(node: Node) -> ExprTest | None:
    m = node.mapping({"expr", "eval_time", "exp_samples"})
    if m is None:
        return None
    samples = [_expected_sample(s) for s in m["exp_samples"].items()] if "exp_samples" in m else []
    if "exp_samples" in m and m["exp_samples"].is_null():
        samples = []
    return ExprTest(
        _string(m.get("expr")),
        _duration(m.get("eval_time")),
        tuple(s for s in samples if s is not None),
        node.line,
    )


_GROUP_KEYS = {
    "interval",
    "input_series",
    "alert_rule_test",
    "promql_expr_test",
    "external_labels",
    "external_url",
    "name",
}


def _items(m: dict[str, Node], key: str) -> list[Node]:
    node = m.get(key)
    if node is None or node.is_null():
        return []
    return list(node.items())


def _test_group(node: Node) -> TestGroup | None:
    m = node.mapping(_GROUP_KEYS)
    if m is None:
        return None
    series = [_series(s) for s in _items(m, "input_series")]
    alerts = [_alert_test(a) for a in _items(m, "alert_rule_test")]
    exprs = [_expr_test(e) for e in _items(m, "promql_expr_test")]
    return TestGroup(
        interval=_duration(m.get("interval")),
        series=tuple(s for s in series if s is not None),
        alert_tests=tuple(a for a in alerts if a is not None),
        expr_tests=tuple(e for e in exprs if e is not None),
        external_labels=_map(m.get("external_labels")),
        external_url=_string(m.get("external_url")),
        name=_string(m.get("name")),
        line=node.line,
    )


def _resolve(base: str, patterns: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Join relative rule-file patterns to the test file's folder and glob them (sorted, as Go does)."""
    files: list[str] = []
    unmatched: list[str] = []
    for pattern in patterns:
        full = pattern if os.path.isabs(pattern) else os.path.normpath(os.path.join(base, pattern))
        matches = sorted(glob.glob(full))
        if not matches:
            unmatched.append(full)
        files.extend(matches)
    return tuple(files), tuple(unmatched)


def parse_test_file(text: str, path: str) -> TestFile:
    """Parse a unit-test file; raise ConfigError listing every problem with file:line."""
    problems = Problems(path)
    root = compose(text, problems)
    top = (
        Node(root, "", problems, env={}).mapping(
            {"rule_files", "evaluation_interval", "group_eval_order", "tests"}
        )
        if root is not None
        else ({} if not problems.items else None)
    )
    if top is None:
        raise ConfigError(problems.items or [Problem(path, 1, "", "must be a mapping")])
    patterns = _list(top.get("rule_files"))
    order = _list(top.get("group_eval_order"))
    seen: set[str] = set()
    for name in order:
        if name in seen:
            top["group_eval_order"].error(f"group name repeated in evaluation order: {name}")
        seen.add(name)
    groups = [_test_group(t) for t in _items(top, "tests")]
    interval = _duration(top.get("evaluation_interval")) or 60.0
    if problems.items:
        raise ConfigError(problems.items)
    files, unmatched = _resolve(os.path.dirname(path), patterns)
    return TestFile(
        path=path,
        rule_files=files,
        unmatched=unmatched,
        evaluation_interval=interval,
        group_eval_order=tuple(order),
        groups=tuple(g for g in groups if g is not None),
    )


def load_test_file(path: str) -> TestFile:
    """Read and parse one unit-test file."""
    try:
        text = read_text(path)
    except UnreadableFileError as exc:
        raise ConfigError([Problem(path, 1, "(file)", f"cannot read: {exc}")]) from None
    return parse_test_file(text, path)
