"""Parse errors in rule files and the query API, worded as promtool words them: `L:C: parse error: reason`,
with the line and column inside the expression (multi-line ones too), checked against the real promtool 2.42."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.support.promtool import PROMTOOL
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.ruler.files import load_rule_files

BROKEN = [
    "sum(rate(x[5m])) by (a) >",
    "foo +",
    "rate(foo[5m]",
    "foo bar",
    "sum by (a) (x",
    '1 + (2 * foo{a="b"}',
    "sum by (x) (\n  rate(foo[5m])\n) >\n",
    "avg(\n  up\n  ,\n",
]
_PROMTOOL_LINE = re.compile(r'rule (\d+), "r\d+": could not parse expression: (.*)$')


def _rules_file(path: Path) -> Path:
    rules = [{"record": f"r{i}", "expr": e} for i, e in enumerate(BROKEN)]
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": rules}]}, sort_keys=False))
    return path


def test_rule_file_parse_errors_name_the_line_column_and_reason_promtool_does(tmp_path: Path) -> None:
    path = _rules_file(tmp_path / "broken.yml")
    out = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    want = {int(m[1]) - 1: m[2] for m in map(_PROMTOOL_LINE.search, out.stderr.splitlines()) if m}
    assert len(want) == len(BROKEN), out.stderr
    try:
        load_rule_files([str(path)])
        raise AssertionError("the broken rules loaded")
    except ConfigError as exc:
        got = {
            int(re.search(r"rules\[(\d+)\]", p.field)[1]): p.message.removeprefix(
                "could not parse expression: "
            )  # type: ignore[index]
            for p in exc.problems
        }
    assert got == want
