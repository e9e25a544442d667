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
