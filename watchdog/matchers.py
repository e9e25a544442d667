"""Label matchers, as Alertmanager routes and PromQL selectors write them: `=`, `!=`, `=~`, `!~` (regexes Go
RE2, anchored). Both match alike; what differs is how they are written and checked, so each has its parser.

Routes, notifiers and silences select alerts with them; the config reads them from `match` (equality),
`match_re` (regex) and `matchers` (strings). PromQL selectors (promql/selectors.py) select series with them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .config.yamlnodes import Node
from .goregex import RegexError, compile_anchored

_HEAD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Matcher:
    """One label matcher: `=`, `!=`, `=~` or `!~` (regexes are Go RE2, anchored, as in Alertmanager)."""

    name: str
    op: str
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether the labels satisfy this matcher (a missing label is the empty string)."""
        return self.matches_value(labels.get(self.name, ""))

    def matches_value(self, value: str) -> bool:
        """Whether a label value (the empty string when the label is absent) passes."""
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        # As in Prometheus 2.x and Alertmanager, `.` does not match a newline (Prometheus 3.x: it does).
        hit = compile_anchored(self.value).match_string(value)
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f"{self.name}{self.op}{self.value!r}"


def matches_all(matchers: tuple[Matcher, ...], labels: Mapping[str, str]) -> bool:
    """Whether every matcher holds (no matchers: everything matches)."""
    return all(m.matches(labels) for m in matchers)


def parse_matcher(text: str) -> Matcher:
    """Parse `name=value`, `name!="v"`, `name=~"re"` or `name!~re`; ValueError if malformed."""
    head = _HEAD.match(text)
    if head is not None:
        name, op, rest = head.group(1), head.group(2), text[head.end() :].rstrip()
        quoted = _QUOTED.fullmatch(rest)
        if quoted is not None:
            return make_matcher(name, op, re.sub(r"\\(.)", r"\1", quoted.group(1)))
        if "\n" not in rest:  # an unquoted value is one line
            return make_matcher(name, op, rest)
    raise ValueError(f'bad matcher {text!r}: want name=value, name!=value, name=~"regex" or name!~"regex"')


def make_matcher(name: str, op: str, value: str) -> Matcher:
    """A matcher from its parts (a regex is compiled now); ValueError naming what is wrong."""
    if not _LABEL.fullmatch(name) or op not in ("=", "!=", "=~", "!~"):
        raise ValueError(f"bad matcher {name}{op}{value!r}: want a label name and one of = != =~ !~")
    if op in ("=~", "!~"):
        check_matcher_regex(value)
    return Matcher(name, op, value)


def check_matcher_regex(pattern: str) -> None:
    """Refuse what Alertmanager's regexp.Compile("^(?:" + pattern + ")$") refuses; ValueError naming it."""
    try:
        compile_anchored(pattern)
    except RegexError as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None


def parse_matchers(m: Mapping[str, Node]) -> tuple[Matcher, ...]:
    """`match` (equality), `match_re` (regex) and `matchers` (strings), as Alertmanager routes have them."""
    out: list[Matcher] = []
    for key, op in (("match", "="), ("match_re", "=~")):
        if key in m:
            for name, value in (m[key].string_map() or {}).items():
                try:
                    out.append(parse_matcher(f"{name}{op}{_quote(value)}"))
                except ValueError as exc:
                    m[key].error(str(exc), field=f"{m[key].path}.{name}")
    if "matchers" in m:
        for item in m["matchers"].items():
            text = item.string()
            if text is not None:
                matcher = item.parsed(parse_matcher)
                if matcher is not None:
                    out.append(matcher)
    return tuple(out)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
