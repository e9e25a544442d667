"""`query`: one PromQL expression, evaluated once over a scrape of every target (or by the rule_backend),
printed as Prometheus prints values."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import TYPE_CHECKING, Any, TextIO

from ..config.model import Config
from ..exitcodes import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from ..formats.rfc3339 import parse_rfc3339
from ..promql.compile import compile_expr
from ..promql.engine import Engine
from ..promql.remote import backend_for
from ..promql.values import Matrix, PromQLError, QueryError, Scalar, String, Value

if TYPE_CHECKING:
    from ..sources.monitor import Monitor


def escape_label(value: str) -> str:
    """Escape a label value as the text format and PromQL print it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(v: float) -> str:
    """A sample value as Prometheus prints it: 6, 0.25, NaN, +Inf."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def _format_labels(labels: tuple[tuple[str, str], ...]) -> str:
    name = next((v for k, v in labels if k == "__name__"), "")
    rest = ", ".join(f'{k}="{escape_label(v)}"' for k, v in labels if k != "__name__")
    return f"{name}{{{rest}}}"


def parse_time(text: str) -> float:
    """`--time`: unix seconds (`1700000000.5`) or RFC 3339 (`2026-11-26T01:00:00Z`; no zone is UTC)."""
    try:
        return parse_rfc3339(text, no_zone="utc", lowercase_z=True, unix_seconds=True)
    except ValueError:
        raise ValueError(f"{text!r} is neither unix seconds nor RFC 3339 (2026-11-26T01:00:00Z)") from None


def _scrape_problems(monitor: Monitor) -> tuple[list[str], bool]:
    """One line per target whose scrape failed, and whether any target answered."""
    problems = []
    for name, rt in monitor.targets.items():
        if not rt.scrape.status.up:
            problems.append(f"vllm-watchdog: target {name}: scrape failed: {rt.scrape.status.last_error}")
    return problems, len(problems) < len(monitor.targets)


def _evaluate(config: Config, expr: str, at: float | None, err: TextIO) -> Value | int:
    """The result, or the exit status after printing why there is none."""
    if config.rule_backend is not None:
        try:
            return backend_for(config.rule_backend).query(expr, time.time() if at is None else at)
        except QueryError as exc:
            print(f"vllm-watchdog: query failed: {exc}", file=err)
            # requests' errors are OSErrors: the server did not answer, the expression is not to blame
            return EXIT_UNREACHABLE if isinstance(exc.__cause__, OSError) else EXIT_FAILED
    from .targets import scrape_once  # noqa: PLC0415 (what the rule_backend answers scrapes nothing)

    monitor = asyncio.run(scrape_once(config))
    problems, any_up = _scrape_problems(monitor)
    for line in problems:
        print(line, file=err)
    if not any_up:  # an empty result would only say that nothing was scraped
        print("vllm-watchdog: no target could be scraped", file=err)
        return EXIT_UNREACHABLE
    engine = Engine(monitor.store, lookback=config.global_.lookback_delta)
    try:
        return engine.query(expr, time.time() if at is None else at)  # after the scrape: its samples count
    except QueryError as exc:
        print(f"vllm-watchdog: query failed: {exc}", file=err)
        return EXIT_FAILED


def run_query(
    config: Config, expr: str, out: TextIO, err: TextIO, *, at: float | None = None, output: str = "text"
) -> int:
    """Evaluate `expr` at `at` (default now) and print the result to `out`; the exit status (exitcodes)."""
    try:
        compile_expr(expr)
    except PromQLError as exc:
        print(f"vllm-watchdog: invalid expression: {exc}", file=err)
        return EXIT_FAILED
    result = _evaluate(config, expr, at, err)
    if isinstance(result, int):
        return result
    if output == "json":
        print(json.dumps(result_json(result)), file=out)
    else:
        print_text(result, out)
    return EXIT_OK


def result_json(result: Value) -> dict[str, Any]:
    """The `data` object of Prometheus' /api/v1/query: resultType and result, values as strings."""
    if isinstance(result, Scalar):
        return {"resultType": "scalar", "result": [result.t_ms / 1000, _num(result.value)]}
    if isinstance(result, String):
        return {"resultType": "string", "result": [result.t_ms / 1000, result.value]}
    if isinstance(result, Matrix):
        series = [
            {
                "metric": dict(rs.labels),
                "values": [[t / 1000, _num(v)] for t, v in zip(rs.ts, rs.vals, strict=True)],
            }
            for rs in result
        ]
        return {"resultType": "matrix", "result": series}
    samples = [
        {"metric": dict(s.labels), "value": [s.t_ms / 1000, _num(s.value)]}
        for s in sorted(result, key=lambda s: s.labels)
    ]
    return {"resultType": "vector", "result": samples}


def print_text(result: Value, out: TextIO) -> None:
    """The result as promtool prints it: `name{labels} => value @[t]`."""
    if isinstance(result, (Scalar, String)):
        value = _num(result.value) if isinstance(result, Scalar) else result.value
        print(f"{value} @[{result.t_ms / 1000}]", file=out)
    elif isinstance(result, Matrix):
        for rs in result:
            points = " ".join(f"{_num(v)} @[{t / 1000}]" for t, v in zip(rs.ts, rs.vals, strict=True))
            print(f"{_format_labels(rs.labels)} =>\n{points}", file=out)
    else:
        for sample in sorted(result, key=lambda s: s.labels):
            print(
                f"{_format_labels(sample.labels)} => {_num(sample.value)} @[{sample.t_ms / 1000}]", file=out
            )
