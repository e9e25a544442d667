"""Repeat offences of sessions: doubling up to a cap, one offence while a breaker is open, a clean period."""

from __future__ import annotations

from vllm_watchdog.gateway.dataplane.offences import Escalation, Offences

ESC = Escalation(base=60.0, cap=300.0, reset_after=600.0)


def test_each_repeat_doubles_up_to_the_cap() -> None:
    o, now, got = Offences(), 0.0, []
    for _ in range(5):
        got.append(o.offend("s", ESC, now))
        now += got[-1][1] + 1.0  # the next offence right after the breaker ended
    assert got == [(1, 60.0), (2, 120.0), (3, 240.0), (4, 300.0), (5, 300.0)]


def test_a_clean_period_after_the_breaker_ended_forgives() -> None:
    o = Offences()
    assert o.offend("s", ESC, 0.0) == (1, 60.0)
    assert o.records(659.0) == {"s": (1, 1.0)}  # clean at 60 + 600
    assert o.offend("s", ESC, 659.0) == (2, 120.0)
    assert o.records(659.0 + 720.0) == {}
    assert o.offend("s", ESC, 659.0 + 720.0) == (1, 60.0)


def test_a_second_alert_while_the_breaker_is_open_is_the_same_offence() -> None:
    o = Offences()
    o.offend("s", ESC, 0.0)
    assert o.offend("s", ESC, 10.0, ongoing=True) == (1, 60.0)
    assert o.offend("s", Escalation(30.0, 30.0, 0.0), 20.0) == (2, 30.0)  # no doubling without a cap
    assert o.records(20.0)["s"] == (2, 650.0)  # a shorter reset never shortens the record


def test_restore_takes_saved_records_and_ignores_garbage() -> None:
    o = Offences()
    o.restore(
        {"a": [2, 30.0], "b": [0, 5], "c": [1, -1], "d": "x", "e": [True, 5], "f": [1, float("inf")]}, 100.0
    )
    assert o.records(100.0) == {"a": (2, 30.0)}
    assert o.offend("a", ESC, 110.0) == (3, 240.0)


def test_the_record_is_bounded() -> None:
    o = Offences(max_sessions=2)
    for i, s in enumerate("abc"):
        o.offend(s, ESC, float(i))
    assert set(o.records(3.0)) == {"b", "c"}
