"""Instant-vector selectors: parsing `name{label=~"re"}` and matching stored series against it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import promql_parser

from ..goregex import RegexError, compile_anchored, compile_go
from ..matchers import Matcher
from ..store import Labels, SampleStore, Series

_OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}


def check_regex(pattern: str) -> None:
    """Refuse a matcher regex as Prometheus does: it must compile alone and anchored; RegexError."""
    compile_go(pattern)  # Prometheus' FastRegexMatcher also parses the bare pattern
    compile_anchored(pattern)


@dataclass(frozen=True)
class Selector:
    """A metric name (if fixed) and label matchers."""

    name: str | None
    matchers: tuple[Matcher, ...]

    def predicate(self) -> Callable[[Labels], bool]:
        """A function telling whether a series' labels match every matcher."""
        matchers = self.matchers

        def keep(labels: Labels) -> bool:
            d = dict(labels)
            return all(m.matches_value(d.get(m.name, "")) for m in matchers)

        return keep

    def select(self, store: SampleStore) -> list[Series]:
        """The stored series this selector picks."""
        return list(store.select(self.name, self.predicate()))


def from_ast(node: promql_parser.VectorSelector) -> Selector:
    """Convert a parsed vector selector."""
    matchers = []
    name = node.name
    for m in node.matchers.matchers:
        matcher = Matcher(m.name, _OPS[str(m.op)], m.value)
        if m.name == "__name__" and matcher.op == "=":
            name = m.value
        try:
            if matcher.op in ("=~", "!~"):
                check_regex(matcher.value)
        except RegexError as exc:
            raise ValueError(f"invalid regular expression {matcher.value!r}: {exc}") from None
        matchers.append(matcher)
    if node.matchers.or_matchers:
        raise ValueError("'or' inside a selector's braces is not supported")
    if node.name is not None:
        matchers.append(Matcher("__name__", "=", node.name))
    if not any(m.matches_value("") is False for m in matchers):
        raise ValueError("vector selector must contain at least one non-empty matcher")
    return Selector(name, tuple(matchers))


def parse_selector(text: str) -> Selector:
    """Parse a selector string such as `vllm:num_requests_waiting{instance="vllm-0"}`."""
    try:
        node = promql_parser.parse(text)
    except ValueError as exc:
        raise ValueError(f"invalid selector {text!r}: {exc}") from exc
    if not isinstance(node, promql_parser.VectorSelector):
        raise ValueError(f"{text!r} is not a plain series selector")
    return from_ast(node)
