from __future__ import annotations

import math

from vllm_watchdog.store import STALE_NAN, Exposure, SampleStore, is_stale, make_labels


def test_stale_nan_is_distinct_from_nan() -> None:
    assert is_stale(STALE_NAN)
    assert not is_stale(math.nan) and not is_stale(1.0)


def test_append_rejects_out_of_order_and_duplicates() -> None:
    store = SampleStore(retention=600)
    labels = make_labels("x", {"a": "1"})
    s = store.append(labels, 1000, 1.0)
    assert not s.append(1000, 2.0) and not s.append(900, 3.0)
    assert list(s.vals) == [1.0]


def test_lookback_and_staleness_in_at() -> None:
    store = SampleStore(retention=600)
    s = store.append(make_labels("x", {}), 1_000, 5.0)
    assert s.at(1_000 + 299_999, 300_000) == (1_000, 5.0)
    assert s.at(1_000 + 300_000, 300_000) is None  # lookback is left-open
    s.mark_stale(2_000)
    assert s.at(2_500, 300_000) is None
    s.mark_stale(3_000)
    assert len(s) == 2  # an already stale series gets no second marker


def test_window_is_left_open() -> None:
    store = SampleStore(retention=600)
    s = store.get(make_labels("x", {}))
    for t in (1000, 2000, 3000):
        s.append(t, t / 1000)
    ts, vals = s.window(1000, 3000)
    assert list(ts) == [2000, 3000] and list(vals) == [2.0, 3.0]


def test_exposure_stale_marks_what_vanished() -> None:
    store = SampleStore(retention=600)
    exp = Exposure(store)
    a, b = store.get(make_labels("a", {})), store.get(make_labels("b", {}))
    exp.commit([(a, 1.0, 1000), (b, 1.0, 1000)], 1000)
    exp.commit([(a, 2.0, 2000)], 2000)
    assert is_stale(b.vals[-1]) and b.ts[-1] == 2000
    assert not is_stale(a.vals[-1])
    exp.stale_all(3000)
    assert is_stale(a.vals[-1])
    assert store.series_count == 2


def test_gc_trims_and_drops_dead_series() -> None:
    store = SampleStore(retention=10)
    live = store.append(make_labels("live", {}), 0, 1.0)
    dead = store.append(make_labels("dead", {}), 0, 1.0)
    live.append(15_000, 2.0)
    dead.mark_stale(15_000)
    assert store.gc(now=20.0) == 1
    assert store.names() == ["live"] and list(live.ts) == [15_000]
    assert not dead.registered


def test_empty_label_values_are_dropped_and_sorted() -> None:
    assert make_labels("m", {"b": "2", "a": "1", "c": ""}) == (("__name__", "m"), ("a", "1"), ("b", "2"))


def test_series_index_of_stale_markers_nans_and_resets() -> None:
    s = SampleStore(retention=600).get(make_labels("c", {"a": "1"}))
    for t, v in enumerate([1.0, 3.0, 2.0, math.nan, 1.0, STALE_NAN, 0.5, 0.5, -1.0], start=1):
        s.append(t * 1000, v)
    assert s.stales == [6000] and s.nans == [4000]
    # 2 < 3 resets; 1 after NaN does not (NaN compares false); 0.5 after a marker compares with the 1 before it.
    assert s.resets == [3000, 7000, 9000]
    assert s.unnamed == (("a", "1"),) and s.labels[0] == ("__name__", "c")


def test_series_index_follows_trim_and_truncate() -> None:
    store = SampleStore(retention=10)
    s = store.append(make_labels("c", {}), 1000, 5.0)
    for t, v in ((2000, 1.0), (3000, STALE_NAN), (4000, math.nan), (5000, 0.0), (6000, 9.0)):
        s.append(t, v)
    s.append(7000, 8.0)
    assert (s.resets, s.stales, s.nans) == ([2000, 7000], [3000], [4000])
    s.trim(3000)
    assert (s.resets, s.stales, s.nans) == ([7000], [3000], [4000])
    # The wall clock went back: the samples after 5 s go, and the next one compares with the 0 at 5 s.
    assert store.drop_after(5000) == 2
    assert (s.resets, s.stales, s.nans) == ([], [3000], [4000])
    s.append(6000, -1.0)
    assert s.resets == [6000]
    store.drop_after(4000)
    assert (s.resets, s.stales, s.nans) == ([], [3000], [4000])
    s.append(5000, -3.0)  # after a NaN: no reset
    assert s.resets == []


def test_version_changes_when_series_come_and_go() -> None:
    store = SampleStore(retention=10)
    assert store.version("x") == 0
    a = store.append(make_labels("x", {"i": "a"}), 0, 1.0)
    v1 = store.version("x")
    assert v1 > 0 and store.version() == v1 and store.version("y") == 0
    a.append(1000, 2.0)
    store.append(make_labels("x", {"i": "a"}), 2000, 3.0)
    assert store.version("x") == v1  # new samples are no new series
    store.append(make_labels("y", {}), 15_000, 1.0)
    assert store.version("x") == v1 and store.version("y") > v1
    a.mark_stale(3000)
    assert store.version("x") == v1  # a stale series is still stored until gc drops it
    assert store.gc(now=20.0) == 1
    v2 = store.version("x")
    assert v2 > v1 and store.version() == v2
    store.register(a)  # a scraper's handle brings the dropped series back
    assert store.version("x") > v2


def _every_5s_until_100s(store: SampleStore, *names: str) -> None:
    """One unlabelled series per name, with a sample every 5 s from 0 to 100 s."""
    for name in names:
        series = store.get(make_labels(name, {}))
        for t in range(0, 101, 5):
            series.append(t * 1000, 1.0)
        store.register(series)


def test_gc_keeps_each_name_for_its_own_retention() -> None:
    store = SampleStore(retention=100.0)
    store.retention_by_name = {"short": 10.0, "beyond": 1000.0}  # capped at the store's retention
    _every_5s_until_100s(store, "short", "long", "beyond")
    store.gc(now=100.0)
    (short,) = store.select("short")
    (long,) = store.select("long")
    (beyond,) = store.select("beyond")
    assert list(short.ts) == [90_000, 95_000, 100_000]
    assert list(long.ts) == list(beyond.ts) == [t * 1000 for t in range(0, 101, 5)]
    store.gc(now=150.0)
    assert list(store.select("short")) == [] and len(next(iter(store.select("long"))).ts) == 11


def test_gc_keeps_names_without_their_own_retention_for_the_other_retention() -> None:
    store = SampleStore(retention=100.0)
    store.retention_by_name = {"read": 100.0}
    store.other_retention = 20.0
    _every_5s_until_100s(store, "read", "unread")
    store.gc(now=100.0)
    (read,) = store.select("read")
    (unread,) = store.select("unread")
    assert len(read.ts) == 21
    assert list(unread.ts) == [80_000, 85_000, 90_000, 95_000, 100_000]
