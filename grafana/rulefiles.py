"""What the dashboards take from the bundled rule files (rules/*.rules.yml): the alert names, and the constant
each alert compares a metric with, so that a panel's threshold line is the rule's own number."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

from vllm_watchdog.promql.compile import (
    Binary,
    Node,
    Num,
    Paren,
    Sel,
    children,
    compile_plan,
)

RULES = Path(__file__).resolve().parent.parent / "rules"
COMPARISONS = ("==", "!=", ">", "<", ">=", "<=")


@functools.cache
def alerts(rules: Path = RULES) -> dict[str, str]:
    """Alert name -> expression, for every alerting rule of the bundled rule files."""
    out: dict[str, str] = {}
    for path in sorted(rules.glob("*.rules.yml")):
        doc: dict[str, Any] = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            out |= {r["alert"]: r["expr"] for r in group["rules"] if "alert" in r}
    return out


def alert_regex(rules: Path = RULES) -> str:
    """A regex (for alertname=~) matching exactly the bundled alerts."""
    return "|".join(sorted(alerts(rules)))


def threshold(alert: str, metric: str, rules: Path = RULES) -> float:
    """The number the alert compares `metric` with: the first comparison (left to right) with a number on one
    side and an expression that reads `metric` on the other, e.g. 10 for VLLMQueueSaturated and
    vllm:num_requests_waiting (`(...) > 10 and vllm:num_requests_running > 0`)."""
    found = _first(compile_plan(alerts(rules)[alert]), metric)
    if found is None:
        raise LookupError(f"{alert} compares {metric} with no number")
    return found


def _first(node: Node, metric: str) -> float | None:
    if isinstance(node, Binary) and node.op in COMPARISONS:
        for side, other in ((node.lhs, node.rhs), (node.rhs, node.lhs)):
            number = _bare(other)
            if isinstance(number, Num) and _reads(side, metric):
                return number.value
    for child in children(node):
        found = _first(child, metric)
        if found is not None:
            return found
    return None


def _bare(node: Node) -> Node:
    while isinstance(node, Paren):
        node = node.expr
    return node


def _reads(node: Node, metric: str) -> bool:
    if isinstance(node, Sel):
        return node.selector.name == metric
    return any(_reads(child, metric) for child in children(node))
