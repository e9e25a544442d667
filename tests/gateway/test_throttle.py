"""The throttle driving a real gate with injected time: AIMD, bounds, absolute limits, adaptive, persistence."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.clock import Clock
from vllm_watchdog.gateway.config import GatewayConfig, ThrottleSpec
from vllm_watchdog.gateway.dataplane.admission import Gate
from vllm_watchdog.gateway.dataplane.throttle import Throttle


class Signal:
    """A latency signal the test sets; records which signal was asked for."""

    def __init__(self, value: float | None = None) -> None:
        self.value = value
        self.asked: list[str] = []

    def __call__(self, name: str) -> float | None:
        self.asked.append(name)
        return self.value


def no_signal(name: str) -> float | None:
    raise AssertionError(f"signal {name} read without an adaptive hold")


def setup(ceiling: int = 64) -> tuple[Gate, Throttle, Clock]:
    clock = Clock()
    gate = Gate(
        GatewayConfig(target="gpu0", upstream="http://127.0.0.1:1", max_in_flight=ceiling), monotonic=clock
    )
    return gate, Throttle(gate, monotonic=clock), clock


def test_spec_validation() -> None:
    ThrottleSpec(factor=0.5)
    ThrottleSpec(limit=4, adaptive="queue_time", target=0.5)
    for bad in (
        {},
        {"factor": 0.5, "limit": 3},
        {"factor": 1.0},
        {"factor": 0.0},
        {"limit": 0},
        {"factor": 0.5, "floor": 0},
        {"factor": 0.5, "step": 0},
        {"factor": 0.5, "step_interval": 0.0},
        {"factor": 0.5, "step_interval": float("nan")},
        {"factor": 0.5, "adaptive": "latency"},
        {"factor": 0.5, "target": 0.0},
    ):
        with pytest.raises(ValueError):
            ThrottleSpec(**bad)


def test_aimd_hold_release_recover() -> None:
    gate, throttle, clock = setup(64)
    spec = ThrottleSpec(factor=0.5, step=4, step_interval=10.0)
    assert throttle.hold("shed", spec) == 32
    assert gate.limit == 32 and throttle.held
    assert throttle.hold("shed", spec) == 16  # the same alert again: decrease again
    clock.advance(100.0)
    assert throttle.tick(no_signal) == 16  # held without adaptive: nothing moves
    throttle.release("shed")
    assert not throttle.held
    limits = []
    for _ in range(12):
        clock.advance(5.0)
        limits.append(throttle.tick(no_signal))
    # One step per 10 s after the release, never more than one per tick, up to the ceiling.
    assert limits == [16, 20, 20, 24, 24, 28, 28, 32, 32, 36, 36, 40]
    for _ in range(20):
        clock.advance(10.0)
        throttle.tick(no_signal)
    assert gate.limit == 64
    assert throttle.state()["recovering"] is None
    clock.advance(10.0)
    assert throttle.tick(no_signal) == 64


def test_recovery_steps_stop_at_the_ceiling() -> None:
    gate, throttle, clock = setup(10)
    throttle.hold("a", ThrottleSpec(factor=0.9, step=5, step_interval=1.0))
    assert gate.limit == 9
    throttle.release("a")
    clock.advance(1.0)
    assert throttle.tick(no_signal) == 10


def test_a_new_hold_during_recovery_stops_it() -> None:
    _, throttle, clock = setup(64)
    throttle.hold("a", ThrottleSpec(factor=0.5, step_interval=1.0))
    throttle.release("a")
    clock.advance(1.0)
    assert throttle.tick(no_signal) == 33
    assert throttle.hold("b", ThrottleSpec(factor=0.5, step_interval=1.0)) == 16
    clock.advance(10.0)
    assert throttle.tick(no_signal) == 16


def test_floor_and_never_up() -> None:
    _, throttle, _ = setup(64)
    spec = ThrottleSpec(factor=0.1, floor=8)
    assert throttle.hold("a", spec) == 8
    assert throttle.hold("a", spec) == 8
    assert throttle.hold("b", ThrottleSpec(limit=2)) == 2
    assert throttle.hold("c", ThrottleSpec(factor=0.5, floor=8)) == 2  # a hold never raises the limit
    assert throttle.hold("d", ThrottleSpec(factor=0.5, floor=100)) == 2
    gate2, throttle2, _ = setup(4)
    assert throttle2.hold("x", ThrottleSpec(factor=0.5, floor=100)) == 4  # floor above the ceiling: ceiling
    assert gate2.limit == 4


def test_absolute_limit() -> None:
    gate, throttle, clock = setup(64)
    assert throttle.hold("abs", ThrottleSpec(limit=10)) == 10
    assert throttle.hold("abs2", ThrottleSpec(limit=20)) == 10
    assert throttle.hold("abs3", ThrottleSpec(limit=500)) == 10
    throttle.release("abs")
    throttle.release("abs2")
    clock.advance(60.0)
    assert throttle.tick(no_signal) == 10  # abs3 still holds
    throttle.release("abs3")
    throttle.release("unknown")
    clock.advance(10.0)
    assert throttle.tick(no_signal) == 11
    assert gate.limit == 11


def test_release_at_the_ceiling_needs_no_recovery() -> None:
    _, throttle, clock = setup(8)
    throttle.hold("a", ThrottleSpec(limit=100))
    throttle.release("a")
    assert throttle.state()["recovering"] is None
    clock.advance(10.0)
    assert throttle.tick(no_signal) == 8


def test_adaptive_follows_the_signal() -> None:
    gate, throttle, clock = setup(64)
    signal = Signal()
    spec = ThrottleSpec(factor=0.5, adaptive="ttft", target=1.0, step=2, step_interval=5.0, floor=4)
    assert throttle.hold("ttft-high", spec) == 32
    signal.value = 4.0
    clock.advance(1.0)
    assert throttle.tick(signal) == 32  # at most one change per step_interval
    assert signal.asked == []
    clock.advance(4.0)
    assert throttle.tick(signal) == 16  # 4x over target: halved (the most one step may cut)
    assert signal.asked == ["ttft"]
    signal.value = 1.25
    clock.advance(5.0)
    assert throttle.tick(signal) == 12  # 16 * 0.8
    signal.value = 1.0
    clock.advance(5.0)
    assert throttle.tick(signal) == 14  # at target: additive increase
    signal.value = None
    clock.advance(5.0)
    assert throttle.tick(signal) == 14  # no data: no change
    signal.value = float("inf")
    clock.advance(5.0)
    assert throttle.tick(signal) == 14
    signal.value = 100.0
    for _ in range(5):
        clock.advance(5.0)
        throttle.tick(signal)
    assert gate.limit == 4  # never below floor
    signal.value = 0.01
    for _ in range(100):
        clock.advance(5.0)
        throttle.tick(signal)
    assert gate.limit == 64  # never above the ceiling
    throttle.release("ttft-high")
    assert throttle.state()["recovering"] is None


def test_adaptive_respects_other_absolute_holds() -> None:
    gate, throttle, clock = setup(64)
    signal = Signal(0.1)
    throttle.hold("cap", ThrottleSpec(limit=10))
    throttle.hold("qt", ThrottleSpec(factor=0.5, adaptive="queue_time", target=1.0, step_interval=1.0))
    assert gate.limit == 5
    for _ in range(20):
        clock.advance(1.0)
        throttle.tick(signal)
    assert gate.limit == 10
    assert set(signal.asked) == {"queue_time"}
    throttle.release("cap")
    clock.advance(1.0)
    assert throttle.tick(signal) == 11


def test_state_restore_round_trip() -> None:
    _, throttle, clock = setup(64)
    throttle.hold("a", ThrottleSpec(factor=0.5, adaptive="ttft", target=0.5))
    throttle.hold("b", ThrottleSpec(limit=20, floor=2, step=3, step_interval=7.5))
    clock.advance(3.0)
    state = json.loads(json.dumps(throttle.state()))
    assert state["limit"] == 20 and state["ceiling"] == 64 and state["seconds_since_change"] == 3.0
    assert state["holds"]["b"]["step_interval"] == 7.5 and state["recovering"] is None

    gate2, throttle2, _ = setup(64)
    throttle2.restore(state)
    assert gate2.limit == 20
    restored = throttle2.state()
    assert restored["holds"] == state["holds"] and restored["limit"] == 20

    # Recovery survives a restart too.
    throttle.release("a")
    throttle.release("b")
    state = json.loads(json.dumps(throttle.state()))
    gate3, throttle3, clock3 = setup(64)
    throttle3.restore(state)
    assert gate3.limit == 20 and throttle3.state()["recovering"] == state["recovering"]
    clock3.advance(7.5)
    assert throttle3.tick(no_signal) == 23


def test_restore_tolerates_garbage_and_never_raises_the_limit() -> None:
    garbage: list[Any] = [
        "junk",
        None,
        [],
        {"holds": [1, 2]},
        {"holds": {"x": {"factor": "a"}}, "limit": 3},
        {"holds": {"x": {"factor": 2.0}}, "limit": 3},
        {"holds": {"x": {"factor": True}}, "limit": 3},
        {"holds": {"x": None}, "limit": 3},
        {"recovering": {"factor": 0.5}, "limit": True},
        {"limit": 1},
    ]
    for doc in garbage:
        gate, throttle, _ = setup(64)
        throttle.restore(doc)
        assert gate.limit == 64 and throttle.tick(no_signal) == 64 and not throttle.held, doc
    gate, throttle, _ = setup(64)
    throttle.restore({"holds": {"ok": {"factor": 0.5}, "bad": {"factor": 7}, "7": {"limit": 0}}, "limit": 30})
    assert throttle.state()["holds"] == {"ok": ThrottleSpec(factor=0.5).to_json()}
    assert gate.limit == 30
    throttle.restore({"holds": {"ok": {"limit": 1}}, "limit": 50})  # limit above the current one: ignored
    assert gate.limit == 30
    # Fields a newer version may add are ignored; absolute holds apply even when the saved limit is lost.
    gate, throttle, _ = setup(64)
    throttle.restore({"holds": {"x": {"limit": 6, "jitter": 0.1}}, "limit": "3"})
    assert gate.limit == 6 and throttle.held


def test_gate_apply_clamps_and_throttle_recovers_to_the_new_ceiling() -> None:
    gate, throttle, clock = setup(64)
    throttle.hold("a", ThrottleSpec(factor=0.5, step=8, step_interval=1.0))
    gate.apply(GatewayConfig(target="gpu0", upstream="http://127.0.0.1:1", max_in_flight=16))
    assert (gate.limit, gate.ceiling) == (16, 16)
    throttle.release("a")
    assert throttle.state()["recovering"] is None
    gate.apply(GatewayConfig(target="gpu0", upstream="http://127.0.0.1:1", max_in_flight=40))
    assert (gate.limit, gate.ceiling) == (16, 40)  # still throttled: recovery brings it up
    throttle.hold("b", ThrottleSpec(factor=0.5, step=8, step_interval=1.0))
    throttle.release("b")
    for _ in range(10):
        clock.advance(1.0)
        throttle.tick(no_signal)
    assert gate.limit == 40
