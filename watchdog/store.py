"""The sample store: a short in-memory window per series, with Prometheus staleness markers."""

from __future__ import annotations

import math
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Mapping

Labels = tuple[tuple[str, str], ...]
"""A series identity: (name, value) pairs sorted by name, including `__name__`."""

STALE_NAN: float = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
_STALE_BITS = struct.pack("<d", STALE_NAN)


def is_stale(value: float) -> bool:
    """True for Prometheus' special staleness NaN (distinct from an ordinary NaN)."""
    return math.isnan(value) and struct.pack("<d", value) == _STALE_BITS


def make_labels(name: str, labels: dict[str, str]) -> Labels:
    """Build a sorted Labels tuple; empty label values are dropped, as in Prometheus."""
    pairs = [(k, v) for k, v in labels.items() if v != "" and k != "__name__"]
    pairs.append(("__name__", name))
    return tuple(sorted(pairs))


def labels_dict(labels: Labels) -> dict[str, str]:
    """Labels as a plain dict."""
    return dict(labels)


def metric_name(labels: Labels) -> str:
    """The `__name__` of a series."""
    for key, value in labels:
        if key == "__name__":
            return value
    return ""


class Series:
    """The samples of one series (timestamps in ms and values, oldest first), and where the odd ones lie."""

    __slots__ = (
        "gen",
        "labels",
        "name",
        "nans",
        "prev",
        "registered",
        "resets",
        "stales",
        "ts",
        "unnamed",
        "vals",
    )

    def __init__(self, labels: Labels) -> None:
        self.labels = labels
        self.name = metric_name(labels)
        self.unnamed: Labels = tuple(p for p in labels if p[0] != "__name__")
        self.ts = array("q")
        self.vals = array("d")
        self.gen = -1  # scrape generation that last saw this series (used by the scraper)
        self.registered = False
        # Sorted times of staleness markers, other NaNs and counter resets (a value below the non-stale one
        # before it): two bisections rule them out of a range window, so rate() needs no pass over it.
        self.stales: list[int] = []
        self.nans: list[int] = []
        self.resets: list[int] = []
        self.prev = math.nan  # the newest non-stale value; NaN compares false, so no reset follows it

    def append(self, t_ms: int, value: float) -> bool:
        """Append a sample; out-of-order or duplicate timestamps are rejected like Prometheus."""
        ts = self.ts
        if ts and t_ms <= ts[-1]:
            return False
        ts.append(t_ms)
        self.vals.append(value)
        if value != value:  # noqa: PLR0124 (fast NaN test)
            if is_stale(value):
                self.stales.append(t_ms)
                return True
            self.nans.append(t_ms)
        elif value < self.prev:
            self.resets.append(t_ms)
        self.prev = value
        return True

    def mark_stale(self, t_ms: int) -> None:
        """Append a staleness marker unless the series is already stale."""
        if self.vals and not is_stale(self.vals[-1]):
            self.append(t_ms, STALE_NAN)

    def trim(self, min_t_ms: int) -> None:
        """Drop samples older than min_t_ms."""
        i = bisect_left(self.ts, min_t_ms)
        if i:
            del self.ts[:i]
            del self.vals[:i]
            for times in (self.stales, self.nans, self.resets):
                if times and times[0] < min_t_ms:
                    del times[: bisect_left(times, min_t_ms)]

    def truncate(self, max_t_ms: int) -> int:
        """Drop samples newer than max_t_ms; returns how many."""
        ts, vals = self.ts, self.vals
        i = bisect_right(ts, max_t_ms)
        dropped = len(ts) - i
        if dropped:
            del ts[i:]
            del vals[i:]
            for times in (self.stales, self.nans, self.resets):
                del times[bisect_right(times, max_t_ms) :]
            self.prev = next((v for v in reversed(vals) if not is_stale(v)), math.nan)
        return dropped

    def window(self, start_ms: int, end_ms: int) -> tuple[array[int], array[float]]:
        """Samples with start_ms < t <= end_ms (a left-open range, as range selectors read)."""
        lo = bisect_right(self.ts, start_ms)
        hi = bisect_right(self.ts, end_ms)
        return self.ts[lo:hi], self.vals[lo:hi]

    def at(self, t_ms: int, lookback_ms: int) -> tuple[int, float] | None:
        """The newest sample at or before t_ms within the lookback; None if absent or stale."""
        i = bisect_right(self.ts, t_ms) - 1
        if i < 0 or self.ts[i] <= t_ms - lookback_ms or is_stale(self.vals[i]):
            return None
        return self.ts[i], self.vals[i]

    def __len__(self) -> int:
        return len(self.ts)


class SampleStore:
    """All series, indexed by metric name; bounded by a retention window, per name where one is set."""

    def __init__(self, retention: float) -> None:
        self.retention = retention  # the longest
        self.retention_by_name: dict[str, float] = {}
        self.other_retention: float | None = None  # names without their own keep this much (None: retention)
        self._by_name: dict[str, dict[Labels, Series]] = {}
        self._count = 0
        self._version = 0
        self._name_versions: dict[str, int] = {}

    def _changed(self, name: str) -> None:
        self._version += 1
        self._name_versions[name] = self._version

    def version(self, name: str | None = None) -> int:
        """A number that changes whenever a series named `name` (any series if None) is added or dropped."""
        if name is None:
            return self._version
        return self._name_versions.get(name, 0)

    def get(self, labels: Labels) -> Series:
        """The stored series with these labels, created (unregistered) if absent."""
        name = metric_name(labels)
        existing = self._by_name.get(name, {}).get(labels)
        return existing if existing is not None else Series(labels)

    def register(self, series: Series) -> None:
        """Make a series visible to queries (idempotent)."""
        if series.registered:
            return
        bucket = self._by_name.setdefault(series.name, {})
        if series.labels not in bucket:
            bucket[series.labels] = series
            self._count += 1
            self._changed(series.name)
        series.registered = True

    def append(self, labels: Labels, t_ms: int, value: float) -> Series:
        """Append one sample to the series with these labels, registering it if new."""
        series = self.get(labels)
        series.append(t_ms, value)
        self.register(series)
        return series

    def select(self, name: str | None, keep: Callable[[Labels], bool] | None = None) -> Iterator[Series]:
        """Series with this metric name (every series if None) whose labels pass `keep`."""
        buckets = [self._by_name.get(name, {})] if name is not None else list(self._by_name.values())
        for bucket in buckets:
            for series in list(bucket.values()):
                if keep is None or keep(series.labels):
                    yield series

    def names(self) -> list[str]:
        """Every metric name that has series."""
        return sorted(self._by_name)

    def drop_after(self, t_ms: int) -> int:
        """Drop every sample newer than t_ms (the wall clock went back: they lie in the future and would make
        every new sample out of order); returns how many."""
        return sum(series.truncate(t_ms) for bucket in self._by_name.values() for series in bucket.values())

    def gc(self, now: float) -> int:
        """Trim samples older than the retention (the name's own, where set); drop series left empty. Returns
        series dropped."""
        other = self.retention if self.other_retention is None else min(self.other_retention, self.retention)
        default_min_t = math.floor((now - other) * 1000)
        own = self.retention_by_name
        dropped = 0
        for name in list(self._by_name):
            bucket = self._by_name[name]
            keep = own.get(name)
            min_t = default_min_t if keep is None else math.floor((now - min(keep, self.retention)) * 1000)
            for labels in list(bucket):
                series = bucket[labels]
                series.trim(min_t)
                if not series.ts or (len(series) == 1 and is_stale(series.vals[0])):
                    del bucket[labels]
                    series.registered = False
                    dropped += 1
                    self._changed(name)
            if not bucket:
                del self._by_name[name]
        self._count -= dropped
        return dropped

    @property
    def series_count(self) -> int:
        """How many series are stored."""
        return self._count

    @property
    def sample_count(self) -> int:
        """How many samples are stored (O(series))."""
        return sum(len(s) for b in self._by_name.values() for s in b.values())


class Exposure:
    """The series one source exposed last time; committing a new batch stale-marks the rest."""

    def __init__(self, store: SampleStore) -> None:
        self.store = store
        self._live: list[Series] = []
        self._gen = 0

    def commit(self, batch: list[tuple[Series, float, int]], t_ms: int) -> None:
        """Append a whole collection at once; series absent from it get a stale marker at t_ms."""
        self._gen += 1
        gen = self._gen
        live: list[Series] = []
        register = self.store.register
        for series, value, ts in batch:
            if series.gen != gen:
                series.gen = gen
                live.append(series)
            series.append(ts, value)
            if not series.registered:
                register(series)
        for series in self._live:
            if series.gen != gen:
                series.mark_stale(t_ms)
        self._live = live

    def stale_all(self, t_ms: int) -> None:
        """The source failed or went away: everything it exposed goes stale now."""
        for series in self._live:
            series.mark_stale(t_ms)
        self._live = []

    def __len__(self) -> int:
        return len(self._live)


class SeriesCache:
    """Series handles by name and labels, for a source that writes the same series at every collection;
    `extra` labels (job, instance) are added to every series it hands out."""

    def __init__(self, store: SampleStore, extra: Mapping[str, str] | None = None) -> None:
        self.store = store
        self.extra = dict(extra or {})
        self._cache: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = {}

    def get(self, name: str, labels: Mapping[str, str]) -> Series:
        """The stored series `name{labels, extra}`, looked up once."""
        key = (name, tuple(sorted(labels.items())))
        series = self._cache.get(key)
        if series is None:
            full = {**labels, **self.extra}
            series = self._cache[key] = self.store.get(make_labels(name, full))
        return series

    def __len__(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        """Forget every handle (the series stay in the store)."""
        self._cache.clear()
