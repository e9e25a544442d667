"""`vllm-watchdog test-rules`: promtool-format rule unit tests, their file format and their report."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from vllm_watchdog.errors import ConfigError
from vllm_watchdog.promtool.runner import run_rule_tests
from vllm_watchdog.promtool.testfile import parse_test_file

RULETESTS = Path(__file__).parent.parent / "fixtures" / "ruletests"

RULES = """
groups:
  - name: first
    rules:
      - record: a:sum
        expr: sum(m)
  - name: second
    rules:
      - record: b:copy
        expr: a:sum
      - alert: Big
        expr: b:copy > 2
        for: 1m
        labels: {severity: "{{ $labels.none }}x"}
        annotations: {text: "sum is {{ $value }}"}
"""


def run(tmp_path: Path, test: str, rules: str = RULES) -> tuple[int, str, str]:
    (tmp_path / "rules.yml").write_text(rules)
    path = tmp_path / "test.yml"
    path.write_text(test)
    out, err = io.StringIO(), io.StringIO()
    code = run_rule_tests([str(path)], out, err)
    return code, out.getvalue(), err.getvalue()


def test_fixtures_that_pass(tmp_path: Path) -> None:
    files = sorted(str(p) for p in RULETESTS.glob("pass_*.yml"))
    out = io.StringIO()
    assert run_rule_tests(files, out) == 0, out.getvalue()
    assert out.getvalue().count("  SUCCESS\n") == len(files)


def test_wrong_alert_expectations_report_expected_and_got() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert run_rule_tests([str(RULETESTS / "fail_alerts.yml")], out, err) == 1
    report = err.getvalue()
    assert report.startswith("  FAILED:\n    name: too early,\n    alertname: InstanceDown, time: 4m, \n")
    assert '        exp:[\n            0:\n              Labels:{alertname="InstanceDown"' in report
    assert "        got:[]" in report
    assert "    alertname: InstanceDown, time: 6m, \n        exp:[], \n" in report


def test_wrong_samples_nan_and_errors_fail() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert run_rule_tests([str(RULETESTS / "fail_exprs.yml")], out, err) == 1
    report = err.getvalue()
    assert '    expr: "m{a=\\"1\\"}", time: 10m,\n        exp: {__name__="m", a="1"} 1.1E+00\n' in report
    assert '        got: {__name__="m", a="1"} 1.0999999999999999E+00\n' in report
    assert '        exp: {__name__="m", a="2"} NaN\n        got: {__name__="m", a="2"} NaN' in report
    assert '    expr: "m[5m]", time: 1m, err: rule result is not a vector or scalar' in report
    assert '    expr: "m + on() m", time: 1m, err: ' in report


def test_invalid_files_fail_with_file_and_line() -> None:
    for name, line in (("invalid_key.yml", 6), ("invalid_series.yml", 5)):
        out = io.StringIO()
        assert run_rule_tests([str(RULETESTS / name)], out) == 1
        assert f"{RULETESTS / name}:{line}: " in out.getvalue()


def test_missing_file_fails() -> None:
    out = io.StringIO()
    assert run_rule_tests(["/nonexistent/test.yml"], out) == 1
    assert "/nonexistent/test.yml:1: (file): cannot read" in out.getvalue()


def test_group_order_decides_what_rules_see(tmp_path: Path) -> None:
    test = """
rule_files: [rules.yml]
group_eval_order: [{order}]
tests:
  - interval: 1m
    input_series:
      - series: 'm{{i="1"}}'
        values: '1 2 3'
    promql_expr_test:
      - expr: b:copy
        eval_time: 1m
        exp_samples:
          - labels: 'b:copy'
            value: {value}
"""
    assert run(tmp_path, test.format(order="first, second", value=2))[0] == 0
    # second before first: b:copy reads the a:sum recorded one step earlier
    assert run(tmp_path, test.format(order="second, first", value=1))[0] == 0


def test_alerts_compare_at_the_step_before_eval_time(tmp_path: Path) -> None:
    test = """
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'm'
        values: '3x5'
    alert_rule_test:
      - eval_time: 59s
        alertname: Big
      - eval_time: 1m59s
        alertname: Big
        exp_alerts:
          - exp_labels: {severity: x}
            exp_annotations: {text: "sum is 3"}
"""
    code, _, err = run(tmp_path, test)
    assert code == 0, err


def test_interval_zero_keeps_the_first_sample(tmp_path: Path) -> None:
    test = """
tests:
  - input_series:
      - series: 'm'
        values: '1 2 3'
    promql_expr_test:
      - expr: m
        eval_time: 2m
        exp_samples:
          - labels: m
            value: 1
"""
    assert run(tmp_path, test)[0] == 0


def test_rule_errors_stop_the_group(tmp_path: Path) -> None:
    rules = """
groups:
  - name: g
    rules:
      - record: r
        expr: m + on() m
"""
    test = """
rule_files: [rules.yml, missing*.yml]
tests:
  - interval: 1m
    input_series:
      - series: 'm{a="1"}'
        values: '1'
      - series: 'm{a="2"}'
        values: '1'
    promql_expr_test:
      - expr: m
        eval_time: 5m
"""
    code, _, err = run(tmp_path, test, rules)
    assert code == 1
    assert f"  WARNING: no file match pattern {tmp_path}/missing*.yml\n" in err
    assert "    rule: r, time: 0s, err: " in err
    assert "expr:" not in err


def test_invalid_rule_files_fail(tmp_path: Path) -> None:
    code, _, err = run(
        tmp_path,
        "rule_files: [rules.yml]\ntests: [{interval: 1m}]\n",
        "groups: [{name: g, rules: [{record: r}]}]",
    )
    assert code == 1
    assert "rules.yml:1: " in err


def test_file_problems_are_all_reported() -> None:
    text = """
evaluation_interval: soon
group_eval_order: [a, a]
tests:
  - interval: 1m
    input_series:
      - series: 'up{'
        values: '1'
    alert_rule_test:
      - eval_time: 1m
    promql_expr_test:
      - expr: up
        eval_time: 1m
        exp_samples:
          - labels: up
            value: '1'
"""
    with pytest.raises(ConfigError) as info:
        parse_test_file(text, "t.yml")
    lines = [p.line for p in info.value.problems]
    assert lines == [2, 3, 7, 10, 16]
