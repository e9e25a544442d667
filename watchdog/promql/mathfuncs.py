"""Element-wise PromQL functions with Go float semantics: math, rounding, clamping, quantiles, dates.

Python's `math` raises where Go returns NaN or an infinity (log(0), sqrt(-1), exp(1000), x / 0);
everything here returns what Prometheus 2.42 (built with Go) returns instead.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from datetime import date

NAN = math.nan
INF = math.inf

_INV_LN2 = 1.4426950408889634  # float64(1 / Ln2), as Go's math package rounds the constant
_INV_LN10 = 0.4342944819032518  # float64(1 / Ln10)


def go_div(a: float, b: float) -> float:
    """a / b with IEEE results for a zero divisor (Go), instead of ZeroDivisionError."""
    if b != 0.0:
        return a / b
    if math.isnan(a) or a == 0.0:
        return NAN
    negative = (a < 0) != (math.copysign(1.0, b) < 0)
    return -INF if negative else INF


def go_max(x: float, y: float) -> float:
    """Go's math.Max: +Inf wins over NaN, NaN wins over everything else, +0 beats -0."""
    if INF in (x, y):
        return INF
    if math.isnan(x) or math.isnan(y):
        return NAN
    if x == 0.0 and y == 0.0:
        return y if math.copysign(1.0, x) < 0 else x
    return x if x > y else y


def go_min(x: float, y: float) -> float:
    """Go's math.Min: -Inf wins over NaN, NaN wins over everything else, -0 beats +0."""
    if -INF in (x, y):
        return -INF
    if math.isnan(x) or math.isnan(y):
        return NAN
    if x == 0.0 and y == 0.0:
        return x if math.copysign(1.0, x) < 0 else y
    return x if x < y else y


def go_floor(v: float) -> float:
    """Go's math.Floor (NaN and infinities pass through)."""
    return v if not math.isfinite(v) else float(math.floor(v))


def go_ceil(v: float) -> float:
    """Go's math.Ceil (NaN and infinities pass through)."""
    return v if not math.isfinite(v) else float(math.ceil(v))


def kahan_inc(inc: float, total: float, comp: float) -> tuple[float, float]:
    """One step of Prometheus' Kahan-Neumaier summation: returns the new (sum, compensation)."""
    t = total + inc
    if abs(total) >= abs(inc):
        comp += (total - t) + inc
    else:
        comp += (inc - t) + total
    return t, comp


def _sqrt(v: float) -> float:
    return NAN if v < 0 else math.sqrt(v)


def _exp(v: float) -> float:
    try:
        return math.exp(v)
    except OverflowError:
        return INF


_HALF_SQRT2 = 7.07106781186547524401e-01
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LOG_ODD = (
    6.666666666666735130e-01,
    2.857142874366239149e-01,
    1.818357216161805012e-01,
    1.479819860511658591e-01,
)
_LOG_EVEN = (3.999999999940941908e-01, 2.222219843214978396e-01, 1.531383769920937332e-01)


def _ln(v: float) -> float:
    # Go's math.Log on amd64 (an fdlibm-style polynomial, less exact than libm's), step for step,
    # so that ln/log2/log10 agree with Prometheus to the last bit.
    if math.isnan(v) or v == INF:
        return v
    if v == 0:
        return -INF
    if v < 0:
        return NAN
    bits: int = struct.unpack("<Q", struct.pack("<d", v))[0]
    f1: float = struct.unpack("<d", struct.pack("<Q", (bits & 0x000FFFFFFFFFFFFF) | 0x3FE0000000000000))[0]
    k = float(((bits >> 52) & 0x7FF) - 0x3FE)
    if f1 <= _HALF_SQRT2:
        k -= 1
        f1 *= 2
    f = f1 - 1
    s = f / (2 + f)
    s2 = s * s
    s4 = s2 * s2
    l1, l3, l5, l7 = _LOG_ODD
    l2, l4, l6 = _LOG_EVEN
    t1 = s2 * (l1 + s4 * (l3 + s4 * (l5 + s4 * l7)))
    t2 = s4 * (l2 + s4 * (l4 + s4 * l6))
    hfsq = 0.5 * f * f
    r = t1 + t2
    return k * _LN2_HI - ((hfsq - (s * (hfsq + r) + k * _LN2_LO)) - f)


def _log2(v: float) -> float:
    # Go: frexp, then exact for powers of two, else Log(frac) * (1/Ln2) + exp.
    if not v > 0 or math.isinf(v):
        return _ln(v)
    frac, exp = math.frexp(v)
    if frac == 0.5:
        return float(exp - 1)
    return _ln(frac) * _INV_LN2 + exp


def _log10(v: float) -> float:
    # Go computes Log(x) * (1/Ln10): log10(3) is 0.4771212547196625, not 0.47712125471966244.
    return _ln(v) * _INV_LN10


def _periodic(fn: Callable[[float], float]) -> Callable[[float], float]:
    def apply(v: float) -> float:
        return NAN if math.isinf(v) else fn(v)

    return apply


def _sinh(v: float) -> float:
    # Go switches to Exp(|x|) / 2 above 21, which overflows to ±Inf where libm's sinh still is finite.
    if abs(v) > 21:
        return math.copysign(_exp(abs(v)) * 0.5, v)
    return math.sinh(v)


def _cosh(v: float) -> float:
    return _exp(abs(v)) * 0.5 if abs(v) > 21 else math.cosh(v)


def _unit_domain(fn: Callable[[float], float]) -> Callable[[float], float]:
    def apply(v: float) -> float:
        return NAN if abs(v) > 1 else fn(v)

    return apply


def _acosh(v: float) -> float:
    return NAN if v < 1 else math.acosh(v)


def _atanh(v: float) -> float:
    if abs(v) == 1:
        return math.copysign(INF, v)
    return NAN if abs(v) > 1 else math.atanh(v)


def sgn(v: float) -> float:
    """-1, 1, or the value itself for zeros and NaN."""
    if v < 0:
        return -1.0
    if v > 0:
        return 1.0
    return v


MATH_FUNCTIONS: dict[str, Callable[[float], float]] = {
    "abs": math.fabs,
    "ceil": go_ceil,
    "floor": go_floor,
    "exp": _exp,
    "sqrt": _sqrt,
    "ln": _ln,
    "log2": _log2,
    "log10": _log10,
    "sgn": sgn,
    "sin": _periodic(math.sin),
    "cos": _periodic(math.cos),
    "tan": _periodic(math.tan),
    "asin": _unit_domain(math.asin),
    "acos": _unit_domain(math.acos),
    "atan": math.atan,
    "sinh": _sinh,
    "cosh": _cosh,
    "tanh": math.tanh,
    "asinh": math.asinh,
    "acosh": _acosh,
    "atanh": _atanh,
    "deg": lambda v: v * 180 / math.pi,
    "rad": lambda v: v * math.pi / 180,
}
"""One-argument functions applied to every sample; `pi()` takes no argument and is the scalar math.pi."""


def round_to(v: float, to_nearest: float = 1.0) -> float:
    """PromQL round(): ties go up (floor(v / to_nearest + 0.5)), computed through the inverse like Go."""
    inverse = go_div(1.0, to_nearest)
    return go_div(go_floor(v * inverse + 0.5), inverse)


def clamp(v: float, lo: float, hi: float) -> float | None:
    """PromQL clamp(); None when hi < lo, which drops every series."""
    if hi < lo:
        return None
    return go_max(lo, go_min(hi, v))


def clamp_min(v: float, lo: float) -> float:
    """PromQL clamp_min()."""
    return go_max(lo, v)


def clamp_max(v: float, hi: float) -> float:
    """PromQL clamp_max()."""
    return go_min(hi, v)


def _nan_first(v: float) -> tuple[bool, float]:
    return (not math.isnan(v), 0.0 if math.isnan(v) else v)


def quantile(q: float, values: Sequence[float]) -> float:
    """Prometheus' φ-quantile with linear interpolation; NaN samples sort first."""
    if not values or math.isnan(q):
        return NAN
    if q < 0:
        return -INF
    if q > 1:
        return INF
    ordered = sorted(values, key=_nan_first)
    n = len(ordered)
    rank = q * (n - 1)
    lower = max(0.0, math.floor(rank))
    upper = min(n - 1.0, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[int(lower)] * (1 - weight) + ordered[int(upper)] * weight


def _go_search(n: int, pred: Callable[[int], bool]) -> int:
    # Go's sort.Search, replicated so non-monotonic input (NaN counts) lands where Prometheus lands.
    i, j = 0, n
    while i < j:
        h = (i + j) >> 1
        if not pred(h):
            i = h + 1
        else:
            j = h
    return i


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus' bucketQuantile over (upper bound `le`, cumulative count) pairs of one histogram."""
    if math.isnan(q):
        return NAN
    if q < 0:
        return -INF
    if q > 1:
        return INF
    if not buckets:
        return NAN
    ordered = sorted(buckets, key=lambda b: b[0])
    if ordered[-1][0] != INF:
        return NAN
    merged: list[list[float]] = []
    for le, count in ordered:
        if merged and merged[-1][0] == le:
            merged[-1][1] += count
        else:
            merged.append([le, count])
    highest = merged[0][1]
    for bucket in merged[1:]:
        if bucket[1] > highest:
            highest = bucket[1]
        elif bucket[1] < highest:
            bucket[1] = highest
    if len(merged) < 2:
        return NAN
    observations = merged[-1][1]
    if observations == 0:
        return NAN
    rank = q * observations
    b = _go_search(len(merged) - 1, lambda i: merged[i][1] >= rank)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start = 0.0
    end, count = merged[b]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * go_div(rank, count)


# Go's time package counts seconds from an "absolute" zero year; int64 wrap-around follows from it.
_UNIX_TO_INTERNAL = (1969 * 365 + 1969 // 4 - 1969 // 100 + 1969 // 400) * 86400
_ABSOLUTE_ZERO_YEAR = -292277022399
_ABSOLUTE_TO_INTERNAL = -9223371966579724800  # (absoluteZeroYear - 1) * 365.2425 * 86400
_DAYS_PER_400_YEARS = 146097


def _go_int64(v: float) -> int:
    # int64(v) on amd64: truncation; NaN and out-of-range values become math.MinInt64.
    if math.isnan(v) or not -(2.0**63) <= v < 2.0**63:
        return -(2**63)
    return int(v)


def date_part(name: str, t_seconds: float) -> float:
    """day_of_month, day_of_week (Sunday=0), day_of_year, days_in_month, hour, minute, month or year (UTC)."""
    absolute = (_go_int64(t_seconds) + _UNIX_TO_INTERNAL - _ABSOLUTE_TO_INTERNAL) % 2**64
    days, secs = divmod(absolute, 86400)
    if name == "hour":
        return float(secs // 3600)
    if name == "minute":
        return float(secs % 3600 // 60)
    if name == "day_of_week":
        return float((days + 1) % 7)  # the absolute zero day is a Monday
    cycles, rest = divmod(days, _DAYS_PER_400_YEARS)
    day = date.fromordinal(rest + 1)  # the absolute calendar repeats every 400 years from 0001-01-01
    year = _ABSOLUTE_ZERO_YEAR + 400 * cycles + day.year - 1
    if name == "year":
        return float(year)
    if name == "month":
        return float(day.month)
    if name == "day_of_month":
        return float(day.day)
    if name == "day_of_year":
        return float(day.timetuple().tm_yday)
    if name == "days_in_month":
        if day.month == 2:
            leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
            return 29.0 if leap else 28.0
        return 30.0 if day.month in (4, 6, 9, 11) else 31.0
    raise ValueError(f"unknown date function {name!r}")


DATE_FUNCTIONS = (
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "hour",
    "minute",
    "month",
    "year",
)
"""The names date_part() accepts; with no argument they apply to the evaluation time."""
