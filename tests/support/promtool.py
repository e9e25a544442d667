"""Run the real promtool 2.42 as a reference oracle for PromQL results and rule unit tests."""

from __future__ import annotations

import math
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from vllm_watchdog.config.durations import parse_duration
from vllm_watchdog.promtool.series import parse_values, unquote

PROMTOOL = "/usr/bin/promtool"
_EXPR = "    expr: "
_TAIL = re.compile(r", time: (\S+?),(?: err: (.*)|)$")
_SAMPLE_VALUE = re.compile(r"[^,]+")


@dataclass(frozen=True)
class Result:
    """promtool's answer for one expression: samples (labels, value), or an error message."""

    samples: tuple[tuple[tuple[tuple[str, str], ...], float], ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class Run:
    """One `promtool test rules` run."""

    returncode: int
    stdout: str
    stderr: str


def run_test_rules(paths: Sequence[str | Path], timeout: float = 60.0) -> Run:
    """Run `promtool test rules` on files."""
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def parse_samples(text: str) -> tuple[tuple[tuple[tuple[str, str], ...], float], ...]:
    """Parse promtool's `got:` list: `{a="b", c="d"} 1E+00, {} NaN` (or `nil`)."""
    if text == "nil":
        return ()
    out = []
    pos = 0
    while pos < len(text):
        if text[pos] != "{":
            raise ValueError(f"cannot parse promtool samples at {pos}: {text!r}")
        pos += 1
        labels: list[tuple[str, str]] = []
        while text[pos] != "}":
            eq = text.index("=", pos)
            name = text[pos:eq]
            value, pos = unquote(text, eq + 1)
            labels.append((name, value))
            if text.startswith(", ", pos):
                pos += 2
        pos += 2  # "} "
        m = _SAMPLE_VALUE.match(text, pos)
        if m is None:
            raise ValueError(f"no value at {pos}: {text!r}")
        out.append((tuple(sorted(labels)), float(m.group(0))))
        pos = m.end() + 2  # ", "
    return tuple(out)


def parse_failures(stderr: str) -> list[tuple[str, float, Result]]:
    """Every failed promql_expr_test in promtool's stderr as (expr, eval seconds, result)."""
    found: list[tuple[str, float, Result]] = []
    lines = stderr.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.startswith(_EXPR + '"'):
            continue
        expr, end = unquote(line, len(_EXPR))
        m = _TAIL.match(line, end)
        if m is None:
            raise ValueError(f"unexpected promtool output: {line!r}")
        at = parse_duration(m.group(1))
        if m.group(2) is not None:
            message = [m.group(2)]
            while i < len(lines) and lines[i] and not lines[i].startswith(_EXPR):
                message.append(lines[i])
                i += 1
            found.append((expr, at, Result(error="\n".join(message))))
            continue
        got = lines[i + 1]
        if not got.startswith("        got: "):
            raise ValueError(f"unexpected promtool output: {got!r}")
        found.append((expr, at, Result(samples=parse_samples(got[len("        got: ") :]))))
        i += 2
    return found


def _seconds_text(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms}ms" if ms % 1000 else f"{ms // 1000}s"


def promtool_eval(
    series: Mapping[str, str],
    interval: str,
    cases: Sequence[tuple[str, str]],
    evaluation_interval: str = "1m",
) -> list[Result]:
    """Evaluate (expr, eval_time) cases over input series with one promtool run; one Result per case.

    Every case is a promql_expr_test with no expected samples, so promtool prints what it got. A case
    it does not print returned no samples. A final passing case loads every input sample first.
    """
    step = parse_duration(interval)
    eval_step = parse_duration(evaluation_interval)
    longest = max((len(parse_values(v)) for v in series.values()), default=0)
    last = max([step * longest] + [parse_duration(t) for _, t in cases])
    load_until = math.ceil(last / eval_step + 1) * eval_step
    tests = [{"expr": expr, "eval_time": at} for expr, at in cases]
    tests.append(
        {
            "expr": "vector(1)",
            "eval_time": _seconds_text(load_until),
            "exp_samples": [{"labels": "{}", "value": 1}],
        }
    )
    doc = {
        "evaluation_interval": evaluation_interval,
        "tests": [
            {
                "interval": interval,
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "promql_expr_test": tests,
            }
        ],
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cases.yml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        run = run_test_rules([path], timeout=120)
    if "FAILED" not in run.stderr and run.returncode != 0:
        raise RuntimeError(f"promtool failed: {run.stdout}{run.stderr}")
    failures = parse_failures(run.stderr)
    results: list[Result] = []
    j = 0
    for expr, at in cases:
        if j < len(failures) and failures[j][0] == expr and failures[j][1] == parse_duration(at):
            results.append(failures[j][2])
            j += 1
        else:
            results.append(Result())
    if j != len(failures):
        raise RuntimeError(f"unmatched promtool output from {failures[j]}")
    return results
