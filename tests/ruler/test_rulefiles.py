from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from vllm_watchdog.config.model import bundled_rules_dir, load_config
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.ruler.files import load_rule_files, parse_rule_file, store_needs

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
    # each name as far back as its own longest selector; a recorded name read by no rule: the lookback
    assert dict(needs.lookback_by_name) == {"a_total": 16 * 60, "b": 300, "c": 300, "c:sum": 300}
    assert needs.history("a_total", 0) == 16 * 60 and needs.history("other", 42) == 42


def test_nameless_selector_needs_every_name() -> None:
    groups = parse_rule_file("groups: [{name: g, rules: [{alert: A, expr: '{job=\"x\"} > 0'}]}]", "r.yml")
    assert store_needs(groups, lookback=300).names is None


def test_bundled_rules_load() -> None:
    groups = load_rule_files(sorted(str(p) for p in bundled_rules_dir().glob("*.rules.yml")))
    assert groups and all(g.rules for g in groups)


# Each of these is rejected by `promtool check rules` (2.42); ours must reject it too, and name the line.
BROKEN = {
    "parse": ("groups: [{name: g, rules: [{alert: A, expr: 'sum(rate(x[5m])) by ('}]}]", 1),
    "record-name": ("groups: [{name: g, rules: [{record: 'bad name', expr: x}]}]", 1),
    "label-name": ("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x\n    labels: {'1x': y}\n", 6),
    "name-label": ("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x\n    labels: {__name__: y}\n", 6),
    "annotation-name": (
        "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x\n    annotations: {'a-b': y}\n",
        6,
    ),
    "template": (
        "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x\n    annotations: {s: '{{ $value'}\n",
        6,
    ),
    "template-func": (
        "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x\n    annotations: {s: '{{ nope }}'}\n",
        6,
    ),
    "record-for": ("groups:\n- name: g\n  rules:\n  - record: r\n    expr: x\n    keep_firing_for: 1m\n", 6),
    "unknown-key": ("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x\n    severity: page\n", 6),
    "both": ("groups:\n- name: g\n  rules:\n  - alert: A\n    record: r\n    expr: x\n", 4),
    "dup-group": ("groups:\n- name: g\n  rules: []\n- name: g\n  rules: []\n", 4),
    "regex-lookbehind": ("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x{a=~'(?<=x)y'}\n", 5),
    "regex-possessive": ("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x{a=~'a++'}\n", 5),
    "regex-any-byte": ("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: x{a=~'\\\\C'}\n", 5),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_check_agrees_with_promtool(case: str, tmp_path: Path) -> None:
    text, line = BROKEN[case]
    path = tmp_path / f"{case}.yml"
    path.write_text(text)
    ref = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert ref.returncode == 1, ref.stdout + ref.stderr
    with pytest.raises(ConfigError) as info:
        load_rule_files([str(path)])
    assert any(p.line == line for p in info.value.problems), info.value.problems


def test_good_file_passes_promtool_and_us(tmp_path: Path) -> None:
    path = tmp_path / "good.yml"
    path.write_text(GOOD)
    assert subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True).returncode == 0
    assert load_rule_files([str(path)])


def test_regexes_go_cannot_run_are_refused_at_load_with_file_line() -> None:
    text = (
        "groups:\n- name: g\n  rules:\n"
        "  - alert: A\n    expr: x{a=~'(?<=x)y'}\n"
        "  - alert: B\n    expr: x{a=~'(.+)+Q|a++'}\n"
        "  - alert: C\n    expr: label_replace(x, 'd', '$1', 'a', '(?P<\u00e9>.)')\n"
        "  - alert: D\n    expr: x{a=~'(?U)(.+)+Q|\\\\p{Greek}|\\\\z'}\n"  # Go accepts this one
    )
    with pytest.raises(ConfigError) as info:
        parse_rule_file(text, "r.yml")
    out = [str(p) for p in info.value.problems]
    assert len(out) == 3, out
    assert out[0].startswith("r.yml:5: groups[0].rules[0].expr: could not parse expression")
    assert out[1].startswith("r.yml:7: groups[0].rules[1].expr: could not parse expression")
    assert "invalid regular expression '(.+)+Q|a++'" in out[1] and "bad repetition operator" in out[1]
    assert out[2].startswith("r.yml:9: groups[0].rules[2].expr: could not parse expression")
    assert "invalid regular expression in label_replace()" in out[2]


def test_bad_expression_names_its_position() -> None:
    with pytest.raises(ConfigError) as info:
        parse_rule_file("groups: [{name: g, rules: [{alert: A, expr: 'rate(x[5m]) +'}]}]", "r.yml")
    assert "could not parse expression: 1:14: parse error: unexpected end of input" in str(
        info.value
    )  # as promtool


def test_a_glob_hitting_devices_and_fifos_reports_them_unread(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "a.rules.yml")
    (tmp_path / "b.rules.yml").symlink_to("/dev/zero")
    (tmp_path / "c.rules.yml").write_text(GOOD)
    cfg = tmp_path / "c.yml"
    cfg.write_text("rule_files: ['*.rules.yml', '/dev/zer*']\n")
    paths = load_config(str(cfg), env={}).rule_files
    assert paths == (*(str(tmp_path / f"{x}.rules.yml") for x in "abc"), "/dev/zero")
    with pytest.raises(ConfigError) as info:
        load_rule_files(paths)
    assert [str(p) for p in info.value.problems] == [
        "/dev/zero:1: (file): cannot read: not a regular file but a character device",
        f"{tmp_path}/a.rules.yml:1: (file): cannot read: not a regular file but a FIFO",
        f"{tmp_path}/b.rules.yml:1: (file): cannot read: not a regular file but a character device",
    ]
