"""Tests for the PromQL evaluator core: selectors, subqueries, operators, aggregations, calls and compile errors.

Expected values were cross-checked against promtool 2.42 (`promtool test rules` with empty exp_samples).
"""

from __future__ import annotations

import math

import pytest

from watchdog.promql.aggregations import group_labels
from watchdog.promql.compile import compile_expr
from watchdog.promql.engine import Engine, vector_query
from watchdog.promql.values import Matrix, PromQLError, QueryError, Scalar, String, Vector
from watchdog.store import STALE_NAN, Labels, SampleStore, make_labels

MIN = 60_000


def store_with(series: dict[str, list[float | None]], step_ms: int = MIN) -> SampleStore:
    """A store from `{'name{a="b"}': [v0, v1, None, ...]}`, one sample per step from t=0."""
    store = SampleStore(1e9)
    for key, values in series.items():
        name, _, rest = key.partition("{")
        pairs = [p.split("=", 1) for p in rest.rstrip("}").split(",") if p]
        labels = make_labels(name, {k: v.strip('"') for k, v in pairs})
        for i, v in enumerate(values):
            if v is not None:
                store.append(labels, i * step_ms, v)
    return store


def result(engine: Engine, expr: str, at: float) -> dict[Labels, float]:
    value = engine.query(expr, at)
    assert isinstance(value, Vector)
    return {s.labels: s.value for s in value}


def lab(**kw: str) -> Labels:
    return tuple(sorted(kw.items()))


X1 = lab(__name__="x", a="1", b="x")
X2 = lab(__name__="x", a="2", b="y")


@pytest.fixture
def engine() -> Engine:
    store = store_with(
        {
            'x{a="1",b="x"}': [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            'x{a="2",b="y"}': [10, None, 30, STALE_NAN, 50, 60, 70, 80, 90, 100],
            'y{a="1"}': [2] * 10,
            'y{a="2"}': [0] * 10,
            "c": [0, 10, 20, 5, 15, 25, 0, 10, 20, 30],
            'h_bucket{le="0.1"}': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
            'h_bucket{le="1"}': [0, 2, 4, 6, 8, 10, 12, 14, 16, 18],
            'h_bucket{le="+Inf"}': [0, 3, 6, 9, 12, 15, 18, 21, 24, 27],
            'h_bucket{le="bogus"}': [1] * 10,
        }
    )
    return Engine(store)


# -- selectors ---------------------------------------------------------------------------------------------


def test_instant_selector_uses_lookback_and_staleness(engine: Engine) -> None:
    assert result(engine, "x", 240) == {X1: 5, X2: 50}
    assert result(engine, "x", 180) == {X1: 4}  # the stale marker hides a=2
    assert result(engine, 'x{a="2"}', 60) == {X2: 10}  # no sample at 1m: the 0m one is within lookback


def test_lookback_window_is_closed() -> None:
    store = store_with({"g": [7.0]})
    engine = Engine(store, lookback=300)
    assert result(engine, "g", 300) == {lab(__name__="g"): 7}
    assert result(engine, "g", 300.001) == {}


def test_range_window_is_closed_and_drops_stale_markers(engine: Engine) -> None:
    # samples at 0,1,2,3,4 min are all inside [t-4m, t] at t=4m
    assert result(engine, "count_over_time(x[4m])", 240) == {lab(a="1", b="x"): 5, lab(a="2", b="y"): 3}
    value = engine.query('x{a="2"}[4m]', 240)
    assert isinstance(value, Matrix)
    assert list(value[0].ts) == [0, 2 * MIN, 4 * MIN]


def test_offset_and_at_modifiers(engine: Engine) -> None:
    assert result(engine, "x offset 2m", 240) == {X1: 3, X2: 30}
    assert result(engine, "x offset -1m", 240) == {X1: 6, X2: 60}
    assert result(engine, "x @ 120", 480) == {X1: 3, X2: 30}
    assert result(engine, "sum_over_time(x[2m] @ 300)", 0) == {lab(a="1", b="x"): 15, lab(a="2", b="y"): 110}
    assert result(engine, "x @ start()", 240) == {X1: 5, X2: 50}
    matrix = engine.query_range('x{a="1"} @ end()', 0, 120, 60)
    assert [list(s.vals) for s in matrix] == [[3, 3, 3]]


# -- subqueries --------------------------------------------------------------------------------------------


def test_subquery_points_are_step_aligned_and_closed(engine: Engine) -> None:
    value = engine.query('x{a="1"}[2m:1m]', 150)
    assert isinstance(value, Matrix)
    assert list(value[0].ts) == [60_000, 120_000]
    assert list(value[0].vals) == [2, 3]
    value = engine.query('x{a="1"}[2m:1m]', 180)
    assert isinstance(value, Matrix)
    assert list(value[0].ts) == [60_000, 120_000, 180_000]


def test_subquery_default_step_and_nesting() -> None:
    store = store_with({"x": [float(i) for i in range(20)]}, step_ms=30_000)
    engine = Engine(store, default_step=60)
    value = engine.query("x[3m:]", 300)
    assert isinstance(value, Matrix)
    assert list(value[0].ts) == [120_000, 180_000, 240_000, 300_000]
    assert result(engine, "max_over_time(max_over_time(x[2m:30s])[4m:1m])", 300) == {(): 10}
    assert result(engine, "max_over_time(rate(x[2m])[5m:1m])", 300) == {(): pytest.approx(1 / 30)}


# -- binary operators --------------------------------------------------------------------------------------


def test_arithmetic_drops_name_and_comparison_keeps_it(engine: Engine) -> None:
    assert result(engine, "x + y", 240) == {}  # x has a `b` label that y lacks
    assert result(engine, "x + ignoring(b) y", 240) == {lab(a="1"): 7, lab(a="2"): 50}
    assert result(engine, "x / on(a) y", 240) == {lab(a="1"): 2.5, lab(a="2"): math.inf}
    assert result(engine, "x > 5", 240) == {X2: 50}
    assert result(engine, "5 < x", 240) == {X2: 50}
    assert result(engine, "x > bool 5", 240) == {lab(a="1", b="x"): 0, lab(a="2", b="y"): 1}
    # 2.42 keeps the metric name for atan2 (it is not an arithmetic operator there)
    atan2 = result(engine, "x atan2 ignoring(b) y", 240)
    assert atan2 == {
        lab(__name__="x", a="1"): pytest.approx(math.atan2(5, 2)),
        lab(__name__="x", a="2"): math.pi / 2,
    }


def test_go_float_semantics() -> None:
    engine = Engine(SampleStore(1e9))
    for expr, want in [
        ("-7 % 3", -1.0),
        ("7 % -3", 1.0),
        ("1 / 0", math.inf),
        ("-1 / 0", -math.inf),
        ("0 ^ -1", math.inf),
        ("2 ^ 2000", math.inf),
        ("1 > bool 0", 1.0),
    ]:
        value = engine.query(expr, 0)
        assert isinstance(value, Scalar)
        assert value.value == want, expr
    for expr in ("0 / 0", "5 % 0", "(-8) ^ 0.5"):
        value = engine.query(expr, 0)
        assert isinstance(value, Scalar)
        assert math.isnan(value.value), expr


def test_vector_matching_group_left_and_errors() -> None:
    store = store_with(
        {'x{a="1",b="x"}': [5], 'z{a="1"}': [1], 'z{a="1",c="2"}': [2], 'info{a="1",v="9"}': [1]}
    )
    engine = Engine(store)
    assert result(engine, "x * on(a) group_left(v) info", 0) == {lab(a="1", b="x", v="9"): 5}
    with pytest.raises(
        QueryError, match=r"found duplicate series for the match group .*many-to-many matching"
    ):
        engine.query("x * on(a) z", 0)
    with pytest.raises(QueryError, match="same labelset"):
        engine.query('label_replace(z, "c", "", "", "")', 0)


def test_matching_labels_depend_on_the_operation_not_only_the_series() -> None:
    # Signatures and result labels are cached per (operation, label sets): the same series under other
    # clauses must still get their own.
    store = store_with({'x{a="1",b="x"}': [5], 'y{a="1",b="x",c="z"}': [2]})
    engine = Engine(store)
    for _ in range(2):
        assert result(engine, "x * on(a) y", 0) == {lab(a="1"): 10}
        assert result(engine, "x * on(a, b) y", 0) == {lab(a="1", b="x"): 10}
        assert result(engine, "x * ignoring(c) y", 0) == {lab(a="1", b="x"): 10}
        assert result(engine, "x * on(a) group_left(c) y", 0) == {lab(a="1", b="x", c="z"): 10}
        assert result(engine, "x > on(a) y", 0) == {lab(a="1"): 5}
        assert result(engine, "x and ignoring(c) y", 0) == {lab(__name__="x", a="1", b="x"): 5}
        assert result(engine, "x and y", 0) == {}


def test_set_operators(engine: Engine) -> None:
    assert result(engine, "x and y", 240) == {}  # x has a `b` label that y lacks
    assert set(result(engine, "x and on(a) y", 240)) == {X1, X2}
    assert set(result(engine, 'x unless on(a) y{a="1"}', 240)) == {X2}
    assert len(result(engine, "x or y", 240)) == 4


def test_unary_minus_drops_name(engine: Engine) -> None:
    assert result(engine, "-x", 240) == {lab(a="1", b="x"): -5, lab(a="2", b="y"): -50}


# -- aggregations ------------------------------------------------------------------------------------------


def test_basic_aggregations(engine: Engine) -> None:
    assert result(engine, "sum(x)", 240) == {(): 55}
    assert result(engine, "avg by (a) (x)", 240) == {lab(a="1"): 5, lab(a="2"): 50}
    assert result(engine, "sum without (a) (x)", 240) == {lab(b="x"): 5, lab(b="y"): 50}
    assert result(engine, 'count_values("v", y)', 240) == {lab(v="2"): 1, lab(v="0"): 1}
    assert result(engine, "stddev(x)", 240) == {(): 22.5}
    assert result(engine, "quantile(0.5, x)", 240) == {(): 27.5}
    assert result(engine, "topk(1, x)", 240) == {X2: 50}
    assert result(engine, "bottomk(1, x)", 240) == {X1: 5}
    assert result(engine, "topk(0, x)", 240) == {}


def test_aggregations_nan_and_overflow() -> None:
    store = store_with(
        {'n{a="1"}': [math.nan], 'n{a="2"}': [3.0], 'big{a="1"}': [1e308], 'big{a="2"}': [1e308]}
    )
    engine = Engine(store)
    assert result(engine, "max(n)", 0) == {(): 3}
    assert result(engine, "min(n)", 0) == {(): 3}
    assert result(engine, "avg(big)", 0) == {(): 1e308}
    assert result(engine, "sum(big)", 0) == {(): math.inf}
    assert result(engine, "topk(1, n)", 0) == {lab(__name__="n", a="2"): 3}


def test_sum_adds_in_order_and_grouping_is_the_same_every_time() -> None:
    # Group keys and bucket bounds are cached per label set; sums stay left to right (no compensation).
    store = store_with({f's{{a="{i % 2}",b="{i}"}}': [v] for i, v in enumerate([1e16, 1.0, -1e16, 1.0, 1.0])})
    engine = Engine(store)
    for _ in range(2):
        assert result(engine, "sum by (a) (s)", 0) == {lab(a="0"): 1.0, lab(a="1"): 2.0}
        assert result(engine, "sum without (b) (s)", 0) == {lab(a="0"): 1.0, lab(a="1"): 2.0}
    assert group_labels(lab(__name__="s", a="1", b="2"), ("a",), False) == lab(a="1")
    assert group_labels(lab(__name__="s", a="1", b="2"), ("a",), True) == lab(b="2")


# -- functions ---------------------------------------------------------------------------------------------


def test_range_functions(engine: Engine) -> None:
    assert result(engine, 'rate(x{a="1"}[5m])', 240) == {lab(a="1", b="x"): pytest.approx(1 / 60)}
    assert result(engine, "increase(c[5m])", 240) == {(): pytest.approx(35.0)}
    assert result(engine, 'last_over_time(x{a="1"}[2m])', 240) == {X1: 5}
    assert result(engine, "changes(c[10m])", 540) == {(): 9}
    assert result(engine, "resets(c[10m])", 540) == {(): 2}


def test_histogram_quantile_skips_bad_le(engine: Engine) -> None:
    got = result(engine, "histogram_quantile(0.5, h_bucket)", 240)
    assert got == {(): pytest.approx(0.1 + 0.9 * (6 - 4) / 4)}


def test_absent_labels_and_timestamp(engine: Engine) -> None:
    assert result(engine, 'absent(nope{job="a",env=~"p.*"})', 0) == {lab(job="a"): 1}
    assert result(engine, 'absent((nope{job="a"}))', 0) == {lab(job="a"): 1}
    assert result(engine, 'absent_over_time(nope{job="a",job="b",c="d"}[5m])', 0) == {lab(c="d"): 1}
    assert result(engine, "absent(x)", 0) == {}
    assert result(engine, 'timestamp(x{a="2"})', 60) == {lab(a="2", b="y"): 0}
    assert result(engine, 'timestamp(sum(x{a="2"}))', 60) == {(): 60}


def test_misc_functions(engine: Engine) -> None:
    assert result(engine, "day_of_month(vector(1700000000))", 0) == {(): 14}
    assert result(engine, "vector(time())", 42) == {(): 42}
    assert result(engine, "clamp(x, 2, 6)", 240) == {lab(a="1", b="x"): 5, lab(a="2", b="y"): 6}
    assert result(engine, "clamp(x, 6, 2)", 240) == {}
    got = result(engine, 'label_replace(x, "c", "$1-z", "a", "(.*)")', 240)
    assert got == {lab(__name__="x", a="1", b="x", c="1-z"): 5, lab(__name__="x", a="2", b="y", c="2-z"): 50}
    value = engine.query("sort_desc(x)", 240)
    assert isinstance(value, Vector)
    assert [s.value for s in value] == [50, 5]
    scalar = engine.query('scalar(x{a="1"})', 240)
    assert isinstance(scalar, Scalar)
    assert scalar.value == 5


def test_name_dropping_function_duplicates_fail() -> None:
    store = store_with({'x{a="1"}': [1], 'z{a="1"}': [2]})
    with pytest.raises(QueryError, match="vector cannot contain metrics with the same labelset"):
        Engine(store).query('abs({__name__=~"x|z"})', 0)


# -- query_range, vector_query -----------------------------------------------------------------------------


def test_query_range(engine: Engine) -> None:
    matrix = engine.query_range('x{a="2"}', 0, 240, 60)
    assert len(matrix) == 1
    assert list(matrix[0].ts) == [0, 60_000, 120_000, 240_000]
    assert list(matrix[0].vals) == [10, 10, 30, 50]
    scalars = engine.query_range("time()", 0, 120, 60)
    assert [list(s.vals) for s in scalars] == [[0, 60, 120]]
    with pytest.raises(QueryError):
        engine.query_range("x[5m]", 0, 60, 60)


def test_vector_query_wraps_scalars(engine: Engine) -> None:
    query = vector_query(engine)
    got = query("1 + 1", 10)
    assert [(s.labels, s.value, s.t_ms) for s in got] == [((), 2.0, 10_000)]
    assert isinstance(engine.query('"s"', 0), String)
    with pytest.raises(QueryError):
        query('"s"', 0)


# -- compile -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("sum(rate(x[5m])) by (", 21),
        ("rate(x[5m]) +", 13),
        ('foo{a=~"("}', 7),
        ("1 +* 2", 3),
        ("x )", 2),
        ("nosuch(x)", 0),
        ("x + nosuch(y)", 4),
        ('foo{a="b" or c="d"}', 10),
        ("histogram_count(x)", 0),
        ("x + limitk(2, x)", 4),
    ],
)
def test_compile_error_positions(text: str, position: int) -> None:
    with pytest.raises(PromQLError) as info:
        compile_expr(text)
    assert info.value.position == position


def test_compile_accepts_2_42_syntax() -> None:
    for text in (
        "holt_winters(x[5m], 0.5, 0.5)",
        "x offset -5m @ end()",
        "rate(x[5m:])",
        "sum by (a) (x) > bool 1",
    ):
        compile_expr(text)
