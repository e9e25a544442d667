"""Range functions and selections that read the store's columns in place, and what carries across queries.

A selector's matching series are kept between queries and checked against the store's version for the
selector's metric name, which changes when a series of that name is added or dropped. A range function of
COLUMN_FUNCTIONS reads a window where the series lies (no copy) unless the series' own index of staleness
markers, NaNs and counter resets shows one inside it; then it filters a copy and runs the general kernel.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from ..store import Labels, SampleStore, Series, is_stale
from .aggregations import group_labels
from .binops import Vec
from .rangefuncs import CHANGE_FUNCTIONS, EXTREMA, RANGE_FUNCTIONS, extrapolate
from .selectors import Selector

_MAX_SELECTIONS = 4096


class Window:
    """One series' samples inside a range, with the range's bounds (for rate's extrapolation)."""

    __slots__ = ("end_ms", "labels", "start_ms", "ts", "vals")

    def __init__(
        self, labels: Labels, ts: Sequence[int], vals: Sequence[float], start_ms: int, end_ms: int
    ) -> None:
        self.labels = labels
        self.ts = ts
        self.vals = vals
        self.start_ms = start_ms
        self.end_ms = end_ms


def any_within(times: list[int], lo: int, hi: int) -> bool:
    """Whether a sorted list holds a time t with lo <= t <= hi."""
    if not times:
        return False
    i = bisect_left(times, lo)
    return i < len(times) and times[i] <= hi


def window(series: Series, lo: int, hi: int, start_ms: int, end_ms: int) -> Window | None:
    """The samples ts[lo:hi] of a series without its staleness markers; None when only markers are left."""
    wts, wvals = series.ts[lo:hi], series.vals[lo:hi]
    if any_within(series.stales, wts[0], wts[-1]):
        keep = [i for i, v in enumerate(wvals) if not is_stale(v)]
        if not keep:
            return None
        wts = array("q", (wts[i] for i in keep))
        wvals = array("d", (wvals[i] for i in keep))
    return Window(series.labels, wts, wvals, start_ms, end_ms)


def range_function(
    name: str,
    selection: Selection,
    key: tuple[int, int],
    start_ms: int,
    end_ms: int,
    t: int,
    summed: tuple[tuple[str, ...], bool] | None = None,
) -> Vec:
    """A function of COLUMN_FUNCTIONS over each selected series' samples in [start_ms, end_ms], at t; with
    `summed` (grouping, without), what `sum by/without` makes of it, in the same order of additions."""
    kernel = _Kernel(name, start_ms, end_ms, t)
    starts = selection.starts(key)
    groups, group_labels_ = (None, []) if summed is None else selection.groups(*summed)
    sums = [0.0] * len(group_labels_)
    order: list[int] = []  # groups in the order of their first value, as a dict of sums would hold them
    started = [False] * len(group_labels_)
    out: Vec = []
    for i, s in enumerate(selection.series):
        ts = s.ts
        n = len(ts)
        if not n:
            continue
        hi = n if ts[n - 1] <= end_ms else bisect_right(ts, end_ms)
        # Where the window began last time is usually where it begins now (or one sample on).
        lo = starts[i]
        if lo > n or (lo and ts[lo - 1] >= start_ms) or (lo < n and ts[lo] < start_ms):
            lo += 1
            if lo > n or ts[lo - 1] >= start_ms or (lo < n and ts[lo] < start_ms):
                lo = bisect_left(ts, start_ms)
        starts[i] = lo
        value = kernel.value(s, lo, hi) if lo < hi else None
        if value is None:
            continue
        if groups is None:
            out.append((s.unnamed, value))
            continue
        group = groups[i]
        if started[group]:
            sums[group] += value
        else:
            started[group] = True
            order.append(group)
            sums[group] = value
    if groups is None:
        return out
    return [(group_labels_[g], sums[g]) for g in order]


class _Kernel:
    """One range function over one range, applied to a series' window in place when its indexes allow."""

    __slots__ = ("end_ms", "extreme", "is_counter", "is_rate", "name", "start_ms", "t")

    def __init__(self, name: str, start_ms: int, end_ms: int, t: int) -> None:
        self.name, self.start_ms, self.end_ms, self.t = name, start_ms, end_ms, t
        self.is_counter, self.is_rate = CHANGE_FUNCTIONS.get(name, (False, False))
        self.extreme = EXTREMA.get(name)

    def value(self, s: Series, lo: int, hi: int) -> float | None:
        """The function of s's samples ts[lo:hi] (lo < hi); None where it has none."""
        ts, start_ms, end_ms = s.ts, self.start_ms, self.end_ms
        first, last = ts[lo], ts[hi - 1]
        stale = bool(s.stales) and any_within(s.stales, first, last)
        if (
            (stale and self.extreme is not None)
            or (self.is_counter and s.resets and any_within(s.resets, first + 1, last))
            or (self.extreme is not None and s.nans and any_within(s.nans, first, last))
        ):
            w = window(s, lo, hi, start_ms, end_ms)
            if w is None:
                return None
            return RANGE_FUNCTIONS[self.name](w.ts, w.vals, start_ms, end_ms, self.t, ())
        if self.extreme is not None:
            return self.extreme(s.vals[lo:hi])
        if stale:
            return _change_skipping_stale(s, lo, hi, self)
        if hi - lo < 2:
            return None
        v0 = s.vals[lo]
        change = s.vals[hi - 1] - v0
        # No change (an idle counter, most buckets of a histogram): extrapolating scales it by a finite
        # positive factor, which leaves a zero as it is, sign included.
        if change == 0.0:
            return change
        return extrapolate(change, hi - lo, first, last, v0, start_ms, end_ms, self.is_counter, self.is_rate)


def _change_skipping_stale(s: Series, lo: int, hi: int, k: _Kernel) -> float | None:
    """rate, increase or delta of ts[lo:hi] less its staleness markers, in place: what the general kernel
    gives on the filtered copy when no counter reset lies inside (the caller checked), without the copy.
    Each marker is one sample, so the series' sorted marker times count those inside."""
    ts, vals, stales = s.ts, s.vals, s.stales
    n = hi - lo - (bisect_right(stales, ts[hi - 1]) - bisect_left(stales, ts[lo]))
    if n < 2:
        return None
    f, b = lo, hi - 1
    while is_stale(vals[f]):
        f += 1
    while is_stale(vals[b]):
        b -= 1
    v0 = vals[f]
    change = vals[b] - v0
    if change == 0.0:
        return change  # as the general kernel: extrapolating scales it by a finite positive factor
    return extrapolate(change, n, ts[f], ts[b], v0, k.start_ms, k.end_ms, k.is_counter, k.is_rate)


class Selection:
    """The series one selector picked (in label order), where its range windows began last time, and the
    group each falls into for an aggregation."""

    __slots__ = ("_groups", "_starts", "series", "version")

    def __init__(self, version: int, series: list[Series]) -> None:
        self.version = version
        self.series = series
        self._starts: dict[tuple[int, int], list[int]] = {}
        self._groups: dict[tuple[tuple[str, ...], bool], tuple[list[int], list[Labels]]] = {}

    def groups(self, grouping: tuple[str, ...], without: bool) -> tuple[list[int], list[Labels]]:
        """The groups of `by (grouping)` or `without (grouping)`: per series the number of its group, and
        per number the group's labels."""
        found = self._groups.get((grouping, without))
        if found is None:
            numbers: dict[Labels, int] = {}
            of_series = [
                numbers.setdefault(group_labels(s.unnamed, grouping, without), len(numbers))
                for s in self.series
            ]
            found = self._groups[(grouping, without)] = (of_series, list(numbers))
        return found

    def starts(self, key: tuple[int, int]) -> list[int]:
        """Per series, where a window of this (range, offset) began last time: a guess, checked on use."""
        found = self._starts.get(key)
        if found is None:
            found = self._starts[key] = [0] * len(self.series)
        return found


class Selections:
    """Each selector's matching series, in label order, kept until the store adds or drops one of its name."""

    def __init__(self, store: SampleStore) -> None:
        self.store = store
        self._found: dict[Selector, Selection] = {}

    def select(self, selector: Selector) -> Selection:
        """The stored series a selector picks."""
        version = self.store.version(selector.name)
        hit = self._found.get(selector)
        if hit is not None and hit.version == version:
            return hit
        if len(self._found) >= _MAX_SELECTIONS:  # ad-hoc queries must not grow it without bound
            self._found.clear()
        found = sorted(self.store.select(selector.name, selector.predicate()), key=lambda s: s.labels)
        selection = self._found[selector] = Selection(version, found)
        return selection
