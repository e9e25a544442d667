"""PromQL function kernels. Expected numbers marked "promtool 2.42" were produced by the real
`promtool test rules` 2.42.0 (a failing promql_expr_test prints the exact values it got)."""

from __future__ import annotations

import math

import pytest

from vllm_watchdog.formats.gostrconv import parse_float
from vllm_watchdog.promql import rangefuncs as rf
from vllm_watchdog.promql.labelfuncs import label_join, label_replace
from vllm_watchdog.promql.mathfuncs import (
    DATE_FUNCTIONS,
    MATH_FUNCTIONS,
    clamp,
    clamp_max,
    clamp_min,
    date_part,
    histogram_quantile,
    quantile,
    round_to,
)
from vllm_watchdog.promql.values import QueryError

NAN = math.nan
INF = math.inf

# The series of the promtool fixture: one sample every 15 s from t=0 (None = no sample).
C = [0, 10, 20, 5, 15, 30, None, 42]  # a counter with a reset at 45 s
G = [3, 1.5, -2, 8, 8.25, 4, 0.5, 9]  # a gauge


def window(values: list[float | None], start_s: float, end_s: float) -> tuple[list[int], list[float]]:
    """Samples with start <= t <= end, the closed range Prometheus 2.42 selects."""
    ts, vals = [], []
    for i, v in enumerate(values):
        t = i * 15_000
        if v is not None and start_s * 1000 <= t <= end_s * 1000:
            ts.append(t)
            vals.append(float(v))
    return ts, vals


def same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


# --- rate / increase / delta ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "series", "range_s", "at_s", "expected"),
    [
        (rf.rate, C, 60, 105, 0.6166666666666667),  # promtool 2.42: rate(c[60s]) @105s
        (rf.increase, C, 60, 105, 37.0),  # promtool 2.42
        (rf.delta, G, 60, 105, 1.0),  # promtool 2.42
        (rf.increase, C, 100, 100, 55.00000000000001),  # promtool 2.42: reset + zero-point limit
        (rf.rate, C, 30, 105, 0.4),  # promtool 2.42: start beyond 1.1 intervals -> half interval
    ],
)
def test_extrapolated_rate_matches_promtool(fn, series, range_s, at_s, expected):
    ts, vals = window(series, at_s - range_s, at_s)
    assert fn(ts, vals, (at_s - range_s) * 1000, at_s * 1000) == expected


def test_extrapolated_rate_needs_two_samples():
    assert rf.rate([1000], [5.0], 0, 60_000) is None
    assert rf.delta([], [], 0, 60_000) is None


def test_counter_is_not_extrapolated_below_zero():
    # 10 -> 20 in 10 s: the zero point is 10 s before the first sample, closer than the range start.
    got = rf.increase([30_000, 40_000], [10.0, 20.0], 0, 40_000)
    assert got == pytest.approx(20.0)
    # delta() (not a counter) extrapolates all the way; only up to 1.1 intervals, else half of one.
    assert rf.delta([30_000, 40_000], [10.0, 20.0], 0, 40_000) == pytest.approx(15.0)
    assert rf.delta([30_000, 40_000], [10.0, 20.0], 20_000, 40_000) == pytest.approx(20.0)


def test_rate_counts_every_reset():
    # 5 -> 1 and 3 -> 2 are resets: increase = (2 - 5) + 5 + 3; both ends are on the range bounds.
    got = rf.extrapolated_rate(
        [0, 10_000, 20_000, 30_000], [5.0, 1.0, 3.0, 2.0], 0, 30_000, is_counter=True, is_rate=False
    )
    assert got == 5.0


# --- irate, idelta, deriv, predict_linear, resets, changes ------------------------------------------


def test_instant_rates():
    ts, vals = window(C, 0, 60)
    assert rf.irate(ts, vals) == 0.6666666666666666  # promtool 2.42: irate(c[60s]) @60s (after a reset)
    ts, vals = window(G, 5, 105)
    assert rf.idelta(ts, vals) == 8.5  # promtool 2.42
    assert rf.irate([0], [1.0]) is None
    assert rf.irate([0, 10_000], [5.0, 3.0]) == pytest.approx(0.3)  # a decrease is a reset


def test_linear_regression_matches_promtool():
    ts, vals = window(G, 5, 105)
    assert rf.deriv(ts, vals) == 0.055952380952380955  # promtool 2.42: deriv(g[100s]) @105s
    assert rf.predict_linear(ts, vals, 105_000, 3600) == 208.12500000000003  # promtool 2.42
    # With an offset the intercept is still at the evaluation time, not the range end.
    ts, vals = window(G, -5, 95)
    assert rf.predict_linear(ts, vals, 105_000, 60) == 5.5357142857142865  # promtool 2.42


def test_linear_regression_constant_series():
    assert rf.deriv([0, 1000, 2000], [4.0, 4.0, 4.0]) == 0.0
    assert rf.predict_linear([0, 1000], [4.0, 4.0], 5000, 60) == 4.0
    assert math.isnan(rf.deriv([0, 1000], [INF, INF]) or 0.0)
    assert rf.deriv([0], [1.0]) is None


def test_resets_and_changes():
    ts, vals = window(C, -15, 105)
    assert rf.resets(ts, vals) == 1.0  # promtool 2.42
    ts, vals = window(G, -15, 105)
    assert rf.changes(ts, vals) == 7.0  # promtool 2.42
    assert rf.changes([0, 1, 2], [NAN, NAN, 1.0]) == 1.0  # NaN -> NaN is no change
    assert rf.changes([0], [1.0]) == 0.0
    assert rf.resets([], []) is None


# --- *_over_time and holt_winters -----------------------------------------------------------------


def test_over_time_matches_promtool():
    _, vals = window(G, -15, 105)  # g[2m] @105s
    assert rf.stddev_over_time(vals) == 3.7840898426834424  # promtool 2.42
    assert rf.stdvar_over_time(vals) == 14.3193359375  # promtool 2.42
    assert rf.avg_over_time(vals) == 4.03125  # promtool 2.42
    assert rf.quantile_over_time(0.75, vals) == 8.0625  # promtool 2.42
    assert rf.holt_winters(vals, 0.5, 0.3) == 5.803381875  # promtool 2.42


def test_over_time_simple():
    vals = [3.0, NAN, 1.0, 7.0]
    assert rf.min_over_time(vals) == 1.0
    assert rf.max_over_time(vals) == 7.0
    assert math.isnan(rf.max_over_time([NAN, NAN]) or 0.0)
    assert rf.sum_over_time([1e100, 1.0, -1e100]) == 1.0  # Kahan-compensated
    assert rf.count_over_time(vals) == 4.0
    assert rf.last_over_time(vals) == 7.0
    assert rf.present_over_time(vals) == 1.0
    for fn in (rf.avg_over_time, rf.sum_over_time, rf.stddev_over_time, rf.last_over_time):
        assert fn([]) is None


def test_avg_over_time_does_not_overflow():
    assert rf.avg_over_time([1e308, 1e308, 1e308]) == pytest.approx(1e308)
    assert rf.avg_over_time([INF, 1.0, INF]) == INF
    assert math.isnan(rf.avg_over_time([INF, -INF]) or 0.0)


def test_avg_over_time_of_one_value_throughout_is_the_general_loop_bit_for_bit():
    # The constant window's shortcut must give what the incremental mean gives: the value itself, and
    # +0.0 for zeros of either sign (0.0 + -0.0 is 0.0 in the loop's first step).
    for value in (3.7, -2.5, 1e308, -1e308, 5e-324, 0.0, -0.0):
        for n in (1, 2, 300):
            got = rf.avg_over_time([value] * n)
            assert got is not None
            assert math.copysign(1.0, got) == (1.0 if value == 0 else math.copysign(1.0, value))
            assert got == (value if value != 0 else 0.0)
    mixed = rf.avg_over_time([-0.0, 0.0, -0.0])
    assert mixed == 0.0 and math.copysign(1.0, mixed) == 1.0
    assert math.isnan(rf.avg_over_time([NAN, NAN]) or 0.0)
    assert rf.avg_over_time([-INF, -INF]) == -INF


def test_holt_winters_validates_factors():
    with pytest.raises(ValueError, match=r"^invalid smoothing factor. Expected: 0 < sf < 1, got: 0.000000$"):
        rf.holt_winters([1.0, 2.0], 0, 0.3)  # message from promtool 2.42
    with pytest.raises(ValueError, match=r"^invalid trend factor. Expected: 0 < tf < 1, got: 1.000000$"):
        rf.holt_winters([1.0, 2.0], 0.5, 1)  # message from promtool 2.42
    with pytest.raises(ValueError, match=r"got: 0\.000000$"):
        rf.holt_winters([], 0, 0.5)  # validated even without samples
    assert rf.holt_winters([1.0], 0.5, 0.5) is None


def test_range_functions_dispatch():
    ts, vals = window(G, 5, 105)
    kernels = rf.RANGE_FUNCTIONS
    assert kernels["predict_linear"](ts, vals, 5_000, 105_000, 105_000, (3600.0,)) == 208.12500000000003
    assert kernels["quantile_over_time"](ts, vals, 5_000, 105_000, 105_000, (0.5,)) == quantile(0.5, vals)
    assert kernels["holt_winters"](ts, vals, 0, 0, 0, (0.5, 0.3)) == rf.holt_winters(vals, 0.5, 0.3)
    assert kernels["rate"](ts, vals, 5_000, 105_000, 105_000, ()) == rf.rate(ts, vals, 5_000, 105_000)
    assert "absent_over_time" not in kernels


# --- quantile and histogram_quantile --------------------------------------------------------------


def test_quantile():
    assert quantile(0.5, [4.0, 1.0, 3.0, 2.0]) == 2.5
    assert quantile(0.0, [4.0, 1.0]) == 1.0
    assert quantile(-0.1, [1.0]) == -INF
    assert quantile(1.1, [1.0]) == INF
    assert math.isnan(quantile(NAN, [1.0]))
    assert math.isnan(quantile(0.5, []))
    assert math.isnan(quantile(0.0, [5.0, NAN]))  # NaN sorts first


H = [(0.5, 2.0), (1.0, 5.0), (2.5, 4.0), (INF, 10.0)]  # not monotonic: 2.5 has fewer than 1


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, H, 1.0),  # promtool 2.42 (monotonicity fix-up)
        (0.95, H, 2.5),  # promtool 2.42: in the +Inf bucket -> the second-highest bound
        (0.1, H, 0.25),  # promtool 2.42: lowest bucket interpolated from 0
        (0.4, [(-1.0, 3.0), (1.0, 6.0), (INF, 6.0)], -1.0),  # promtool 2.42: lowest bound <= 0
        (0.75, [(-1.0, 3.0), (1.0, 6.0), (INF, 6.0)], 0.0),  # promtool 2.42
        (0.5, [(1.0, 1.0), (2.0, 2.0)], NAN),  # no +Inf bucket
        (0.5, [(INF, 3.0)], NAN),  # fewer than two buckets
        (0.5, [(1.0, 0.0), (INF, 0.0)], NAN),  # no observations
        (-1.0, [(1.0, 1.0), (INF, 2.0)], -INF),
        (2.0, [(1.0, 1.0), (INF, 2.0)], INF),
        (NAN, [(1.0, 1.0), (INF, 2.0)], NAN),
        (0.5, [(INF, 4.0), (2.0, 2.0), (1.0, 1.0)], 2.0),  # unsorted input; rank exactly at a boundary
        (0.5, [(1.0, 1.0), (1.0, 1.0), (2.0, 4.0), (INF, 4.0)], 1.0),  # same le coalesced (1 and 1.0)
        (0.0, [(1.0, 0.0), (2.0, 0.0), (INF, 4.0)], NAN),  # 0/0 inside the first bucket
    ],
)
def test_histogram_quantile(q, buckets, expected):
    assert same(histogram_quantile(q, buckets), expected)


def test_le_bounds_parse_as_go_floats():
    assert parse_float("+Inf", underscores=False) == INF
    assert parse_float("1e3", underscores=False) == 1000.0
    assert parse_float("0x1p-2", underscores=False) == 0.25
    for refused in ("1_000", "abc", ""):
        with pytest.raises(ValueError):
            parse_float(refused, underscores=False)


# --- math -----------------------------------------------------------------------------------------


SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, -2.0, 1e308, -1e308, 1000.0, -1000.0, 5e-324, INF, -INF, NAN]


@pytest.mark.parametrize("name", sorted(MATH_FUNCTIONS))
def test_math_functions_never_raise(name):
    for v in SPECIAL:
        assert isinstance(MATH_FUNCTIONS[name](v), float)


@pytest.mark.parametrize(
    ("name", "arg", "expected"),
    [
        ("log10", 3.0, 0.4771212547196624),  # promtool 2.42 (Go's Log differs from libm's in the last bit)
        ("ln", 3.0, 1.0986122886681096),  # promtool 2.42
        ("log2", 10.0, 3.321928094887362),  # promtool 2.42
        ("log2", 8.0, 3.0),
        ("ln", -1.0, NAN),
        ("ln", 0.0, -INF),
        ("log10", 0.0, -INF),
        ("sqrt", -1.0, NAN),
        ("exp", 1000.0, INF),  # promtool 2.42
        ("exp", -INF, 0.0),
        ("sinh", 710.0, INF),
        ("sinh", -710.0, -INF),
        ("cosh", -710.0, INF),
        ("acos", 2.0, NAN),
        ("asin", -2.0, NAN),
        ("acosh", 0.5, NAN),
        ("atanh", 1.0, INF),
        ("atanh", -1.0, -INF),
        ("atanh", 2.0, NAN),
        ("sin", INF, NAN),
        ("cos", -INF, NAN),
        ("tan", INF, NAN),
        ("floor", INF, INF),
        ("ceil", NAN, NAN),
        ("floor", -1.5, -2.0),
        ("sgn", -3.0, -1.0),
        ("sgn", 0.0, 0.0),
        ("sgn", NAN, NAN),
        ("abs", -INF, INF),
        ("deg", math.pi, 180.0),
        ("rad", 180.0, math.pi),
    ],
)
def test_math_function_values(name, arg, expected):
    assert same(MATH_FUNCTIONS[name](arg), expected)


def test_round():
    assert round_to(-2.5) == -2.0  # promtool 2.42: ties round up
    assert round_to(2.5) == 3.0  # promtool 2.42
    assert round_to(1234.5678, 0.1) == 1234.6  # promtool 2.42
    assert round_to(1234.5678, 100) == 1200.0  # promtool 2.42
    assert math.isnan(round_to(1234.5678, 0))  # promtool 2.42
    assert round_to(INF) == INF


def test_clamp():
    assert clamp(7.0, 1.0, 5.0) == 5.0
    assert clamp(-7.0, 1.0, 5.0) == 1.0
    assert clamp(3.0, 5.0, 1.0) is None  # promtool 2.42: no output when max < min
    assert math.isnan(clamp(3.0, NAN, 1.0) or 0.0)  # promtool 2.42
    assert math.isnan(clamp(-INF, NAN, NAN) or 0.0)  # promtool 2.42
    assert math.isnan(clamp_min(3.0, NAN))  # promtool 2.42
    assert clamp_max(3.0, INF) == 3.0
    assert clamp_min(NAN, INF) == INF  # Go's math.Max: +Inf beats NaN


# --- dates ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "t", "expected"),
    [
        ("day_of_week", 1700000000, 2.0),  # promtool 2.42 (Tuesday; Sunday is 0)
        ("days_in_month", 951782400, 29.0),  # promtool 2.42 (February 2000)
        ("day_of_year", -1.5, 365.0),  # promtool 2.42 (truncates towards zero: 1969-12-31)
        ("hour", -3599.9, 23.0),  # promtool 2.42
        ("year", 1700000000, 2023.0),
        ("month", 1700000000, 11.0),
        ("day_of_month", 1700000000, 14.0),
        ("minute", 1700000000, 13.0),
        # NaN and out-of-range values become int64's minimum, Go's year 292277026596-12-04 15:30:08.
        ("year", NAN, 292277026596.0),  # promtool 2.42
        ("year", 1e20, 292277026596.0),  # promtool 2.42
        ("month", NAN, 12.0),  # promtool 2.42
        ("day_of_month", NAN, 4.0),  # promtool 2.42
        ("hour", NAN, 15.0),  # promtool 2.42
        ("minute", NAN, 30.0),  # promtool 2.42
        ("day_of_week", NAN, 0.0),  # promtool 2.42
    ],
)
def test_date_part(name, t, expected):
    assert name in DATE_FUNCTIONS
    assert date_part(name, t) == expected


def test_date_part_unknown_name():
    with pytest.raises(ValueError):
        date_part("week", 0)


# --- labels ---------------------------------------------------------------------------------------

L = (("__name__", "l"), ("a", "foo-bar"), ("b", "x"))


def test_label_replace_expansion_matches_promtool():
    got = label_replace(L, "dst", "$1x-${1}x-$2-$$-$name", "a", r"(\w+)-(?P<name>\w+)")
    # promtool 2.42: "$1x" names a group "1x" (absent -> empty), ${1} is group 1.
    assert got == (*L, ("dst", "-foox-bar-$-bar"))


def test_label_replace_cases_from_promtool():
    assert label_replace(L, "b", "", "a", ".*") == L[:2]  # empty result removes the label
    assert label_replace(L, "dst", "$1", "missing", "(.*)") == L  # missing source = "", empty result
    assert label_replace(L, "dst", "y", "a", "foo") == L  # anchored: no full match, no change
    assert label_replace(L, "d", "[$1]", "a", "(?i)FOO-(BAR)|x") == (*L[:2], ("b", "x"), ("d", "[bar]"))
    assert label_replace(L, "d", "[$1]", "a", r"\d*|foo(-)\w+$") == (*L, ("d", "[-]"))


def test_label_replace_keeps_sorted_order_and_name():
    got = label_replace(L, "__name__", "new_$1", "b", "(.*)")
    assert got == (("__name__", "new_x"), ("a", "foo-bar"), ("b", "x"))
    got = label_replace(L, "aa", "$0", "b", ".*")
    assert [k for k, _ in got] == ["__name__", "a", "aa", "b"]


def test_label_replace_errors():
    with pytest.raises(QueryError, match=r"^invalid destination label name in label_replace\(\): 1bad$"):
        label_replace(L, "1bad", "x", "a", ".*")  # promtool 2.42
    with pytest.raises(QueryError, match=r"^invalid regular expression in label_replace\(\): \($"):
        label_replace(L, "d", "x", "a", "(")  # promtool 2.42
    with pytest.raises(QueryError, match="regular expression"):
        label_replace(L, "1bad", "x", "a", "(")  # the regex is checked first


def test_label_join():
    assert label_join(L, "j", "+", ["b", "missing", "a"]) == (*L, ("j", "x++foo-bar"))  # promtool 2.42
    assert label_join(L, "a", ",", ["missing"]) == (("__name__", "l"), ("b", "x"))
    assert label_join(L, "j", ",", []) == L
    with pytest.raises(QueryError, match=r"^invalid source label name in label_join\(\): 1bad$"):
        label_join(L, "j", "+", ["b", "1bad"])  # promtool 2.42
    with pytest.raises(QueryError, match=r"^invalid destination label name in label_join\(\): j-k$"):
        label_join(L, "j-k", "+", ["b"])
