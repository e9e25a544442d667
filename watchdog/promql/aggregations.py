"""Aggregation operators (sum, avg, topk, quantile, count_values, ...) with Prometheus 2.42 semantics."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from decimal import Decimal
from functools import lru_cache

from ..store import Labels
from . import mathfuncs
from .binops import Vec
from .values import QueryError

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_INT64_MAX = 2.0**63


@lru_cache(maxsize=1 << 16)
def group_labels(labels: Labels, grouping: tuple[str, ...], without: bool) -> Labels:
    """The labels of the group a series falls into (`without` also drops `__name__`); cached, as rules
    group the same series every evaluation."""
    if without:
        return tuple(p for p in labels if p[0] != "__name__" and p[0] not in grouping)
    if not grouping:
        return ()
    return tuple(p for p in labels if p[0] in grouping)


def format_value(v: float) -> str:
    """Go's strconv.FormatFloat(v, 'f', -1, 64): shortest digits, never an exponent."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    return format(Decimal(repr(v)).normalize(), "f")


# Go's container/heap, with the Less of Prometheus' vectorByValueHeap / vectorByReverseValueHeap.
_Less = Callable[[float, float], bool]


def _less_topk(a: float, b: float) -> bool:
    return math.isnan(a) or a < b


def _less_bottomk(a: float, b: float) -> bool:
    return math.isnan(a) or a > b


def _up(h: list[tuple[Labels, float]], j: int, less: _Less) -> None:
    while True:
        i = (j - 1) // 2
        if i == j or j <= 0 or not less(h[j][1], h[i][1]):
            break
        h[i], h[j] = h[j], h[i]
        j = i


def _down(h: list[tuple[Labels, float]], i0: int, n: int, less: _Less) -> None:
    i = i0
    while True:
        j1 = 2 * i + 1
        if j1 >= n or j1 < 0:
            break
        j = j1
        j2 = j1 + 1
        if j2 < n and less(h[j2][1], h[j1][1]):
            j = j2
        if not less(h[j][1], h[i][1]):
            break
        h[i], h[j] = h[j], h[i]
        i = j


def _heap_push(h: list[tuple[Labels, float]], item: tuple[Labels, float], less: _Less) -> None:
    h.append(item)
    _up(h, len(h) - 1, less)


def _heap_pop(h: list[tuple[Labels, float]], less: _Less) -> None:
    n = len(h) - 1
    h[0], h[n] = h[n], h[0]
    _down(h, 0, n, less)
    h.pop()


def _sorted(h: list[tuple[Labels, float]], descending: bool) -> list[tuple[Labels, float]]:
    """What sort.Sort(sort.Reverse(h)) gives for Prometheus' value heaps, as Go's insertion sort orders a
    short input: by value, equal values in their order, and the NaNs last in reverse order; in O(n log n)."""
    numbers = [sample for sample in h if sample[1] == sample[1]]  # NaN is not equal to itself
    nans = [sample for sample in h if sample[1] != sample[1]]
    numbers.sort(key=_value, reverse=descending)  # stable: reverse=True keeps equal values in order
    nans.reverse()
    return numbers + nans


def _value(sample: tuple[Labels, float]) -> float:
    return sample[1]


def sort_vector(vec: Vec, descending: bool) -> Vec:
    """Prometheus' sort() / sort_desc(): NaN last in both."""
    return _sorted(list(vec), descending)


def _k_of(param: float) -> int:
    if math.isnan(param) or not -_INT64_MAX <= param < _INT64_MAX:
        raise QueryError(f"Scalar value {param} overflows int64")
    return int(param)


def _top(op: str, vec: Vec, k: int, grouping: tuple[str, ...], without: bool) -> Vec:
    less = _less_topk if op == "topk" else _less_bottomk
    heaps: dict[Labels, list[tuple[Labels, float]]] = {}
    for sample in vec:
        key = group_labels(sample[0], grouping, without)
        h = heaps.get(key)
        if h is None:
            heaps[key] = [sample]
            continue
        top = h[0][1]
        if len(h) < k or less(top, sample[1]) or math.isnan(top):
            if len(h) == k:
                if k == 1:
                    h[0] = sample
                    continue
                _heap_pop(h, less)
            _heap_push(h, sample, less)
    out: Vec = []
    for h in heaps.values():
        out.extend(_sorted(h, op == "topk"))
    return out


class _Group:
    __slots__ = ("count", "mean", "value", "values")

    def __init__(self, v: float) -> None:
        self.value = v
        self.mean = v
        self.count = 1
        self.values = [v]


def _accumulate(op: str, g: _Group, v: float) -> None:
    if op == "sum":
        g.value += v
    elif op == "avg":
        g.count += 1
        if math.isinf(g.mean):
            if math.isinf(v) and (g.mean > 0) == (v > 0):
                return
            if not math.isinf(v) and not math.isnan(v):
                return
        g.mean += v / g.count - g.mean / g.count
    elif op == "max":
        if g.value < v or math.isnan(g.value):
            g.value = v
    elif op == "min":
        if g.value > v or math.isnan(g.value):
            g.value = v
    elif op in ("count", "count_values"):
        g.count += 1
    elif op in ("stddev", "stdvar"):
        g.count += 1
        delta = v - g.mean
        g.mean += delta / g.count
        g.value += delta * (v - g.mean)
    elif op == "quantile":
        g.values.append(v)


def _finish(op: str, g: _Group, q: float) -> float:
    if op == "avg":
        return g.mean
    if op in ("count", "count_values"):
        return float(g.count)
    if op == "stdvar":
        return g.value / g.count
    if op == "stddev":
        return math.sqrt(g.value / g.count)
    if op == "quantile":
        return mathfuncs.quantile(q, g.values)
    return g.value


def aggregate(
    op: str, vec: Vec, grouping: tuple[str, ...], without: bool, param: float | str | None = None
) -> Vec:
    """Evaluate one aggregation over an instant vector; `param` is k, q or count_values' label."""
    if op in ("topk", "bottomk"):
        k = _k_of(float(param) if isinstance(param, float) else math.nan)
        return [] if k < 1 else _top(op, vec, k, grouping, without)
    if op == "count_values":
        label = str(param)
        if not _LABEL_NAME.match(label):
            raise QueryError(f'invalid label name "{label}"')
        if not without:
            grouping = tuple(sorted({*grouping, label}))
        vec = [(_with_label(labels, label, format_value(v)), v) for labels, v in vec]
    if op == "sum":
        return _sum(vec, grouping, without)
    q = float(param) if isinstance(param, float) else 0.0
    groups: dict[Labels, _Group] = {}
    for labels, v in vec:
        key = group_labels(labels, grouping, without)
        g = groups.get(key)
        if g is None:
            g = groups[key] = _Group(v)
            if op in ("stddev", "stdvar"):
                g.value = 0.0
            elif op == "group":
                g.value = 1.0
            continue
        _accumulate(op, g, v)
    return [(key, _finish(op, g, q)) for key, g in groups.items()]


def _sum(vec: Vec, grouping: tuple[str, ...], without: bool) -> Vec:
    sums: dict[Labels, float] = {}
    for labels, v in vec:
        key = group_labels(labels, grouping, without)
        total = sums.get(key)
        sums[key] = v if total is None else total + v
    return list(sums.items())


def _with_label(labels: Labels, name: str, value: str) -> Labels:
    d = dict(labels)
    d[name] = value
    return tuple(sorted(d.items()))
