"""Whether requests go through the gateway (gateway/control/traffic.py), as the throttle asks before acting."""

from __future__ import annotations

from dataclasses import replace

from vllm_watchdog.gateway.control.traffic import Traffic
from vllm_watchdog.gateway.protocol.snapshot import GateSnapshot, HistogramSnapshot

T = 1_700_000_000.0
IDLE = GateSnapshot(
    limit=4,
    ceiling=4,
    in_flight=0,
    queued={},
    oldest_in_flight_age=0.0,
    draining=False,
    admitted_total={"normal": 7},
    rejected_total={},
    queue_time=HistogramSnapshot((), (), 0.0, 0),
    breakers_open=(),
    session_in_flight={},
)


def test_it_cannot_tell_before_it_watched_and_sees_admissions_and_requests_in_flight() -> None:
    t = Traffic()
    assert t.carried_since(T) is None  # no snapshot yet
    t.saw(IDLE, T)  # admitted 7 before it watched: not counted
    assert t.carried_since(T - 1) is None and t.carried_since(T) is False
    t.saw(IDLE, T + 60)
    assert t.carried_since(T) is False
    t.saw(replace(IDLE, in_flight=1), T + 61)  # a long stream, nothing newly admitted
    assert t.carried_since(T + 61) is True and t.carried_since(T + 62) is False
    t.saw(replace(IDLE, admitted_total={"normal": 8}), T + 120)
    assert t.carried_since(T + 100) is True
    t.saw(replace(IDLE, admitted_total={"normal": 0}), T + 180)  # a restarted gateway counts anew
    assert t.carried_since(T + 170) is True
