"""`query`: one PromQL expression, evaluated once over a scrape of every target (or by the rule_backend),
printed as Prometheus prints values."""

from __future__ import annotations

import asyncio
import math
import time
from typing import TextIO

from ..config.model import Config
from ..promql.compile import compile_expr
from ..promql.engine import Engine
from ..promql.remote import backend_for
from ..promql.values import Matrix, PromQLError, QueryError, Scalar, String, Value


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


def run_query(config: Config, expr: str, out: TextIO, err: TextIO) -> bool:
    """Evaluate `expr` now and print the result to `out`; False after printing to `err` why it could not."""
    try:
        compile_expr(expr)
    except PromQLError as exc:
        print(f"vllm-watchdog: invalid expression: {exc}", file=err)
        return False
    try:
        if config.rule_backend is not None:
            result: Value = backend_for(config.rule_backend).query(expr, time.time())
        else:
            from .targets import scrape_once  # noqa: PLC0415 (what the rule_backend answers scrapes nothing)

            monitor = asyncio.run(scrape_once(config))
            engine = Engine(monitor.store, lookback=config.global_.lookback_delta)
            result = engine.query(expr, time.time())  # after the scrape, so its samples are visible
    except QueryError as exc:
        print(f"vllm-watchdog: query failed: {exc}", file=err)
        return False
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
    return True
