"""Chaos: the wall clock jumps by hours, forward and back, while the monotonic clock runs on normally.

Every component that waits takes its clocks as arguments, so each test injects a wall clock that jumps and a
monotonic clock that does not, and checks that the wait lasts what it should in monotonic time: the action
rails (backoff, cooldown, budget), the notifier backoff, scrape durations, the gateway's throttle (AIMD
recovery, stale holds) and session breakers, and the rule engine's `for:` and re-send timing together with the
watchdog's own alerts. Real processes are not needed: no test here starts one or touches the system clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.apitargets import targets
from tests.support.clock import T0, Clock
from tests.support.configs import target, watchdog_yaml
from tests.support.faultserver import FaultServer
from tests.support.gateway_upstream import Upstream
from tests.support.vllm_server import free_port
from vllm_watchdog.actions.config import ActionConfig, Budget
from vllm_watchdog.actions.pipeline.rails import Rails
from vllm_watchdog.actions.pipeline.selfalerts import RESEND, WatchdogAlerts
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.config.targets import TargetConfig
from vllm_watchdog.gateway.config import GatewayConfig, ThrottleSpec
from vllm_watchdog.gateway.control.handle import HOLD_TTL, GatewayControl, GatewayControlOptions
from vllm_watchdog.gateway.dataplane.locallink import LocalLink
from vllm_watchdog.gateway.dataplane.server import GatewayServer
from vllm_watchdog.notifiers.alert import OutgoingAlert
from vllm_watchdog.notifiers.config import NotifierConfig
from vllm_watchdog.notifiers.hub import HubOptions, NotificationHub
from vllm_watchdog.promql.values import Sample, Vector
from vllm_watchdog.ruler.alerting import AlertingRule, AlertState
from vllm_watchdog.ruler.files import Rule
from vllm_watchdog.service.daemon import Daemon, DaemonOptions
from vllm_watchdog.sources.scrape import ScrapeTarget
from vllm_watchdog.store import SampleStore

HOURS = 2 * 3600.0  # the size of every jump
JUMPS = [-HOURS, HOURS]


@pytest.fixture
def clock() -> Clock:
    """The wall clock (calling it) and `clock.monotonic`, which advance together until `jump()` moves the wall
    clock alone. They start apart, so that code reading one where it should read the other is caught."""
    return Clock(T0, monotonic=1_000.0)


@pytest.fixture
def store() -> Iterator[ActionStore]:
    s = ActionStore(None)
    yield s
    s.close()


# --- action rails: backoff, cooldown, budget -------------------------------------------------------

QUIET: dict[str, Any] = {
    "cooldown": 0.0,
    "startup_grace": 0.0,
    "backoff_initial": 0.0,
    "crash_loop_max": 1000,
}
TARGET = "vllm-0"


def _run(store: ActionStore, act: ActionConfig, clock: Clock, seconds: float, outcome: str) -> None:
    """One run of `act` that takes `seconds`, stamped with the wall clock as the remediator stamps it."""
    aid = store.begin(act.name, act.type, TARGET, "alert", {}, False, clock())
    clock.advance(seconds)
    store.finish(aid, outcome, clock())


def _verdict(rails: Rails, act: ActionConfig, clock: Clock) -> tuple[str, float | None]:
    v = rails.check(act, TARGET, {}, clock(), server_started_at=None)
    return ("" if v.allowed else v.rail), v.retry_at


@pytest.mark.parametrize("jump", JUMPS)
def test_backoff_waits_its_time_in_monotonic_seconds(store: ActionStore, clock: Clock, jump: float) -> None:
    act = ActionConfig(
        name="restart", type="restart", **(QUIET | {"backoff_initial": 60.0, "backoff_max": 600.0})
    )
    rails = Rails(store, monotonic=clock.monotonic)
    _run(store, act, clock, 5, "failed")
    rails.observe(clock())  # the remediator's tick, a second at most after the row was written
    clock.advance(20)
    clock.jump(jump)
    rail, retry_at = _verdict(rails, act, clock)
    assert rail == "backoff" and retry_at == pytest.approx(clock() + 40)
    clock.advance(39)
    assert _verdict(rails, act, clock)[0] == "backoff"
    clock.advance(1.5)
    assert _verdict(rails, act, clock) == ("", None)
    # Without the monotonic clock (as replays and the rail tests use them) the same rows follow the wall clock:
    assert _verdict(Rails(store), act, clock)[0] == ("backoff" if jump < 0 else "")


@pytest.mark.parametrize("jump", JUMPS)
def test_cooldown_waits_its_time_in_monotonic_seconds(store: ActionStore, clock: Clock, jump: float) -> None:
    act = ActionConfig(name="restart", type="restart", **(QUIET | {"cooldown": 900.0}))
    rails = Rails(store, monotonic=clock.monotonic)
    _run(store, act, clock, 30, "succeeded")
    rails.observe(clock())
    clock.jump(jump)
    clock.advance(600)
    rail, retry_at = _verdict(rails, act, clock)
    assert rail == "cooldown" and retry_at == pytest.approx(clock() + 270)
    clock.advance(271)
    assert _verdict(rails, act, clock) == ("", None)


@pytest.mark.parametrize("jump", JUMPS)
def test_budget_window_slides_in_monotonic_seconds(store: ActionStore, clock: Clock, jump: float) -> None:
    act = ActionConfig(name="restart", type="restart", **(QUIET | {"max_per_window": Budget(2, 3600.0)}))
    rails = Rails(store, monotonic=clock.monotonic)
    _run(store, act, clock, 10, "succeeded")
    rails.observe(clock())
    clock.advance(600)
    _run(store, act, clock, 10, "succeeded")
    rails.observe(clock())
    clock.jump(jump)
    clock.advance(60)
    assert rails.budget_left(act, TARGET, clock()) == 0
    rail, retry_at = _verdict(rails, act, clock)
    assert rail == "budget" and retry_at == pytest.approx(clock() + 3600 - 680)  # the first run leaves
    clock.advance(3600 - 680 + 1)
    assert _verdict(rails, act, clock) == ("", None)
    assert rails.budget_left(act, TARGET, clock()) == 1


def test_rows_first_seen_after_a_jump_wait_at_most_their_whole_duration(
    store: ActionStore, clock: Clock
) -> None:
    """A row the rails never saw before the clock went back (written by an earlier process, say) is taken to
    be brand new: the wait is bounded by its duration instead of lasting until the clock catches up."""
    act = ActionConfig(name="restart", type="restart", **(QUIET | {"cooldown": 900.0}))
    _run(store, act, clock, 30, "succeeded")
    clock.jump(-HOURS)
    rails = Rails(store, monotonic=clock.monotonic)
    assert _verdict(rails, act, clock)[0] == "cooldown"
    clock.advance(901)
    assert _verdict(rails, act, clock) == ("", None)


# --- notifier backoff --------------------------------------------------------------------------------


def _hook(url: str) -> NotifierConfig:
    return NotifierConfig(
        name="hook", type="webhook", url=url, timeout=5.0, backoff_initial=4.0, backoff_max=30.0
    )


@pytest.mark.anyio
@pytest.mark.parametrize("jump", JUMPS)
async def test_notifier_backoff_survives_the_clock_going_back(fault: FaultServer, jump: float) -> None:
    """The hub waits in the wall-clock `now` the daemon hands it: a clock set back 2 h must not stall
    delivery for 2 h (at most one more backoff), and a clock set forward only retries early."""
    fault.set("/hook", b"")
    waiting = OutgoingAlert({"alertname": "Waiting"}, {}, "firing", T0, T0 + 240, 1.0)
    async with httpx.AsyncClient(trust_env=False) as client:
        hub = NotificationHub(
            (_hook(f"http://127.0.0.1:{free_port()}/hook"),), HubOptions(client, clock=lambda: T0)
        )
        hub.alerts([waiting], T0)
        await hub.deliver(T0)
        assert hub.stats()["hook"].retries == 1  # next attempt at T0 + 4
        now = T0 + 1 + jump  # one second later, the clock jumped
        waited = 0.0
        while hub.stats()["hook"].retries == 1 and waited < 60:
            await hub.deliver(now + waited)
            waited += 0.5
        # set back: tried again one backoff (4 s) after the jump, not 2 h later; set forward: at once
        assert hub.stats()["hook"].retries == 2 and waited <= (4.5 if jump < 0 else 0.5), waited
        hub.update((_hook(f"{fault.url}/hook"),))
        await hub.deliver(now + waited)
        assert hub.stats()["hook"].sent == 1
        await hub.aclose()
    assert [path for method, path, _ in fault.requests] == ["/hook"]


# --- scrapes --------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_scrape_duration_is_monotonic(fault: FaultServer, clock: Clock) -> None:
    fault.set("/metrics", "a 1\n")
    store = SampleStore(600)
    t = ScrapeTarget(
        url=fault.url + "/metrics",
        job="j",
        instance="i",
        store=store,
        timeout=5.0,
        sample_limit=100,
        body_size_limit=1 << 20,
        monotonic=clock.monotonic,
    )
    clock.jump(-HOURS)  # a jump during the scrape moves neither its duration nor its deadline
    status = await t.scrape(clock())
    await t.aclose()
    assert status.up and status.last_duration == 0.0 and status.last_scrape == T0 - HOURS


# --- the gateway: AIMD recovery, stale holds, breakers -----------------------------------------------


@pytest.fixture
async def gateway(clock: Clock, store: ActionStore) -> Any:
    upstream = Upstream()
    config = GatewayConfig(target="vllm-0", upstream=upstream.url, listen_port=free_port(), max_in_flight=8)
    server = GatewayServer(config, monotonic=clock.monotonic)
    link = LocalLink(server, monotonic=clock.monotonic)
    control = GatewayControl(
        config, GatewayControlOptions(link, store, clock=clock, monotonic=clock.monotonic)
    )
    await control.start()
    yield control
    await control.aclose(grace=1.0)
    upstream.close()


def _limit(control: GatewayControl) -> int:
    return int(control.link.server.call_sync(lambda: control.link.server.gate.limit, timeout=10))  # type: ignore[attr-defined]


@pytest.mark.anyio
@pytest.mark.parametrize("jump", JUMPS)
async def test_throttle_recovery_and_hold_ttl_follow_the_monotonic_clock(
    gateway: GatewayControl, clock: Clock, jump: float
) -> None:
    spec = ThrottleSpec(factor=0.5, floor=1, step=2, step_interval=10.0)
    assert await gateway.throttle("squeeze/a", spec) == (8, 4)
    clock.jump(jump)
    clock.advance(HOLD_TTL - 5)
    await gateway.tick()
    assert _limit(gateway) == 4  # still held: its alert was seen less than HOLD_TTL ago (monotonic)
    clock.advance(10)
    await gateway.tick()  # the hold went stale and is released
    for _ in range(50):
        await asyncio.sleep(0.02)  # the release runs on the gateway's loop
        if not gateway.link.server.call_sync(lambda: gateway.link.server.throttle.held, timeout=10):  # type: ignore[attr-defined]
            break
    seen = []
    for _ in range(3):
        clock.advance(10.0)
        await gateway.tick()
        seen.append(_limit(gateway))
    assert seen == [6, 8, 8]  # one step per step_interval of monotonic time


@pytest.mark.anyio
@pytest.mark.parametrize("jump", JUMPS)
async def test_breaker_lasts_its_duration_and_is_persisted_in_wall_time(
    gateway: GatewayControl, clock: Clock, store: ActionStore, jump: float
) -> None:
    await gateway.open_breaker("agent-7", 60.0, "looping")
    opened_at = clock()
    clock.jump(jump)
    clock.advance(59)
    status = await gateway.status_json()
    assert status["breakers"]["agent-7"]["seconds_left"] == pytest.approx(1.0)
    await gateway.persist()  # saved as a wall-clock end: now + what is left
    saved = store.get("gateway/vllm-0")["breakers"]["agent-7"]
    assert saved[0] == pytest.approx(clock() + 1.0) and saved[0] != pytest.approx(opened_at + 60)
    clock.advance(2)
    assert (await gateway.status_json())["breakers"] == {}


# --- the rule engine: `for:`, keep_firing_for and re-sends; the watchdog's own alerts --------------------


def _rule(for_: float = 0.0) -> AlertingRule:
    return AlertingRule(Rule(name="Hung", kind="alert", expr="hung > 0", file="r.yml", line=1, for_=for_))


def _always(expr: str, at: float) -> Vector:
    return Vector([Sample((("__name__", "hung"), ("instance", "vllm-0")), 1.0, 0)])


def test_for_counts_from_the_jump_when_the_clock_goes_back() -> None:
    """A pending alert whose clock went back 2 h fires `for` later, not 2 h later (the pending time counted
    before the jump is lost: the rule engine keeps Prometheus' wall-clock timestamps)."""
    rule = _rule(for_=60.0)
    ts = int(T0 * 1000)
    rule.eval(ts, _always)
    (alert,) = rule.active.values()
    assert alert.state == AlertState.PENDING
    back = ts - int(HOURS * 1000)
    for second in range(0, 61, 15):
        rule.eval(back + second * 1000, _always)
    assert alert.state == AlertState.FIRING


def test_firing_alerts_are_resent_after_the_clock_goes_back() -> None:
    """Re-sends keep a notifier's copy alive (it expires at valid_until, 4 re-send delays ahead): after the
    clock goes back they must go on, not pause until the clock catches up."""
    rule = _rule()
    ts = int(T0 * 1000)
    rule.eval(ts, _always)
    assert [a.state for a in rule.send(ts, 60_000, 1_000)] == ["firing"]
    back = ts - int(HOURS * 1000)
    sent = []
    for second in range(1, 62):
        rule.eval(back + second * 1000, _always)
        sent += rule.send(back + second * 1000, 60_000, 1_000)
    assert [a.state for a in sent] == ["firing"]


def test_own_budget_alert_is_resent_after_the_clock_goes_back(store: ActionStore, clock: Clock) -> None:
    act = ActionConfig(name="restart", type="restart", **(QUIET | {"max_per_window": Budget(1, 3600.0)}))
    rails = Rails(store, monotonic=clock.monotonic)
    own = WatchdogAlerts(rails)
    _run(store, act, clock, 10, "succeeded")
    rails.observe(clock())
    verdict = rails.check(act, TARGET, {}, clock(), server_started_at=None)
    assert verdict.rail == "budget"
    where = TargetConfig(name=TARGET, url="http://127.0.0.1:8000")
    assert [a.state for a in own.after_skip(act, where, verdict, clock())] == ["firing"]
    clock.jump(-HOURS)
    resent = []
    for second in range(1, int(RESEND) + 1):
        clock.advance(1)
        resent += [(second, a.state) for a in own.tick({"restart": act}, clock())]
    assert resent[:1] == [(1, "firing")]  # at once, then every RESEND seconds: not after 2 h


# --- the daemon: scheduling, stored samples and evaluation after the clock goes back ------------------


class JumpingWall:
    """The real wall clock plus an offset a test sets (the daemon's `clock`; its monotonic clock is real)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


async def _get(url: str, pred: Any, limit: float = 30.0) -> Any:
    deadline = time.monotonic() + limit
    last: Any = None
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            try:
                last = (await client.get(url)).json()
                if pred(last):
                    return last
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(f"not within {limit}s: {last}")


@pytest.mark.anyio
async def test_daemon_goes_on_storing_and_evaluating_after_the_clock_goes_back(
    tmp_path: Path, fault: FaultServer
) -> None:
    """Samples carry wall-clock timestamps: after the clock is set back 2 h, new samples would all be out of
    order and every rule group would wait for the clock to pass its last evaluation. The daemon notices the
    jump (its monotonic clock disagrees), drops the samples now in the future and reschedules its jobs, so a
    condition that starts after the jump fires within seconds."""
    fault.vllm_like('vllm:num_requests_waiting{model_name="m"} 3\n')
    port = free_port()
    rules = tmp_path / "r.yml"
    rules.write_text(
        "groups:\n  - name: q\n    rules:\n      - alert: Queue\n        expr: vllm:num_requests_waiting > 5\n"
    )
    cfg = tmp_path / "watchdog.yml"
    cfg.write_text(
        watchdog_yaml(
            target(fault.url, health_probe=False), port=port, token=None, rest=f"rule_files: [{rules}]\n"
        )
    )
    wall = JumpingWall()
    daemon = Daemon.load(DaemonOptions(str(cfg), env={}, clock=wall))
    ready = asyncio.Event()
    task = asyncio.create_task(daemon.run(ready))
    await asyncio.wait([task, asyncio.create_task(ready.wait())], timeout=20, return_when="FIRST_COMPLETED")
    if task.done():
        task.result()
    base = f"http://127.0.0.1:{port}"
    try:
        await _get(base + "/api/v1/targets", lambda j: targets(j)[0]["up"] and targets(j)[0]["samples"] == 1)
        await asyncio.sleep(2)  # a few samples and evaluations before the jump
        wall.offset = -HOURS
        fault.vllm_like('vllm:num_requests_waiting{model_name="m"} 10\n')
        alerts = await _get(base + "/api/v1/alerts", lambda j: len(j["data"]["alerts"]) == 1)
        assert alerts["data"]["alerts"][0]["labels"]["alertname"] == "Queue"
        series = await _get(
            base + "/api/v1/samples?match=vllm:num_requests_waiting",
            lambda j: j["data"][0]["samples"][-1][1] == "10.0",
        )
        assert series["data"][0]["samples"][-1][0] < time.time() - HOURS + 60  # stored at the new time
        async with httpx.AsyncClient() as client:
            metrics = (await client.get(base + "/metrics")).text
        assert 'vllm_watchdog_clock_jumps_total{direction="backward"} 1.0' in metrics
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 10)
