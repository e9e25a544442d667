from __future__ import annotations

import pytest

from vllm_watchdog.config import bundled_rules_dir
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.rulefiles import load_rule_files, parse_rule_file, store_needs

GOOD = """
groups:
  - name: g
    interval: 10s
    rules:
      - record: job:x:rate1m
        expr: rate(x_total[1m])
      - alert: High
        expr: job:x:rate1m > 3
        for: 2m
        keep_firing_for: 1m
        labels: {severity: warning}
        annotations: {summary: "{{ $value }}"}
"""


def test_parse_rule_file() -> None:
    (group,) = parse_rule_file(GOOD, "r.yml")
    assert group.name == "g" and group.interval == 10.0
    rec, alert = group.rules
    assert rec.kind == "record" and rec.name == "job:x:rate1m"
    assert alert.kind == "alert" and alert.for_ == 120.0 and alert.keep_firing_for == 60.0
    assert alert.labels == {"severity": "warning"} and alert.line == 8


def test_rule_problems_have_file_line_field() -> None:
    text = (
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: rate(x[5m\n"
        "      - record: r\n        expr: x\n        for: 1m\n      - expr: up\n  - name: g\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_rule_file(text, "r.yml")
    out = [str(p) for p in info.value.problems]
    assert out[0].startswith("r.yml:5: groups[0].rules[0].expr: could not parse expression")
    assert out[1] == "r.yml:8: groups[0].rules[1].for: invalid field 'for' in recording rule"
    assert out[2] == "r.yml:9: groups[0].rules[2]: exactly one of 'alert' or 'record' must be set"
    assert out[3] == "r.yml:10: groups[1].name: 'g' is repeated in the same file"


def test_store_needs_names_and_lookback() -> None:
    groups = parse_rule_file(
        """
groups:
  - name: g
    rules:
      - alert: A
        expr: max_over_time(rate(a_total[5m] offset 1m)[10m:1m]) > 0 and b
      - record: c:sum
        expr: sum(c)
""",
        "r.yml",
    )
    needs = store_needs(groups, lookback=300)
    assert needs.names == frozenset({"a_total", "b", "c", "c:sum"})
    # subquery 10m + range 5m + offset 1m = 16m
    assert needs.max_lookback == 16 * 60


def test_nameless_selector_needs_every_name() -> None:
    groups = parse_rule_file("groups: [{name: g, rules: [{alert: A, expr: '{job=\"x\"} > 0'}]}]", "r.yml")
    assert store_needs(groups, lookback=300).names is None


def test_bundled_rules_load() -> None:
    groups = load_rule_files(sorted(str(p) for p in bundled_rules_dir().glob("*.yml")))
    assert groups and all(g.rules for g in groups)
