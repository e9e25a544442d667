"""Prometheus rule files: structure, expressions and what they need from the sample store."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import promql_parser

from ..config.durations import parse_duration
from ..config.files import UnreadableFileError, read_text
from ..config.yamlnodes import Node, Problems, compose
from ..errors import ConfigError, Problem
from ..promql.compile import compile_expr
from ..promql.positions import parse_error_text
from ..promql.values import PromQLError
from ..sources.storeneeds import StoreNeeds
from ..templates import check_template


@dataclass(frozen=True)
class Rule:
    """One alerting or recording rule."""

    name: str
    kind: str  # "alert" or "record"
    expr: str
    file: str
    line: int
    for_: float = 0.0
    keep_firing_for: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RuleGroup:
    """A named group of rules evaluated together."""

    name: str
    file: str
    line: int
    rules: tuple[Rule, ...]
    interval: float | None = None
    limit: int = 0


_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}


def _rule(node: Node) -> Rule | None:
    m = node.mapping(_RULE_KEYS)
    if m is None:
        return None
    kinds = [k for k in ("alert", "record") if k in m]
    if len(kinds) != 1:
        node.error("exactly one of 'alert' or 'record' must be set")
        return None
    kind = kinds[0]
    name = m[kind].string()
    if "expr" not in m:
        node.error("is required", field=f"{node.path}.expr")
        return None
    expr = m["expr"].string()
    if expr is not None:
        try:
            compile_expr(expr)
        except PromQLError as exc:
            m["expr"].error(
                f"could not parse expression: {parse_error_text(expr, exc.message, exc.position)}"
            )
            expr = None
    if kind == "record":
        for key in ("for", "keep_firing_for", "annotations"):
            if key in m:
                m[key].error(f"invalid field {key!r} in recording rule")
        if name is not None and not _METRIC_NAME.match(name):
            m[kind].error(f"invalid recording rule name: {name}")
    for_ = m["for"].parsed(parse_duration) if "for" in m else 0.0
    keep = m["keep_firing_for"].parsed(parse_duration) if "keep_firing_for" in m else 0.0
    labels = m["labels"].string_map() if "labels" in m else {}
    annotations = m["annotations"].string_map() if "annotations" in m else {}
    _check_names(m, labels or {}, annotations or {}, templated=kind == "alert")
    if name is None or expr is None:
        return None
    return Rule(
        name=name,
        kind=kind,
        expr=expr,
        file=node.problems.file,
        line=node.line,
        for_=for_ or 0.0,
        keep_firing_for=keep or 0.0,
        labels=labels or {},
        annotations=annotations or {},
    )


def _check_names(
    m: dict[str, Node], labels: dict[str, str], annotations: dict[str, str], templated: bool
) -> None:
    """Label and annotation names must be valid; alerting rules' templates must compile (promtool checks)."""
    for key, mapping in (("labels", labels), ("annotations", annotations)):
        for name, text in mapping.items():
            if not LABEL_NAME.match(name) or (key == "labels" and name == "__name__"):
                m[key].error(f"invalid {key[:-1]} name: {name}")
            problem = check_template(text) if templated else None
            if problem is not None:
                m[key].error(f"{key[:-1]} {name!r}: template: {problem}")


def parse_rule_file(text: str, source: str) -> list[RuleGroup]:
    """Parse one rule file; raise ConfigError listing every problem."""
    problems = Problems(source)
    root = compose(text, problems)
    groups: list[RuleGroup] = []
    if root is None:
        if problems.items:
            raise ConfigError(problems.items)
        return groups
    top = Node(root, "", problems).mapping({"groups"})
    seen: set[str] = set()
    for gnode in top["groups"].items() if top and "groups" in top else []:
        g = gnode.mapping({"name", "interval", "limit", "rules"})
        if g is None:
            continue
        name = g["name"].string() if "name" in g else None
        if name is None:
            gnode.error("group name is required", field=f"{gnode.path}.name")
            continue
        if name in seen:
            g["name"].error(f"{name!r} is repeated in the same file")
        seen.add(name)
        interval = g["interval"].parsed(parse_duration) if "interval" in g else None
        limit = g["limit"].integer(minimum=0) if "limit" in g else 0
        rules = [_rule(r) for r in g["rules"].items()] if "rules" in g else []
        groups.append(
            RuleGroup(
                name=name,
                file=source,
                line=gnode.line,
                rules=tuple(r for r in rules if r is not None),
                interval=interval,
                limit=limit or 0,
            )
        )
    if problems.items:
        raise ConfigError(problems.items)
    return groups


def load_rule_files(paths: Iterable[str]) -> tuple[RuleGroup, ...]:
    """Load every rule file, collecting the problems of all of them before raising."""
    groups: list[RuleGroup] = []
    problems: list[Problem] = []
    for path in paths:
        try:
            groups.extend(parse_rule_file(read_text(path), path))
        except UnreadableFileError as exc:
            problems.append(Problem(path, 1, "(file)", f"cannot read: {exc}"))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return tuple(groups)


def _seconds(delta: Any) -> float:
    return abs(delta.total_seconds()) if delta is not None else 0.0


def _needs(node: Any, extra: float, lookback: float, names: dict[str, float] | None) -> tuple[float, bool]:
    """Walk the AST: return (max seconds of history needed, whether a name-less selector occurs)."""
    if isinstance(node, promql_parser.MatrixSelector):
        vs = node.vector_selector
        need, anyname = _needs(vs, extra + _seconds(node.range) - lookback, lookback, names)
        return need, anyname
    if isinstance(node, promql_parser.VectorSelector):
        name = node.name or next(
            (
                m.value
                for m in node.matchers.matchers
                if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal
            ),
            None,
        )
        need = extra + lookback + _seconds(node.offset)
        if names is not None and name is not None:
            names[name] = max(names.get(name, 0.0), need)
        return need, name is None
    if isinstance(node, promql_parser.SubqueryExpr):
        return _needs(node.expr, extra + _seconds(node.range) + _seconds(node.offset), lookback, names)
    children: list[Any] = []
    if isinstance(node, promql_parser.BinaryExpr):
        children = [node.lhs, node.rhs]
    elif isinstance(node, promql_parser.AggregateExpr):
        children = [node.expr] + ([node.param] if node.param is not None else [])
    elif isinstance(node, promql_parser.Call):
        children = list(node.args)
    elif isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr)):
        children = [node.expr]
    need, anyname = 0.0, False
    for child in children:
        n, a = _needs(child, extra, lookback, names)
        need, anyname = max(need, n), anyname or a
    return need, anyname


def history_needed(expr: str) -> float:
    """Seconds of history an expression reads beyond its newest samples (ranges, subqueries, offsets)."""
    return _needs(promql_parser.parse(expr), 0.0, 0.0, None)[0]


def store_needs(groups: Iterable[RuleGroup], lookback: float) -> StoreNeeds:
    """What the sample store must keep so every rule can be evaluated."""
    names: dict[str, float] = {}
    max_lookback, anyname = lookback, False
    for group in groups:
        for rule in group.rules:
            need, a = _needs(promql_parser.parse(rule.expr), 0.0, lookback, names)
            max_lookback, anyname = max(max_lookback, need), anyname or a
            if rule.kind == "record":
                names.setdefault(rule.name, lookback)
    if anyname:  # a selector without a name may read any series over its whole range
        return StoreNeeds(names=None, max_lookback=max_lookback)
    return StoreNeeds(names=frozenset(names), max_lookback=max_lookback, lookback_by_name=names)
