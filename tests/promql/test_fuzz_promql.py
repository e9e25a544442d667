"""Fuzz harness: the PromQL engine against promtool 2.42 on random expressions over random series.

Differential (test_random_expressions_match_promtool): one example is a random data set (3-8 series of gauges
`g`, `h`, a counter `c_total` with resets, gaps (`_`), staleness markers, NaN and ±Inf, labels `job` and
`inst`, and sometimes a histogram `req_bucket` with `le` up to +Inf, sampled every 15s, 30s or 1m), a batch of
random well-typed expressions and 3 evaluation times; promtool evaluates the whole batch in one
`promtool test rules` run and every case must agree with our engine: the same samples (labels and values,
NaN equal to NaN, relative tolerance 1e-9) or an error on both sides. The expressions combine:

* selectors with =, !=, =~, !~ matchers (also on __name__ and on absent labels), offsets (also negative) and
  `@` (a time, start(), end());
* every range function of 2.42 over `sel[range]` or a subquery `expr[range:step]` (also without a step, with
  offset and `@`), quantile_over_time, predict_linear and holt_winters with scalar arguments;
* aggregations sum, avg, min, max, count, group, stddev, stdvar, quantile, count_values with by/without
  (also by le and __name__), and topk/bottomk;
* arithmetic, comparison (with and without bool) and set operators between vectors and scalars, with
  on/ignoring and group_left/group_right (with extra labels);
* math, clamp, round, date, trigonometric and label functions, absent, timestamp, scalar, vector, sort,
  histogram_quantile, time(), pi(), unary minus and parentheses.

Excluded, and why: a case promtool cannot parse (our parser is promql-parser, Prometheus 3's grammar; a
difference there is not an evaluation bug) is skipped. topk/bottomk are generated only as the outermost
operation and compared by their multiset of values, since promtool breaks ties between equal values by Go map
order, which changes from run to run; if either side has NaN among them the case is skipped (NaN is not
ordered). Values are small integers and halves so that sums are exact whatever order series are added in.
Error messages are not compared, only that both sides refused.

Parser robustness (test_parser_*): random strings over PromQL's alphabet, arbitrary text, and single-character
mutations of generated expressions must compile or raise PromQLError, evaluate or raise PromQLError or
QueryError, and the rule loader's history_needed must accept whatever compiles.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from hypothesis import event, example, given, seed, settings
from hypothesis import strategies as st

from tests.support.fuzzing import fuzz
from tests.support.promtool import Result, promtool_eval
from vllm_watchdog.config.durations import parse_duration
from vllm_watchdog.promql.compile import compile_plan
from vllm_watchdog.promql.engine import Engine
from vllm_watchdog.promql.values import PromQLError, QueryError, Scalar, Vector
from vllm_watchdog.promtool.series import parse_series
from vllm_watchdog.ruler.files import history_needed
from vllm_watchdog.store import SampleStore

# --- data sets ------------------------------------------------------------------------------------------------

JOBS = ("a", "b")
INSTS = ("0", "1", "2")
LES = ("0.1", "1", "10", "+Inf")


@dataclass(frozen=True)
class Dataset:
    """Input series in promtool notation and the interval between their samples."""

    interval: str
    series: dict[str, str]
    steps: int


@st.composite
def value_run(draw: st.DrawFn) -> str:
    """One run of the expanding notation: `a+bxN`, `a-bxN`, `_xN`, `stale`, a special value or a number."""
    kind = draw(st.sampled_from(["ramp", "ramp", "ramp", "gap", "stale", "special", "one"]))
    start = draw(st.integers(-4, 20)) / draw(st.sampled_from([1, 2]))
    n = draw(st.integers(0, 8))
    if kind == "ramp":
        step = draw(st.integers(0, 6)) / draw(st.sampled_from([1, 2]))
        sign = draw(st.sampled_from(["+", "-"]))
        return f"{start:g}{sign}{step:g}x{n}"
    if kind == "gap":
        return f"_x{max(n, 1)}"
    if kind == "stale":
        return "stale"
    if kind == "special":
        return draw(st.sampled_from(["NaN", "Inf", "-Inf", "0", "-0"]))
    return f"{start:g}"


def _count(values: str) -> int:
    """How many samples a value string expands to."""
    total = 0
    for token in values.split():
        if "x" in token:
            total += int(token.rsplit("x", 1)[1]) + (0 if token.startswith("_") else 1)
        else:
            total += 1
    return total


def _labels(pairs: dict[str, str]) -> str:
    return ", ".join(f'{k}="{v}"' for k, v in pairs.items())


@st.composite
def dataset(draw: st.DrawFn) -> Dataset:
    """3-8 series over the metrics g, h and c_total, and sometimes a histogram."""
    series: dict[str, str] = {}
    for _ in range(draw(st.integers(3, 8))):
        name = draw(st.sampled_from(["g", "g", "h", "c_total"]))
        labels = {"job": draw(st.sampled_from(JOBS))}
        if draw(st.integers(0, 3)):
            labels["inst"] = draw(st.sampled_from(INSTS))
        if name == "c_total":  # a counter: rises, sometimes resets
            runs = [f"{draw(st.integers(0, 10))}+{draw(st.integers(0, 5))}x{draw(st.integers(3, 15))}"]
            if draw(st.booleans()):
                runs.append(draw(st.sampled_from(["_x2", "stale", f"0+1x{draw(st.integers(1, 8))}"])))
        else:
            runs = draw(st.lists(value_run(), min_size=1, max_size=4))
        series[f"{name}{{{_labels(labels)}}}"] = " ".join(runs)
    if draw(st.booleans()):
        for job in draw(st.lists(st.sampled_from(JOBS), min_size=1, max_size=2, unique=True)):
            rate = 0
            for le in LES:
                rate += draw(st.integers(0, 4))
                series[f'req_bucket{{job="{job}", le="{le}"}}'] = f"0+{rate}x20"
    steps = max(_count(v) for v in series.values())
    return Dataset(draw(st.sampled_from(["15s", "30s", "1m"])), series, steps)


# --- expressions ----------------------------------------------------------------------------------------------

_RANGES = ["1m", "2m", "90s", "5m", "10m"]
_RANGE_FUNCS = ["rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets"]
_RANGE_FUNCS += [f"{f}_over_time" for f in ("avg", "min", "max", "sum", "count", "last", "stddev", "stdvar")]
_RANGE_FUNCS += ["present_over_time", "absent_over_time"]
_MATH = ["abs", "ceil", "floor", "sqrt", "exp", "ln", "log2", "log10", "sgn", "deg", "rad", "sin", "cos"]
_MATH += ["tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh"]
_DATES = ["day_of_month", "day_of_week", "day_of_year", "days_in_month", "hour", "minute", "month", "year"]
_AGGS = ["sum", "avg", "min", "max", "count", "group", "stddev", "stdvar"]
_ARITH = ["+", "-", "*", "/", "%", "^", "atan2"]
_COMPARE = ["==", "!=", ">", "<", ">=", "<="]
_SETS = ["and", "or", "unless"]
_LABEL_SETS = ["job", "inst", "job, inst", "le", "", "__name__", "job, le", "nope"]


def _maybe(draw: st.DrawFn, text: str, chance: int = 3) -> str:
    return text if draw(st.integers(0, chance - 1)) == 0 else ""


@st.composite
def selector(draw: st.DrawFn, with_modifiers: bool = True) -> str:
    """An instant-vector selector, maybe with offset and @."""
    name = draw(st.sampled_from(["g", "h", "c_total", "req_bucket", "nope", ""]))
    matchers = draw(
        st.lists(
            st.sampled_from(
                [
                    'job="a"',
                    'job!="a"',
                    'job=~"a|b"',
                    'inst!~"1"',
                    'inst=""',
                    'inst=~".+"',
                    'nope=""',
                    '__name__=~"g|h"',
                    '__name__!="g"',
                    'le="+Inf"',
                    'le!="0.1"',
                ]
            ),
            max_size=2,
        )
    )
    if name:  # promtool refuses a second name ("metric name must not be set twice")
        matchers = [m for m in matchers if not m.startswith("__name__")]
    elif not any(m.startswith("__name__=~") for m in matchers):
        matchers.append('__name__=~"g|c_total"')  # a selector needs a matcher that cannot match ""
    text = name + (f"{{{', '.join(matchers)}}}" if matchers or not name else "")
    if with_modifiers:
        text += _maybe(draw, " @ " + draw(st.sampled_from(["120", "300.5", "start()", "end()"])), 6)
        text += _maybe(draw, " offset " + draw(st.sampled_from(["30s", "1m", "5m", "-1m"])), 4)
    return text


@st.composite
def matrix(draw: st.DrawFn, depth: int) -> str:
    """A range vector: sel[range] (maybe with offset/@) or a subquery."""
    if depth <= 0 or draw(st.integers(0, 2)):
        sel = draw(selector(with_modifiers=False))
        text = f"{sel}[{draw(st.sampled_from(_RANGES))}]"
        text += _maybe(draw, " offset " + draw(st.sampled_from(["1m", "-30s"])), 5)
        return text + _maybe(draw, " @ " + draw(st.sampled_from(["300", "end()"])), 6)
    inner = draw(vector(depth - 1))
    step = draw(st.sampled_from(["", "30s", "1m", "45s"]))
    text = f"({inner})[{draw(st.sampled_from(['2m', '5m', '10m']))}:{step}]"
    return text + _maybe(draw, " offset 1m", 5)


@st.composite
def scalar(draw: st.DrawFn, depth: int) -> str:
    """A scalar expression."""
    kind = draw(
        st.sampled_from(["num", "num", "num", "scalar", "time", "binop", "neg"] if depth > 0 else ["num"])
    )
    if kind == "num":
        return draw(
            st.sampled_from(["0", "1", "2", "3", "0.5", "-1", "10", "0.25", "NaN", "Inf", "-Inf", "1e3"])
        )
    if kind == "scalar":
        return f"scalar({draw(vector(depth - 1))})"
    if kind == "time":
        return draw(st.sampled_from(["time()", "pi()"]))
    if kind == "binop":
        op = draw(st.sampled_from([*_ARITH, *(f"{c} bool" for c in _COMPARE)]))
        return f"({draw(scalar(depth - 1))} {op} {draw(scalar(depth - 1))})"
    return f"-({draw(scalar(depth - 1))})"


def _grouping(draw: st.DrawFn) -> str:
    labels = draw(st.sampled_from(_LABEL_SETS))
    return draw(st.sampled_from(["", f" by ({labels})", f" without ({labels})"]))


@st.composite
def vector(draw: st.DrawFn, depth: int) -> str:
    """An instant-vector expression (topk/bottomk excluded: see the module docstring)."""
    kinds = (
        ["sel"] if depth <= 0 else ["sel", "range", "range", "agg", "binop", "binop", "func", "func", "neg"]
    )
    kind = draw(st.sampled_from(kinds))
    if kind == "sel":
        return draw(selector())
    if kind == "range":
        fn = draw(st.sampled_from([*_RANGE_FUNCS, "quantile_over_time", "predict_linear", "holt_winters"]))
        m = draw(matrix(depth - 1))
        if fn == "quantile_over_time":
            return f"quantile_over_time({draw(st.sampled_from(['0', '0.5', '0.9', '1', '1.5', '-1']))}, {m})"
        if fn == "predict_linear":
            return f"predict_linear({m}, {draw(st.sampled_from(['0', '60', '-30', '600']))})"
        if fn == "holt_winters":
            return f"holt_winters({m}, {draw(st.sampled_from(['0.1', '0.5']))}, {draw(st.sampled_from(['0.5', '0.9']))})"
        return f"{fn}({m})"
    if kind == "agg":
        op = draw(st.sampled_from([*_AGGS, "quantile", "count_values"]))
        inner = draw(vector(depth - 1))
        group = _grouping(draw)
        if op == "quantile":
            return f"quantile{group} ({draw(st.sampled_from(['0.5', '0', '1', '0.9', '2']))}, {inner})"
        if op == "count_values":
            return f'count_values{group} ("cv", {inner})'
        return f"{op}{group} ({inner})"
    if kind == "binop":
        return draw(binop(depth))
    if kind == "func":
        return draw(function(depth))
    return f"-{draw(vector(depth - 1))}"


@st.composite
def binop(draw: st.DrawFn, depth: int) -> str:
    """A binary operation with at least one vector side and optional matching modifiers."""
    family = draw(st.sampled_from(["arith", "compare", "set"]))
    op = draw(st.sampled_from({"arith": _ARITH, "compare": _COMPARE, "set": _SETS}[family]))
    if family == "compare" and draw(st.booleans()):
        op += " bool"
    lhs = draw(vector(depth - 1))
    if family != "set" and draw(st.integers(0, 2)) == 0:
        rhs = draw(scalar(depth - 1))
        return f"({lhs} {op} {rhs})" if draw(st.booleans()) else f"({rhs} {op} {lhs})"
    rhs = draw(vector(depth - 1))
    mod = ""
    if draw(st.integers(0, 2)):
        labels = draw(st.sampled_from(["job", "inst", "job, inst", "", "le"]))
        mod = f" {draw(st.sampled_from(['on', 'ignoring']))}({labels})"
        if family != "set" and draw(st.integers(0, 2)) == 0:
            extra = draw(st.sampled_from(["", "inst", "job"]))
            mod += f" {draw(st.sampled_from(['group_left', 'group_right']))}({extra})"
    return f"({lhs} {op}{mod} {rhs})"


@st.composite
def function(draw: st.DrawFn, depth: int) -> str:
    """A function call returning a vector."""
    v = draw(vector(depth - 1))
    kind = draw(st.sampled_from(["math", "math", "clamp", "round", "date", "label", "misc", "hist", "vec"]))
    if kind == "math":
        return f"{draw(st.sampled_from(_MATH))}({v})"
    if kind == "clamp":
        lo, hi = draw(scalar(0)), draw(scalar(0))
        return draw(
            st.sampled_from([f"clamp({v}, {lo}, {hi})", f"clamp_min({v}, {lo})", f"clamp_max({v}, {hi})"])
        )
    if kind == "round":
        return f"round({v}{draw(st.sampled_from(['', ', 0.5', ', 2', ', 0']))})"
    if kind == "date":
        return f"{draw(st.sampled_from(_DATES))}({draw(st.sampled_from([v, '']))})"
    if kind == "label":
        return draw(
            st.sampled_from(
                [
                    f'label_replace({v}, "dst", "$1-x", "job", "(.*)")',
                    f'label_replace({v}, "inst", "", "inst", ".*")',
                    f'label_replace({v}, "job", "z", "nope", "")',
                    f'label_join({v}, "dst", "-", "job", "inst")',
                    f'label_join({v}, "job", ",")',
                ]
            )
        )
    if kind == "misc":
        return draw(st.sampled_from([f"absent({v})", f"timestamp({v})", f"sort({v})", f"sort_desc({v})"]))
    if kind == "hist":
        q = draw(st.sampled_from(["0.5", "0.9", "0", "1", "NaN"]))
        inner = draw(
            st.sampled_from(
                [
                    "rate(req_bucket[5m])",
                    "sum by (le) (rate(req_bucket[2m]))",
                    "req_bucket",
                    f"sum by (job, le) (increase(req_bucket{draw(st.sampled_from(['[5m]', '[10m]']))}))",
                    v,
                ]
            )
        )
        return f"histogram_quantile({q}, {inner})"
    return f"vector({draw(scalar(max(depth - 1, 0)))})"


@st.composite
def top_expression(draw: st.DrawFn) -> str:
    """What one case evaluates: a vector, a scalar, or topk/bottomk of a vector."""
    kind = draw(st.sampled_from(["vector"] * 6 + ["scalar", "topk"]))
    if kind == "scalar":
        return draw(scalar(2))
    inner = draw(vector(draw(st.integers(1, 3))))
    if kind == "topk":
        op = draw(st.sampled_from(["topk", "bottomk"]))
        return f"{op}{_grouping(draw)} ({draw(st.sampled_from(['1', '2', '0', '5']))}, {inner})"
    return inner


# --- evaluation and comparison ------------------------------------------------------------------------------


def engine_for(data: Dataset) -> Engine:
    """Our engine over the data set's samples, loaded as promtool loads them."""
    store = SampleStore(retention=math.inf)
    step_ms = round(parse_duration(data.interval) * 1000)
    for series, values in data.series.items():
        labels, parsed = parse_series(series, values)
        for i, value in enumerate(parsed):
            if value is not None:
                store.append(labels, i * step_ms, value)
    return Engine(store, lookback=300.0, default_step=60.0)


def ours(engine: Engine, expr: str, at: str) -> Result:
    """Our answer in promtool's terms (a scalar is one sample without labels)."""
    try:
        value = engine.query(expr, parse_duration(at))
    except (PromQLError, QueryError) as exc:
        return Result(error=str(exc))
    if isinstance(value, Scalar):
        return Result(samples=(((), value.value),))
    assert isinstance(value, Vector), f"{expr}: {type(value).__name__} at the top"
    return Result(samples=tuple(sorted((s.labels, s.value) for s in value)))


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _values(r: Result) -> list[float]:
    return sorted(v for _, v in r.samples)


def verdict(expr: str, got: Result, want: Result) -> str | None:
    """None when the results agree (or the case is excluded), else why they differ."""
    if want.error is not None and "parse error" in want.error:
        return None  # promtool cannot parse it: not an evaluation case
    if (got.error is None) != (want.error is None):
        return "only one side failed"
    if got.error is not None:
        return None
    if expr.startswith(("topk", "bottomk")):
        a, b = _values(got), _values(want)
        if any(math.isnan(v) for v in a + b):
            return None
        ok = len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
        return None if ok else "different values"
    if [s[0] for s in got.samples] != [s[0] for s in want.samples]:
        return "different series"
    if not all(_close(x[1], y[1]) for x, y in zip(got.samples, want.samples, strict=True)):
        return "different values"
    return None


def _show(r: Result) -> str:
    if r.error is not None:
        return f"error: {r.error}"
    return "; ".join(f"{dict(labels)} {value!r}" for labels, value in r.samples) or "(no samples)"


@st.composite
def eval_times(draw: st.DrawFn, data: Dataset) -> list[str]:
    """Three evaluation times within the data and up to 5 minutes past it, some between samples."""
    span = round(parse_duration(data.interval) * data.steps) + 300
    seconds = draw(st.lists(st.integers(0, span), min_size=3, max_size=3, unique=True))
    return [f"{s}s" for s in sorted(seconds)]


@st.composite
def batch(draw: st.DrawFn) -> tuple[Dataset, list[str], list[str]]:
    """A data set, 12 expressions and 3 evaluation times: one promtool run."""
    data = draw(dataset())
    exprs = draw(st.lists(top_expression(), min_size=12, max_size=12))
    return data, exprs, draw(eval_times(data))


@fuzz(0.5)
@given(batch())
@example(
    (
        Dataset("1m", {'g{job="a"}': "1 2 3", 'g{job="b", inst="0"}': "NaN Inf 0"}, 3),
        ["sum by (job) (g)", "topk(1, g)", "g / on(job) group_left vector(1)"],
        ["0s", "90s", "5m"],
    )
)
def test_random_expressions_match_promtool(case: tuple[Dataset, list[str], list[str]]) -> None:
    data, exprs, times = case
    cases = [(expr, at) for expr in exprs for at in times]
    reference = promtool_eval(data.series, data.interval, cases)
    engine = engine_for(data)
    problems = []
    for (expr, at), want in zip(cases, reference, strict=True):
        got = ours(engine, expr, at)
        why = verdict(expr, got, want)
        if want.error and "parse error" in want.error and got.error is None:
            event("parsed by ours, not by promtool")
        event(
            "promtool: "
            + (
                "parse error"
                if want.error and "parse error" in want.error
                else "error"
                if want.error
                else "samples"
            )
        )
        if why is not None:
            problems.append(f"{why}: {expr} at {at}\n    ours:     {_show(got)}\n    promtool: {_show(want)}")
    assert not problems, "\n".join(problems)


# --- parser robustness ------------------------------------------------------------------------------------------

_WORDS = ["by", "without", "on", "ignoring", "group_left", "bool", "offset", "rate", "sum", "g", "le", "Inf"]
_WORDS += ["NaN", "@", "start()", "[5m:]", "topk", "\u00e9", "\x00"]
_PROMQL_CHARS = st.sampled_from([*"(){}[]=!~<>+-*/%^,:@\"'`\\ \n\t.0123456789eEx", *_WORDS])


def check_robust(text: str, engine: Engine) -> None:
    """Compiles or raises PromQLError; evaluates or raises PromQLError/QueryError; history_needed works."""
    try:
        compile_plan(text)
    except PromQLError as exc:
        assert exc.position is None or 0 <= exc.position <= len(text), (exc.position, len(text))
        return
    assert history_needed(text) >= 0
    with contextlib.suppress(PromQLError, QueryError):
        engine.query(text, 600.0)


_ROBUST_DATA = Dataset(
    "30s",
    {
        'g{job="a", inst="0"}': "1+1x20",
        'g{job="b"}': "NaN 2 stale 4 _x3 Inf",
        'c_total{job="a"}': "0+5x10 0+1x10",
        'req_bucket{job="a", le="1"}': "0+1x20",
        'req_bucket{job="a", le="+Inf"}': "0+2x20",
    },
    21,
)
_ROBUST_ENGINE = engine_for(_ROBUST_DATA)


@fuzz(2)
@given(st.one_of(st.lists(_PROMQL_CHARS, max_size=25).map("".join), st.text(max_size=40)))
@example("sum(")
@example('{__name__=~""}')
@example("g[5m:1m:1m]")
def test_parser_never_crashes_on_random_text(text: str) -> None:
    check_robust(text, _ROBUST_ENGINE)


@st.composite
def mutated_expression(draw: st.DrawFn) -> str:
    """A generated expression with 1-3 characters inserted, deleted or replaced."""
    chars = list(draw(top_expression()))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(chars)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert":
            chars.insert(i, draw(_PROMQL_CHARS))
        elif chars:
            i = min(i, len(chars) - 1)
            if op == "delete":
                del chars[i]
            else:
                chars[i] = draw(_PROMQL_CHARS)
    return "".join(chars)


@fuzz(2)
@given(st.one_of(top_expression(), mutated_expression()))
def test_parser_never_crashes_on_mutated_expressions(text: str) -> None:
    check_robust(text, _ROBUST_ENGINE)


@seed(7)
@settings(max_examples=1, deadline=None, database=None)
@given(st.lists(top_expression(), min_size=60, max_size=60))
def test_generators_produce_what_promtool_evaluates(exprs: list[str]) -> None:
    """Most generated expressions parse in promtool and evaluate, so the differential compares something."""
    data = _ROBUST_DATA
    reference = promtool_eval(data.series, data.interval, [(e, "5m") for e in exprs])
    unparsed = [
        (e, r.error) for e, r in zip(exprs, reference, strict=True) if r.error and "parse error" in r.error
    ]
    assert len(unparsed) <= 6, unparsed
    assert sum(r.error is None for r in reference) >= 40
