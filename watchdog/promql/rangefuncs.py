"""Range-vector function kernels (rate, *_over_time, ...) with Prometheus 2.42's exact arithmetic.

Every kernel works on one series: `ts` are millisecond timestamps in ascending order, `vals` the
aligned values, without staleness markers. A kernel returns None where Prometheus emits no sample
for the series (for example rate() over fewer than two samples).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import pairwise

from .mathfuncs import NAN, go_div, kahan_inc, quantile


def extrapolated_rate(
    ts: Sequence[int],
    vals: Sequence[float],
    range_start_ms: int,
    range_end_ms: int,
    *,
    is_counter: bool,
    is_rate: bool,
) -> float | None:
    """rate/increase/delta: the change over the samples, extrapolated towards the range boundaries."""
    n = len(ts)
    if n < 2:
        return None
    result = vals[-1] - vals[0]
    if is_counter:
        prev = vals[0]
        for v in vals[1:]:
            if v < prev:
                result += prev  # a counter reset: the series restarted from zero
            prev = v
    return extrapolate(result, n, ts[0], ts[-1], vals[0], range_start_ms, range_end_ms, is_counter, is_rate)


def extrapolate(
    result: float,
    n: int,
    first_ms: int,
    last_ms: int,
    first: float,
    range_start_ms: int,
    range_end_ms: int,
    is_counter: bool,
    is_rate: bool,
) -> float:
    """The second half of extrapolated_rate: `result` (the change over n >= 2 samples) scaled to the range."""
    to_start = (first_ms - range_start_ms) / 1000
    to_end = (range_end_ms - last_ms) / 1000
    sampled = (last_ms - first_ms) / 1000
    average = sampled / (n - 1)
    if is_counter and result > 0 and first >= 0:
        # Do not extrapolate a counter to below zero.
        to_zero = sampled * (first / result)
        to_start = to_zero if to_zero < to_start else to_start
    # Extrapolate to a boundary only if it is within 1.1 sample intervals; else half an interval.
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    factor = go_div(interval, sampled)
    if is_rate:
        factor = go_div(factor, (range_end_ms - range_start_ms) / 1000)
    return result * factor


def rate(ts: Sequence[int], vals: Sequence[float], range_start_ms: int, range_end_ms: int) -> float | None:
    """Per-second increase of a counter over the range."""
    return extrapolated_rate(ts, vals, range_start_ms, range_end_ms, is_counter=True, is_rate=True)


def increase(
    ts: Sequence[int], vals: Sequence[float], range_start_ms: int, range_end_ms: int
) -> float | None:
    """Increase of a counter over the range."""
    return extrapolated_rate(ts, vals, range_start_ms, range_end_ms, is_counter=True, is_rate=False)


def delta(ts: Sequence[int], vals: Sequence[float], range_start_ms: int, range_end_ms: int) -> float | None:
    """Change of a gauge over the range."""
    return extrapolated_rate(ts, vals, range_start_ms, range_end_ms, is_counter=False, is_rate=False)


def _instant_value(ts: Sequence[int], vals: Sequence[float], is_rate: bool) -> float | None:
    if len(ts) < 2:
        return None
    last, previous = vals[-1], vals[-2]
    result = last if is_rate and last < previous else last - previous
    interval = ts[-1] - ts[-2]
    if interval == 0:
        return None
    return result / (interval / 1000) if is_rate else result


def irate(ts: Sequence[int], vals: Sequence[float]) -> float | None:
    """Per-second rate from the last two samples (a decrease counts as a counter reset)."""
    return _instant_value(ts, vals, True)


def idelta(ts: Sequence[int], vals: Sequence[float]) -> float | None:
    """Difference between the last two samples."""
    return _instant_value(ts, vals, False)


def _linear_regression(ts: Sequence[int], vals: Sequence[float], intercept_ms: int) -> tuple[float, float]:
    n = 0.0
    sum_x = c_x = sum_y = c_y = sum_xy = c_xy = sum_x2 = c_x2 = 0.0
    first = vals[0]
    constant = True
    for t, v in zip(ts, vals, strict=True):
        if constant and v != first:
            constant = False
        n += 1.0
        x = (t - intercept_ms) / 1e3
        sum_x, c_x = kahan_inc(x, sum_x, c_x)
        sum_y, c_y = kahan_inc(v, sum_y, c_y)
        sum_xy, c_xy = kahan_inc(x * v, sum_xy, c_xy)
        sum_x2, c_x2 = kahan_inc(x * x, sum_x2, c_x2)
    if constant:
        if math.isinf(first):
            return NAN, NAN
        return 0.0, first
    sum_x += c_x
    sum_y += c_y
    sum_xy += c_xy
    sum_x2 += c_x2
    cov_xy = sum_xy - sum_x * sum_y / n
    var_x = sum_x2 - sum_x * sum_x / n
    slope = go_div(cov_xy, var_x)
    return slope, sum_y / n - slope * sum_x / n


def deriv(ts: Sequence[int], vals: Sequence[float]) -> float | None:
    """Per-second slope of a least-squares line through the samples."""
    if len(ts) < 2:
        return None
    return _linear_regression(ts, vals, ts[0])[0]


def predict_linear(
    ts: Sequence[int], vals: Sequence[float], eval_t_ms: int, duration_s: float
) -> float | None:
    """The least-squares line's value duration_s after the evaluation time (not the range end)."""
    if len(ts) < 2:
        return None
    slope, intercept = _linear_regression(ts, vals, eval_t_ms)
    return slope * duration_s + intercept


def resets(ts: Sequence[int], vals: Sequence[float]) -> float | None:
    """How many times the value decreased."""
    if not vals:
        return None
    return float(sum(1 for prev, cur in pairwise(vals) if cur < prev))


def changes(ts: Sequence[int], vals: Sequence[float]) -> float | None:
    """How many times the value changed (NaN to NaN is no change)."""
    if not vals:
        return None
    count = 0
    for prev, cur in pairwise(vals):
        if cur != prev and not (math.isnan(cur) and math.isnan(prev)):
            count += 1
    return float(count)


def avg_over_time(vals: Sequence[float]) -> float | None:
    """Mean of the values, computed incrementally (with Kahan compensation) so it cannot overflow."""
    if not vals:
        return None
    first = vals[0]
    if math.isfinite(first) and vals.count(first) == len(vals):
        # One finite value throughout: every step adds exactly 0 and no compensation (zeros end as +0.0).
        return first + 0.0
    mean = comp = count = 0.0
    isinf = math.isinf
    for v in vals:
        count += 1
        if isinf(mean):
            if isinf(v) and (mean > 0) == (v > 0):
                continue  # same-sign infinities: the mean stays what it is
            if not isinf(v) and not math.isnan(v):
                continue  # a finite value cannot move an infinite mean
        inc = v / count - mean / count
        t = mean + inc  # kahan_inc(inc, mean, comp), inlined: the same operations in the same order
        if abs(mean) >= abs(inc):
            comp += (mean - t) + inc
        else:
            comp += (inc - t) + mean
        mean = t
    return mean if isinf(mean) else mean + comp


def min_over_time(vals: Sequence[float]) -> float | None:
    """Smallest value; NaN only if every value is NaN."""
    if not vals:
        return None
    lowest = vals[0]
    for v in vals:
        if v < lowest or math.isnan(lowest):
            lowest = v
    return lowest


def max_over_time(vals: Sequence[float]) -> float | None:
    """Largest value; NaN only if every value is NaN."""
    if not vals:
        return None
    highest = vals[0]
    for v in vals:
        if v > highest or math.isnan(highest):
            highest = v
    return highest


def sum_over_time(vals: Sequence[float]) -> float | None:
    """Sum of the values (Kahan-Neumaier compensated)."""
    if not vals:
        return None
    total = comp = 0.0
    for v in vals:
        total, comp = kahan_inc(v, total, comp)
    return total if math.isinf(total) else total + comp


def count_over_time(vals: Sequence[float]) -> float | None:
    """Number of samples."""
    return float(len(vals)) if vals else None


def last_over_time(vals: Sequence[float]) -> float | None:
    """The newest value."""
    return vals[-1] if vals else None


def present_over_time(vals: Sequence[float]) -> float | None:
    """1 for a series with any sample in the range."""
    return 1.0 if vals else None


def stdvar_over_time(vals: Sequence[float]) -> float | None:
    """Population variance (Welford's algorithm with Kahan-compensated sums)."""
    if not vals:
        return None
    count = mean = c_mean = aux = c_aux = 0.0
    for v in vals:
        count += 1
        diff = v - (mean + c_mean)
        mean, c_mean = kahan_inc(diff / count, mean, c_mean)
        aux, c_aux = kahan_inc(diff * (v - (mean + c_mean)), aux, c_aux)
    return (aux + c_aux) / count


def stddev_over_time(vals: Sequence[float]) -> float | None:
    """Population standard deviation."""
    variance = stdvar_over_time(vals)
    if variance is None:
        return None
    return NAN if variance < 0 else math.sqrt(variance)


def quantile_over_time(q: float, vals: Sequence[float]) -> float | None:
    """The φ-quantile of the values (see mathfuncs.quantile)."""
    return quantile(q, vals) if vals else None


def _go_f(v: float) -> str:
    # Go's %f verb, which Prometheus uses in the holt_winters error messages.
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:f}"


def holt_winters(vals: Sequence[float], sf: float, tf: float) -> float | None:
    """Double exponential smoothing; ValueError (Prometheus' message) unless 0 < sf < 1 and 0 < tf < 1."""
    if sf <= 0 or sf >= 1:
        raise ValueError(f"invalid smoothing factor. Expected: 0 < sf < 1, got: {_go_f(sf)}")
    if tf <= 0 or tf >= 1:
        raise ValueError(f"invalid trend factor. Expected: 0 < tf < 1, got: {_go_f(tf)}")
    if len(vals) < 2:
        return None
    s0 = 0.0
    s1 = vals[0]
    trend = vals[1] - vals[0]
    for i in range(1, len(vals)):
        x = sf * vals[i]
        if i > 1:
            trend = tf * (s1 - s0) + (1 - tf) * trend
        y = (1 - sf) * (s1 + trend)
        s0, s1 = s1, x + y
    return s1


RangeKernel = Callable[[Sequence[int], Sequence[float], int, int, int, Sequence[float]], float | None]
"""A uniform kernel: (ts, vals, range_start_ms, range_end_ms, eval_t_ms, scalar_args) -> value or None.

`scalar_args` are the call's scalar arguments in order, without the range vector: (q,) for
quantile_over_time, (duration_s,) for predict_linear, (sf, tf) for holt_winters, () otherwise.
"""


def _windowed(fn: Callable[[Sequence[int], Sequence[float], int, int], float | None]) -> RangeKernel:
    return lambda ts, vals, start, end, _t, _args: fn(ts, vals, start, end)


def _pairwise(fn: Callable[[Sequence[int], Sequence[float]], float | None]) -> RangeKernel:
    return lambda ts, vals, _start, _end, _t, _args: fn(ts, vals)


def _values(fn: Callable[[Sequence[float]], float | None]) -> RangeKernel:
    return lambda _ts, vals, _start, _end, _t, _args: fn(vals)


RANGE_FUNCTIONS: dict[str, RangeKernel] = {
    "rate": _windowed(rate),
    "increase": _windowed(increase),
    "delta": _windowed(delta),
    "irate": _pairwise(irate),
    "idelta": _pairwise(idelta),
    "deriv": _pairwise(deriv),
    "resets": _pairwise(resets),
    "changes": _pairwise(changes),
    "predict_linear": lambda ts, vals, _s, _e, t, args: predict_linear(ts, vals, t, args[0]),
    "avg_over_time": _values(avg_over_time),
    "min_over_time": _values(min_over_time),
    "max_over_time": _values(max_over_time),
    "sum_over_time": _values(sum_over_time),
    "count_over_time": _values(count_over_time),
    "last_over_time": _values(last_over_time),
    "present_over_time": _values(present_over_time),
    "stddev_over_time": _values(stddev_over_time),
    "stdvar_over_time": _values(stdvar_over_time),
    "quantile_over_time": lambda _ts, vals, _s, _e, _t, args: quantile_over_time(args[0], vals),
    "holt_winters": lambda _ts, vals, _s, _e, _t, args: holt_winters(vals, args[0], args[1]),
}
"""Every range-vector function except absent_over_time (which the engine answers from the whole matrix)."""


CHANGE_FUNCTIONS: dict[str, tuple[bool, bool]] = {
    "rate": (True, True),
    "increase": (True, False),
    "delta": (False, False),
}
"""The functions of extrapolated_rate, with its (is_counter, is_rate): over a window without a counter reset
its sum is the last value minus the first, so they read the store's columns in place through extrapolate()."""

EXTREMA: dict[str, Callable[[Sequence[float]], float]] = {"max_over_time": max, "min_over_time": min}
"""Over a window without NaNs these are max() and min(): both keep the first of equal values, as Go's do."""

COLUMN_FUNCTIONS = frozenset((*CHANGE_FUNCTIONS, *EXTREMA))
"""Range functions that read windows in place where the series' index rules out what they cannot take."""
