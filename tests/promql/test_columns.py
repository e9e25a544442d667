"""What the engine keeps between queries (selections, window starts) and the range functions that read the
store's columns in place: a long-lived engine must answer exactly as a fresh one, and the in-place kernels
exactly as the general ones over a filtered copy of the window."""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_watchdog.promql.columns import Selections, range_function, window
from vllm_watchdog.promql.engine import Engine
from vllm_watchdog.promql.rangefuncs import COLUMN_FUNCTIONS, RANGE_FUNCTIONS
from vllm_watchdog.promql.selectors import parse_selector
from vllm_watchdog.promql.values import Matrix, QueryError, Sample, Scalar, String, Vector
from vllm_watchdog.store import STALE_NAN, SampleStore, Series, make_labels

SPECIAL = (0.0, -0.0, 1.0, 2.0, 5.0, -1.0, math.inf, -math.inf, math.nan, STALE_NAN)
VALUES = st.one_of(st.sampled_from(SPECIAL), st.floats(-1e6, 1e6))
EXPRS = [
    "rate(c[20s])",
    "increase(c[35s])",
    "delta(c[10s] offset 5s)",
    "max_over_time(c[25s])",
    "min_over_time(c[1m])",
    "sum by (le) (rate(c[30s]))",
    "histogram_quantile(0.9, sum by (le) (rate(c[30s])))",
    "c",
    "count(c)",
    # over empty selections these are given again from the first evaluation over nothing
    'absent(c{job="a", le="1"})',
    'absent_over_time(c{le="2"}[10s])',
    'sum(rate(c{job="b"}[20s])) or vector(3)',
    "count(nothing) or on() vector(2)",
]


# The engine sums a range function over a named selector as it reads the windows; in parentheses the same
# expression goes the general way (a vector, then the aggregation).
SUMS = [
    (f"sum {g} ({f}(c[{r}]))", f"sum {g} (({f}(c[{r}])))")
    for g in ("", "by (le)", "by (job)", "without (le)", "by (le, job)")
    for f, r in (("rate", "20s"), ("increase", "35s"), ("delta", "10s"), ("max_over_time", "25s"))
]


def bits(v: float) -> bytes:
    return struct.pack("<d", v)


def copy(store: SampleStore) -> SampleStore:
    """The same samples appended afresh, so each series' index is built in one go."""
    out = SampleStore(retention=store.retention)
    for series in store.select(None):
        for t, v in zip(series.ts, series.vals, strict=True):
            out.append(series.labels, t, v)
    return out


def answer(engine: Engine, expr: str, t: float) -> object:
    """A query's result as comparable data: labels and the bits of each value, or the error."""
    try:
        value = engine.query(expr, t)
    except QueryError as exc:
        return str(exc)
    if isinstance(value, Vector):
        return sorted((s.labels, bits(s.value)) for s in value)
    assert not isinstance(value, (Matrix, Scalar, String))
    return value


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(VALUES, min_size=0, max_size=25),
    gaps=st.lists(st.integers(1, 4000), min_size=25, max_size=25),
    start=st.integers(-2000, 60_000),
    width=st.integers(0, 60_000),
)
def test_in_place_kernels_match_the_general_ones(
    values: Sequence[float], gaps: Sequence[int], start: int, width: int
) -> None:
    store = SampleStore(retention=math.inf)
    series = store.get(make_labels("c", {"le": "1"}))
    t = 0
    for v, gap in zip(values, gaps, strict=False):
        t += gap
        series.append(t, v)
    store.register(series)
    end = start + width
    selection = Selections(store).select(parse_selector("c"))
    for name in sorted(COLUMN_FUNCTIONS):
        got = range_function(name, selection, (width, 0), start, end, end)
        lo = sum(1 for x in series.ts if x < start)
        hi = sum(1 for x in series.ts if x <= end)
        w = window(series, lo, hi, start, end) if lo < hi else None
        want = None if w is None else RANGE_FUNCTIONS[name](w.ts, w.vals, start, end, end, ())
        assert [(labels, bits(v)) for labels, v in got] == (
            [] if want is None else [((("le", "1"),), bits(want))]
        ), name


@pytest.mark.parametrize("seed", range(6))
def test_a_long_lived_engine_answers_as_a_fresh_one(seed: int) -> None:
    # Series appear, get samples (resets, NaNs), go stale, are dropped by gc and come back; the clock goes
    # back. The engine that keeps selections and window starts across it all must see what a new one sees.
    rng = random.Random(seed)
    store = SampleStore(retention=40.0)
    les = ("0.5", "1", "2", "+Inf", "x")
    handles = [store.get(make_labels("c", {"le": le, "job": job})) for le in les for job in ("a", "b")]
    engine = Engine(store, lookback=30.0)
    now_ms = 0
    for _ in range(300):
        now_ms += rng.choice((1000, 1000, 2500, 7000))
        handle = rng.choice(handles)
        op = rng.random()
        if op < 0.5:
            handle.append(now_ms, rng.choice((rng.uniform(0, 100), rng.choice(SPECIAL))))
            store.register(handle)
        elif op < 0.55:
            handle.mark_stale(now_ms)
        elif op < 0.65:
            store.gc(now_ms / 1000)
        elif op < 0.68:
            now_ms -= rng.randrange(1000, 20_000)
            store.drop_after(now_ms)
        else:
            at = (now_ms + rng.randrange(-30_000, 5000)) / 1000
            fresh, rebuilt = Engine(store, lookback=30.0), Engine(copy(store), lookback=30.0)
            for expr in EXPRS:
                got = answer(engine, expr, at)
                assert got == answer(fresh, expr, at) == answer(rebuilt, expr, at), expr
            for fused, apart in SUMS:  # a sum of a range function is summed as it goes: the same bits
                assert answer(engine, fused, at) == answer(fresh, apart, at), fused


def test_window_starts_are_checked_on_use() -> None:
    store = SampleStore(retention=10.0)
    s: Series = store.get(make_labels("c", {}))
    for t in range(0, 20_000, 1000):
        s.append(t, t / 1000)
    store.register(s)
    selections = Selections(store)
    selection = selections.select(parse_selector("c"))

    def rate_at(t: int) -> float:
        ((_, v),) = range_function("rate", selection, (5000, 0), t - 5000, t, t)
        return v

    assert rate_at(19_000) == 1.0
    assert selection.starts((5000, 0)) == [14]
    store.gc(19.0)  # trims nine samples: the remembered start now points past the window
    assert rate_at(19_000) == 1.0 and selection.starts((5000, 0)) == [5]
    assert rate_at(12_000) == 0.7  # an earlier time: the window starts at the first sample left (9 s)
    assert selection.starts((5000, 0)) == [0]
    assert selections.select(parse_selector("c")) is selection


def test_a_result_over_nothing_is_kept_only_while_it_reads_no_series_and_not_the_time() -> None:
    store = SampleStore(retention=600.0)
    engine = Engine(store)
    assert answer(engine, 'absent(up{job="x"})', 100.0) == [((("job", "x"),), bits(1.0))]
    assert answer(engine, 'absent(up{job="x"})', 200.0) == [((("job", "x"),), bits(1.0))]
    assert engine.query('absent(up{job="x"})', 200.0) == Vector([Sample((("job", "x"),), 1.0, 200_000)])
    store.append(make_labels("up", {"job": "x"}), 250_000, 1.0)  # a series appears: evaluated again
    assert answer(engine, 'absent(up{job="x"})', 260.0) == []
    # These read the time: over nothing too, each time gives its own answer.
    for expr, at, later in (
        ("vector(time())", 100.0, 101.0),
        ("timestamp(vector(1))", 100.0, 101.0),
        ("minute()", 100.0, 160.0),
        ("count_over_time(vector(1)[3m:1m])", 120.0, 121.0),
        ("absent(nothing) * time()", 100.0, 101.0),
    ):
        assert answer(engine, expr, at) != answer(engine, expr, later), expr


def test_a_shared_block_works_out_a_summed_range_function_once_per_time_unless_its_name_is_written() -> None:
    store = SampleStore(retention=600.0)
    for le in ("1", "+Inf"):
        for job in ("a", "b"):
            s = store.get(make_labels("c", {"le": le, "job": job}))
            for t in range(0, 59_000, 1000):
                s.append(t, t / 1000 * (2 if le == "1" else 3))
            store.register(s)
    engine, fresh = Engine(store), Engine(store)
    expr, at = "sum by (le) (rate(c[20s]))", 59.0
    with engine.shared(frozenset({"ALERTS"})):
        first = answer(engine, expr, at)
        assert first == answer(fresh, expr, at)
        store.append(make_labels("c", {"le": "1", "job": "a"}), 59_000, 1e9)  # (no rule could write this)
        assert answer(engine, expr, at) == first  # worked out once for the block, at this time
        assert answer(engine, expr, 58.0) == answer(fresh, expr, 58.0)  # another time: its own
        assert answer(engine, "sum by (le) ((rate(c[20s])))", at) != first  # the general way sees the sample
    assert answer(engine, expr, at) == answer(fresh, expr, at) != first  # outside a block: nothing kept
    with engine.shared(frozenset({"c"})):  # rules write `c` meanwhile: never kept
        before = answer(engine, expr, 60.0)
        store.append(make_labels("c", {"le": "+Inf", "job": "b"}), 60_000, 5e9)
        assert answer(engine, expr, 60.0) != before
        assert answer(engine, expr, 60.0) == answer(fresh, expr, 60.0)
