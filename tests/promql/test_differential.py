"""Differential tests: our PromQL engine and rule-test runner against the real promtool 2.42."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.promtool import Result, promtool_eval, run_test_rules
from vllm_watchdog.config.durations import parse_duration
from vllm_watchdog.promql.engine import Engine
from vllm_watchdog.promql.values import PromQLError, QueryError, Scalar, Vector
from vllm_watchdog.promtool.runner import run_rule_tests
from vllm_watchdog.promtool.series import parse_series
from vllm_watchdog.store import SampleStore

RULETESTS = Path(__file__).parent.parent / "fixtures" / "ruletests"


@dataclass(frozen=True)
class Dataset:
    """Input series in promtool notation, the sample interval, expressions and when to evaluate them."""

    interval: str
    series: dict[str, str]
    exprs: list[str]
    times: list[str]


COUNTERS = {
    'http_requests_total{job="api", instance="a", code="200"}': "0+10x15 5+10x24",
    'http_requests_total{job="api", instance="b", code="200"}': "0+3x40",
    'http_requests_total{job="api", instance="a", code="500"}': "0+1x10 _x5 10+1x24",
    'http_requests_total{job="db", instance="c", code="200"}': "100+7x20 stale 0+2x18",
    'gauge{job="api", instance="a"}': "1 3 2 5 4 NaN 6 -1 0 2.5 Inf 3 -Inf 7 8 _ _ 9 1e2 -3.5 "
    + "0.25+0.5x19",
    'gauge{job="api", instance="b"}': "10-0.5x39",
    'gauge{job="db", instance="c"}': "5x10 stale _x5 2+1x23",
    'late_metric{job="api"}': "_x20 1+1x19",
    'early_metric{job="db"}': "1+1x9",
    'info{job="api", version="1.0", name_label="foo-bar"}': "1x39",
    'info{job="db", version="2.0", name_label="baz_qux"}': "1x39",
    'info2{job="api", version="1.0", name_label="foo-bar"}': "2x39",
    # Never tied: promtool breaks topk/bottomk ties by Go map order, which changes from run to run.
    'ranked{job="api", instance="a"}': "1+1x39",
    'ranked{job="api", instance="b"}': "2.5+1x39",
    'ranked{job="db", instance="c"}': "0.25+2x39",
    'ranked{job="db", instance="d"}': "100-3x39",
}

_SELECTORS = [
    "http_requests_total",
    'http_requests_total{job="api"}',
    'http_requests_total{job!="api"}',
    'http_requests_total{code=~"2.."}',
    'http_requests_total{code!~"2..", instance="a"}',
    '{__name__=~"http_.*", instance="a"}',
    '{job="api"}',
    'http_requests_total{instance=~"a|b", code!="500"}',
    'http_requests_total{job=~""}',
    'gauge{nonexistent=""}',
    'gauge{instance=~"A"}',
    "http_requests_total offset 1m",
    "http_requests_total offset -1m",
    "gauge offset 5m",
    "http_requests_total @ 300",
    "http_requests_total @ start()",
    "gauge @ end()",
    "http_requests_total @ 120 offset 1m",
    "gauge @ 600 offset -2m",
    "early_metric",
    "late_metric",
    "nonexistent",
]
_RANGE = [
    f"{fn}(http_requests_total[{r}])"
    for fn in ("rate", "irate", "increase", "resets", "delta", "idelta", "deriv", "changes")
    for r in ("1m", "5m")
] + [
    "rate(http_requests_total[30s])",
    "rate(http_requests_total[2m] @ 600)",
    "rate(http_requests_total[5m] offset 2m)",
    "increase(http_requests_total[10m])",
    "resets(http_requests_total[20m])",
    "delta(gauge[2m])",
    "idelta(gauge[2m])",
    "deriv(gauge[5m])",
    "predict_linear(gauge[5m], 600)",
    "predict_linear(http_requests_total[3m], 60)",
    "changes(gauge[10m])",
    "irate(gauge[3m])",
    "rate(late_metric[5m])",
    "rate(early_metric[5m])",
    "holt_winters(gauge[5m], 0.5, 0.5)",
    "holt_winters(http_requests_total[5m], 0.1, 0.9)",
]
_OVER_TIME = [
    f"{fn}_over_time(gauge[{r}])"
    for fn in ("avg", "min", "max", "sum", "count", "last", "stddev", "stdvar", "present")
    for r in ("1m", "3m", "10m")
] + [
    "quantile_over_time(0.5, gauge[5m])",
    "quantile_over_time(0.9, gauge[10m])",
    "quantile_over_time(0, http_requests_total[5m])",
    "quantile_over_time(2, gauge[5m])",
    "quantile_over_time(-1, gauge[5m])",
    "absent_over_time(nonexistent[5m])",
    'absent_over_time(nonexistent{job="x", instance=~"y"}[5m])',
    "absent_over_time(gauge[5m])",
    "absent_over_time(late_metric[1m])",
    "present_over_time(early_metric[1m])",
    "count_over_time(http_requests_total[2m])",
    "last_over_time(early_metric[10m])",
    "max_over_time(http_requests_total[1m] offset 30s)",
]
_SUBQUERIES = [
    "rate(http_requests_total[5m])[10m:1m]",
    "max_over_time(rate(http_requests_total[1m])[5m:30s])",
    "avg_over_time(gauge[5m:])",
    "max_over_time(max_over_time(gauge[2m:30s])[5m:1m])",
    "sum_over_time(gauge[5m:1m] offset 2m)",
    "min_over_time(gauge[10m:1m] @ 600)",
    "deriv(gauge[5m:30s])",
    "rate(http_requests_total[5m:1m])",
    "count_over_time(http_requests_total[3m:45s])",
    "last_over_time(sum(gauge)[5m:1m])",
    "avg_over_time(rate(http_requests_total[2m])[6m:2m] offset 1m)",
    "max_over_time((gauge > 2)[4m:])",
    "present_over_time(late_metric[2m:20s])",
]
_FUNCTIONS = [
    "absent(nonexistent)",
    'absent(nonexistent{job="x", instance=~"a"})',
    'absent(nonexistent{job="a", job="b"})',
    "absent(gauge)",
    "absent(sum(nonexistent))",
    "clamp(gauge, 0, 5)",
    "clamp(gauge, 5, 0)",
    "clamp_min(gauge, 2)",
    "clamp_max(gauge, 2)",
    "abs(gauge)",
    "ceil(gauge)",
    "floor(gauge)",
    "round(gauge)",
    "round(gauge, 0.3)",
    "round(-gauge, 2)",
    "sqrt(gauge)",
    "exp(gauge)",
    "ln(gauge)",
    "log2(gauge)",
    "log10(gauge)",
    "sgn(gauge)",
    "time()",
    "timestamp(gauge)",
    "timestamp(http_requests_total offset 1m)",
    "vector(3)",
    "vector(time())",
    'scalar(gauge{instance="a"})',
    "scalar(gauge)",
    "scalar(nonexistent) + 1",
    'label_replace(gauge, "dst", "$1-x", "instance", "(.*)")',
    'label_replace(info, "name_label", "", "name_label", ".*")',
    'label_replace(gauge, "foo", "$1", "nonexistent", "(.*)")',
    'label_replace(info, "v", "${1}.${2}", "version", "(\\\\d+)\\\\.(\\\\d+)")',
    'label_replace(http_requests_total, "code", "x", "", "")',
    'label_join(info, "joined", "-", "job", "version")',
    'label_join(gauge, "job", ",", "instance")',
    'label_join(info, "name_label")',
    "sort(gauge)",
    "sort_desc(rate(http_requests_total[5m]))",
    "minute(vector(3600))",
    "hour(timestamp(gauge))",
    "days_in_month()",
    "year()",
    "pi()",
    "rad(gauge)",
    "deg(gauge)",
]
_AGGREGATIONS = [
    f"{op}({arg})"
    for op in ("sum", "avg", "min", "max", "count", "group", "stddev", "stdvar")
    for arg in ("gauge", "http_requests_total")
] + [
    "sum by (job) (http_requests_total)",
    "sum without (instance, code) (http_requests_total)",
    "avg by (job) (gauge)",
    "max without (instance) (gauge)",
    "min by (job, code) (http_requests_total)",
    "count by (code) (http_requests_total)",
    "stddev by (job) (gauge)",
    "group without () (http_requests_total)",
    "sum by (nonexistent) (gauge)",
    "sum(rate(http_requests_total[5m])) by (job)",
    "topk(2, ranked)",
    "topk(1, gauge) by (job)",
    "bottomk(1, ranked) by (job)",
    "topk(3, ranked) by (job)",
    "bottomk(2, -ranked)",
    "bottomk(2, gauge)",
    "topk(1, ranked) without (instance)",
    "sum(topk(2, ranked))",
    "topk(0, gauge)",
    'topk(scalar(gauge{instance="b"}), http_requests_total)',
    "quantile(0.5, gauge)",
    "quantile(0.75, http_requests_total) by (job)",
    "quantile(1.5, gauge)",
    "quantile(NaN, gauge)",
    'count_values("value", gauge)',
    'count_values("v", http_requests_total) by (job)',
    'count_values("job", gauge)',
    "sum(nonexistent)",
    "count(nonexistent)",
    "max(gauge) by (instance)",
    "sum by (job) (http_requests_total @ 300)",
    'count by (__name__) ({job="api"})',
    "sum without (__name__) (gauge)",
    "max(max by (job) (gauge))",
    "avg(count_over_time(gauge[5m]))",
]
_EDGES = [
    "count_over_time(http_requests_total[1m])",
    "count_over_time(http_requests_total[30s])",
    "count_over_time(gauge[5m] offset -1m)",
    "rate(http_requests_total[5m] @ end())",
    "max_over_time(gauge[5m:7s])",
    "count_over_time(gauge[5m:7s])",
    "count_over_time(gauge[2m:1m] offset 30s)",
    "sum_over_time(gauge[3m:1m] @ 300)",
    "max_over_time(rate(http_requests_total[2m] @ 600)[5m:1m])",
    "avg_over_time(gauge[10m:2m] offset -1m)",
    "predict_linear(gauge[5m:1m], 60)",
    "changes(http_requests_total[1m])",
    'label_replace(gauge, "x", "y", "job", "(")',
    'label_replace(gauge, "1bad", "y", "job", ".*")',
    "holt_winters(gauge[5m], 1.5, 0.5)",
    "round(gauge, 0)",
    "clamp(gauge, NaN, 5)",
    "clamp_max(gauge, NaN)",
    'absent(nonexistent{job=~"x"})',
    "quantile_over_time(NaN, gauge[5m])",
    "timestamp(vector(1))",
    "-(-gauge)",
    "+gauge",
    "gauge and on() vector(1)",
    "gauge or on() vector(1)",
    'http_requests_total{__name__="http_requests_total", job="db"}',
    '{__name__!="", job="db"}',
    "vector(1) @ 100",
    "gauge[5m]",
    '"a string"',
    "1",
    "-Inf",
    "NaN",
    "0x10 + 1e1",
    "rate(gauge)",
    "sum(gauge",
    "unknown_fn(gauge)",
    "rate(http_requests_total[0s])",
    "scalar(vector(2)) * gauge",
    "day_of_week(gauge)",
    "days_in_month(vector(5097600))",
    "month(vector(-1))",
    "year(vector(NaN))",
]
_OPERATORS = [
    "gauge + 1",
    "2 * gauge",
    "gauge / 0",
    "-gauge / 0",
    "gauge % 3",
    "gauge % -2.5",
    "gauge ^ 2",
    "2 ^ gauge",
    "-gauge",
    "gauge - gauge",
    "gauge atan2 1",
    "1 + 2 * 3",
    "2 ^ 3 ^ 2",
    "(1 + 2) * -3",
    "http_requests_total / ignoring(code) group_left gauge",
    "http_requests_total * on(job, instance) group_left(version) gauge",
    "gauge / on(instance) group_right(job) http_requests_total",
    "info * on(job) group_right(version) gauge",
    "gauge + on(job) group_left info",
    "http_requests_total + on(job) gauge",
    "gauge * on() group_left() info",
    "gauge > 2",
    "gauge > bool 2",
    "2 < gauge",
    "gauge == gauge",
    "gauge != bool 3",
    "gauge >= on(job, instance) http_requests_total",
    "gauge <= bool gauge",
    "gauge == NaN",
    "gauge != NaN",
    "1 > bool 2",
    "1 == bool 1",
    "1 < 2",
    "gauge and on(instance) http_requests_total",
    "gauge or late_metric",
    "gauge unless on(job) late_metric",
    "http_requests_total and ignoring(code) gauge",
    'http_requests_total unless http_requests_total{code="500"}',
    "late_metric or early_metric or info",
    "gauge and gauge > 3",
    "(gauge > 3) or vector(0)",
    "gauge + ignoring(instance) gauge",
    "http_requests_total + http_requests_total offset 1m",
    'ceil({__name__=~"info|info2"})',
    '{__name__=~"info|info2"} * 1',
    '{__name__=~"info|info2"} > 0',
    "count(http_requests_total) > bool 3",
    "sum(gauge) + sum(http_requests_total)",
    "gauge + on(instance) group_left http_requests_total",
    "vector(1) + on() group_left gauge",
    "time() - timestamp(gauge)",
    "max(gauge) == bool min(gauge)",
]

SETS = {
    "counters": Dataset(
        "30s",
        COUNTERS,
        _SELECTORS + _RANGE + _OVER_TIME + _SUBQUERIES + _FUNCTIONS + _AGGREGATIONS + _OPERATORS + _EDGES,
        ["0s", "1m", "4m30s", "10m", "15m", "19m30s", "25m"],
    ),
    "histograms": Dataset(
        "1m",
        {
            'req_bucket{job="api", le="0.1"}': "0+1x30",
            'req_bucket{job="api", le="0.5"}': "0+3x30",
            'req_bucket{job="api", le="1"}': "0+4x30",
            'req_bucket{job="api", le="+Inf"}': "0+5x30",
            'req_bucket{job="db", le="0.1"}': "0x30",
            'req_bucket{job="db", le="1"}': "0+2x15 30+2x14",
            'req_bucket{job="db", le="+Inf"}': "0+2x15 30+2x14",
            'req_bucket{job="bad", le="0.5"}': "0+1x30",
            'req_bucket{job="bad", le="1"}': "0+2x30",
            'req_bucket{job="nonmono", le="0.1"}': "0+5x30",
            'req_bucket{job="nonmono", le="1"}': "0+3x30",
            'req_bucket{job="nonmono", le="+Inf"}': "0+6x30",
            'req_bucket{job="one", le="+Inf"}': "0+6x30",
            'req_bucket{job="neg", le="-1"}': "0+1x30",
            'req_bucket{job="neg", le="0"}': "0+2x30",
            'req_bucket{job="neg", le="+Inf"}': "0+3x30",
            'req_bucket{job="nanle", le="x"}': "0+3x30",
            'req_bucket{job="nanle", le="1"}': "0+3x30",
            'req_bucket{job="nanle", le="+Inf"}': "0+3x30",
            'req_count{job="api"}': "0+5x30",
            'req_sum{job="api"}': "0+1.7x30",
        },
        [
            f"histogram_quantile({q}, rate(req_bucket[5m]))"
            for q in ("0", "0.25", "0.5", "0.9", "0.99", "1", "1.5", "-0.5", "NaN")
        ]
        + [
            "histogram_quantile(0.5, req_bucket)",
            "histogram_quantile(0.9, sum by (le) (rate(req_bucket[5m])))",
            "histogram_quantile(0.9, sum by (job, le) (increase(req_bucket[10m])))",
            'histogram_quantile(0.5, req_bucket{job="db"} offset 20m)',
            "histogram_quantile(0.5, rate(req_bucket[5m]) * 0)",
            "histogram_quantile(0.75, sum without (le) (req_bucket))",
            "rate(req_sum[5m]) / rate(req_count[5m])",
            'req_bucket{le="+Inf"} - ignoring(le) req_count',
            "sum by (le) (req_bucket)",
        ],
        ["0s", "5m", "10m", "17m", "30m"],
    ),
    "matching": Dataset(
        "1m",
        {
            'node_cpu{instance="x", cpu="0", mode="idle"}': "0+50x10",
            'node_cpu{instance="x", cpu="0", mode="user"}': "0+10x10",
            'node_cpu{instance="x", cpu="1", mode="idle"}': "0+40x10",
            'node_cpu{instance="y", cpu="0", mode="idle"}': "0+55x10",
            'node_info{instance="x", role="web"}': "1x10",
            'node_info{instance="y", role="db"}': "1x10",
            'node_info{instance="z", role="db"}': "1x10",
            'dup{instance="x", a="1"}': "1x10",
            'dup{instance="x", a="2"}': "2x10",
            "stale_then_back": "1 2 stale 4 5 _ _ _ _ _ _ 6",
            'lookback{edge="a"}': "1 _x4 _ _",
            "nan_series": "NaN NaN 1 NaN",
            "inf_series": "Inf -Inf 0 1e308 -1e308",
        },
        [
            "node_cpu * on(instance) group_left(role) node_info",
            "node_info * on(instance) group_right(role) node_cpu",
            "node_cpu * ignoring(cpu, mode) group_left node_info",
            "node_cpu + on(instance) node_info",
            "node_info + on(role) node_info",
            'node_cpu / on(instance, cpu) group_left node_cpu{mode="user"}',
            "sum by (instance) (rate(node_cpu[5m])) * on(instance) group_left(role) node_info",
            "node_info and on(instance) node_cpu",
            "node_info unless on(instance) node_cpu",
            "node_cpu or on(instance) node_info",
            "dup * on(instance) group_left node_info",
            "node_info * on(instance) group_left dup",
            "dup + on(instance) dup",
            "dup > on(instance) group_left node_info",
            "count by (instance) (node_cpu) > bool on(instance) node_info",
            "stale_then_back",
            "stale_then_back offset 1m",
            "count_over_time(stale_then_back[5m])",
            "last_over_time(stale_then_back[3m])",
            "lookback",
            'lookback{edge="a"} @ 300',
            'lookback{edge="a"} @ 299.999',
            'count_over_time(lookback{edge="a"}[5m] @ 300)',
            'count_over_time(lookback{edge="a"}[5m] @ 299)',
            "nan_series",
            "nan_series > 0",
            "max(nan_series)",
            "min(nan_series)",
            "sum(nan_series)",
            "avg_over_time(nan_series[5m])",
            "max_over_time(nan_series[5m])",
            "min_over_time(nan_series[5m])",
            "topk(1, nan_series)",
            "nan_series == nan_series",
            "inf_series",
            "inf_series * 0",
            "inf_series - inf_series",
            "sum_over_time(inf_series[5m])",
            "avg_over_time(inf_series[5m])",
            "stddev_over_time(inf_series[5m])",
            "rate(inf_series[5m])",
            "max_over_time(inf_series[5m])",
            "sum(inf_series)",
            "avg(inf_series)",
        ],
        ["0s", "1m", "2m", "3m", "5m", "5m30s", "6m", "9m", "12m"],
    ),
    # Go's RE2 in selectors and label_replace(): Unicode classes, flags, alternation, anchoring, empty
    # matches, $-expansion, and patterns that stall a backtracking engine on the long value.
    "regexes": Dataset(
        "1m",
        {
            'word{w="alpha"}': "1x5",
            'word{w="Αλφα"}': "2x5",
            'word{w="ALPHA-2"}': "3x5",
            'word{w="a.b"}': "4x5",
            'word{w="line\\nbreak"}': "5x5",
            'word{w="日本"}': "6x5",
            'word{k="no-w"}': "7x5",
            f'word{{w="{"a" * 64}"}}': "8x5",
        },
        [
            'word{w=~"\\\\p{Greek}+"}',
            'word{w=~"\\\\pL+"}',
            'word{w=~"\\\\p{Han}+|\\\\d"}',
            'word{w=~"[[:alpha:]]+"}',
            'word{w=~"\\\\w+"}',
            'word{w=~"(?i)alpha"}',
            'word{w=~"(?i)ALPHA.*"}',
            'word{w=~"alpha|Αλφα|x"}',
            'word{w!~"a.*"}',
            'word{w=~"a\\\\.b"}',
            'word{w=~"line.break"}',
            'word{w=~"(?s)line.break"}',
            'word{w=~"(?m)line$.*"}',
            'word{w=~"(?U)a+"}',
            'word{w=~"(a+)+b"}',
            'word{w=~"(a|a)*"}',
            'word{w=~""}',
            'word{w=~"|x"}',
            'label_replace(word, "d", "<$1>", "w", "(a*)")',
            'label_replace(word, "d", "$1x|${1}x", "w", "(.*)")',
            'label_replace(word, "d", "$name-$$", "w", "(?P<name>\\\\p{Greek}+)")',
            'label_replace(word, "d", "[$2|$1]", "w", "(a)(b)?.*")',
            'label_replace(word, "d", "$01 ${01} $0", "w", "(.)(.*)")',
            'label_replace(word, "d", "$1", "w", "a)|(.*")',
            'label_replace(word, "d", "$1", "w", "\\\\Qa.b\\\\E|(x)")',
            'label_replace(word, "w", "", "w", "(?i)ALPHA")',
            'label_replace(word, "d", "$1", "k", "(.*)")',
            'label_replace(word, "d", "x", "w", "a++")',
        ],
        ["0s", "3m"],
    ),
}

CASES = [(name, expr, at) for name, ds in SETS.items() for expr in ds.exprs for at in ds.times]


@pytest.fixture(scope="module")
def reference() -> dict[tuple[str, str, str], Result]:
    """promtool's answer to every case: one promtool run per data set."""
    out: dict[tuple[str, str, str], Result] = {}
    for name, ds in SETS.items():
        cases = [(expr, at) for expr in ds.exprs for at in ds.times]
        for (expr, at), result in zip(cases, promtool_eval(ds.series, ds.interval, cases), strict=True):
            out[(name, expr, at)] = result
    return out


@pytest.fixture(scope="module")
def engines() -> dict[str, Engine]:
    """One engine per data set over every input sample."""
    out = {}
    for name, ds in SETS.items():
        store = SampleStore(retention=math.inf)
        step_ms = round(parse_duration(ds.interval) * 1000)
        for series, values in ds.series.items():
            labels, parsed = parse_series(series, values)
            for i, value in enumerate(parsed):
                if value is not None:
                    store.append(labels, i * step_ms, value)
        out[name] = Engine(store, lookback=300.0, default_step=60.0)
    return out


def ours(engine: Engine, expr: str, at: str) -> Result:
    """Our engine's answer in promtool's terms (a scalar is one sample without labels)."""
    try:
        value = engine.query(expr, parse_duration(at))
    except (PromQLError, QueryError) as exc:
        return Result(error=str(exc))
    if isinstance(value, Scalar):
        return Result(samples=(((), value.value),))
    if isinstance(value, Vector):
        if expr.startswith("sort"):
            values = [s.value for s in value if not math.isnan(s.value)]
            assert values == sorted(values, reverse=expr.startswith("sort_desc")), f"{expr} is not sorted"
        return Result(samples=tuple(sorted((s.labels, s.value) for s in value)))
    return Result(error="rule result is not a vector or scalar")


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _same(a: Result, b: Result) -> bool:
    if (a.error is None) != (b.error is None):
        return False
    if a.error is not None:
        return True
    if [s[0] for s in a.samples] != [s[0] for s in b.samples]:
        return False
    return all(_close(x[1], y[1]) for x, y in zip(a.samples, b.samples, strict=True))


def _show(r: Result) -> str:
    if r.error is not None:
        return f"error: {r.error}"
    return "\n    ".join(f"{dict(labels)} {value!r}" for labels, value in r.samples) or "(no samples)"


@pytest.mark.parametrize(("dataset", "expr", "at"), CASES, ids=[f"{d}:{e}@{t}" for d, e, t in CASES])
def test_expression_matches_promtool(
    dataset: str,
    expr: str,
    at: str,
    reference: dict[tuple[str, str, str], Result],
    engines: dict[str, Engine],
) -> None:
    want = reference[(dataset, expr, at)]
    got = ours(engines[dataset], expr, at)
    assert _same(got, want), f"{expr} at {at}\n  ours:     {_show(got)}\n  promtool: {_show(want)}"


def test_corpus_is_broad() -> None:
    assert len({(d, e) for d, e, _ in CASES}) >= 300
    assert len(CASES) >= 1500


RULE_TEST_FILES = sorted(
    p.name for p in RULETESTS.glob("*.yml") if p.name.startswith(("pass_", "fail_", "invalid_"))
)


@pytest.fixture(scope="module")
def promtool_rule_runs() -> dict[str, tuple[int, str, str]]:
    """promtool's verdict and output on every fixture test file."""
    out = {}
    for name in RULE_TEST_FILES:
        run = run_test_rules([RULETESTS / name])
        out[name] = (run.returncode, run.stdout, run.stderr)
    return out


@pytest.mark.parametrize("name", RULE_TEST_FILES)
def test_rule_test_file_agrees_with_promtool(
    name: str, promtool_rule_runs: dict[str, tuple[int, str, str]]
) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = run_rule_tests([str(RULETESTS / name)], out, err)
    want_code, want_out, want_err = promtool_rule_runs[name]
    assert code == want_code, f"ours:\n{out.getvalue()}{err.getvalue()}\npromtool:\n{want_out}{want_err}"
    if name.startswith(("pass_", "fail_alerts", "fail_rule_error")):
        # Where no engine error message is involved, the report is byte-for-byte promtool's.
        assert (out.getvalue(), err.getvalue()) == (want_out, want_err)
