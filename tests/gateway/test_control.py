"""The daemon's side of the gateway: gateway actions through the remediator and its rails, AIMD after a
resolved alert, drains from the action store, persisted throttle and breakers, and the store feed.

A real GatewayServer (own thread and loop) in front of a real loopback upstream; time is a fake clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx
import pytest

from tests.support.clock import Clock
from tests.support.gateway_upstream import Upstream
from tests.support.vllm_server import free_port
from vllm_watchdog.actions.kinds.gateway import plan_gateway
from vllm_watchdog.actions.pipeline.remediator import Remediator, RemediatorOptions
from vllm_watchdog.actions.runtimes.readiness import ReadyCheck
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.config.model import Config, parse_config
from vllm_watchdog.gateway.control.feed import GatewayFeed
from vllm_watchdog.gateway.control.handle import GatewayControl, GatewayControlOptions, window_quantile
from vllm_watchdog.gateway.dataplane.locallink import LocalLink
from vllm_watchdog.gateway.dataplane.server import GatewayServer
from vllm_watchdog.gateway.protocol.channel import ChannelError
from vllm_watchdog.gateway.protocol.snapshot import HistogramSnapshot
from vllm_watchdog.notifiers.alert import OutgoingAlert
from vllm_watchdog.store import SampleStore, is_stale, labels_dict

pytestmark = pytest.mark.anyio


def _config(upstream: str, actions: str = "", dry_run: bool = False) -> Config:
    return parse_config(
        f"""
targets: [{{name: vllm-0, url: "{upstream}"}}]
gateway: {{listen: 127.0.0.1:{free_port()}, max_in_flight: 4}}
dry_run: {str(dry_run).lower()}
actions:
  squeeze: {{type: throttle, factor: 0.5, floor: 1, step: 1, step_interval: 1s}}
  breaker: {{type: throttle_session, duration: 10m}}
  hold: {{type: drain}}
  release: {{type: undrain}}
{actions}
routes:
  - {{match: {{alertname: Busy}}, actions: [squeeze]}}
  - {{match: {{alertname: Loop}}, actions: [breaker]}}
""",
        "c.yml",
        env={},
    )


class Rig:
    """A gateway, its control, an action store and a remediator, wired as the action plane wires them."""

    def __init__(
        self, config: Config, store: ActionStore | None, clock: Clock, link_type: type[LocalLink] = LocalLink
    ) -> None:
        assert config.gateway is not None
        # A store of its own tells the control of drains, as the action plane's does; a given one (to outlive
        # this rig) only hands its drains over when the control attaches.
        store = store or ActionStore(None, on_drain=self._drain_changed)
        self.config, self.store, self.clock = config, store, clock
        self.server = GatewayServer(config.gateway, monotonic=clock)
        link = link_type(self.server, monotonic=clock)
        self.control = GatewayControl(
            config.gateway, GatewayControlOptions(link, store, clock=clock, monotonic=clock)
        )
        self.client = httpx.AsyncClient()
        self.remediator = Remediator(
            config,
            {},
            RemediatorOptions(
                store, ReadyCheck(self.client), gateway=self.control, clock=clock, monotonic=clock
            ),
        )
        self.remediator.reconciled.set()

    def _drain_changed(self, target: str, drained: bool) -> None:
        self.control.on_drain(target, drained)

    async def settle(self, outcomes: int) -> list[Any]:
        """Wait (bounded) until `outcomes` finished rows are in the audit log; newest first."""
        for _ in range(500):
            rows = [r for r in self.store.history(limit=50) if r.outcome != "running"]
            if len(rows) >= outcomes and not any(self.remediator.queues.values()):
                return rows
            await asyncio.sleep(0.01)
        raise AssertionError(f"fewer than {outcomes} finished actions: {self.store.history(limit=50)}")

    def limit(self) -> int:
        return int(self.server.call_sync(lambda: self.server.gate.limit, timeout=10))

    async def aclose(self) -> None:
        await self.remediator.aclose()
        await self.control.aclose(grace=1.0)
        await self.client.aclose()


@pytest.fixture
async def rig() -> AsyncIterator[Callable[..., Any]]:
    upstream = Upstream()
    rigs: list[Rig] = []

    async def make(
        store: ActionStore | None = None,
        clock: Clock | None = None,
        link_type: type[LocalLink] = LocalLink,
        **kw: Any,
    ) -> Rig:
        r = Rig(_config(upstream.url, **kw), store, clock or Clock(), link_type)
        await r.control.start()
        rigs.append(r)
        return r

    yield make
    for r in rigs:
        await r.aclose()
    upstream.close()


def _alert(name: str, state: str = "firing", **labels: str) -> OutgoingAlert:
    return OutgoingAlert({"alertname": name, "target": "vllm-0", **labels}, {}, state, 999_000.0, 0.0, 1.0)


async def test_throttle_halves_the_cap_and_aimd_restores_it_after_resolution(rig: Callable[..., Any]) -> None:
    r = await rig()
    assert r.limit() == 4
    r.remediator.handle([_alert("Busy")], r.clock())
    (row,) = await r.settle(1)
    assert (row.outcome, row.reason) == ("succeeded", "in-flight cap 4 -> 2")
    assert r.limit() == 2
    for _ in range(3):  # held: no recovery while the alert fires
        r.clock.now += 1.0
        await r.control.tick()
    assert r.limit() == 2
    r.remediator.handle([_alert("Busy", "resolved")], r.clock())
    seen = []
    for _ in range(4):
        await asyncio.sleep(0.05)  # the release runs on the gateway loop
        r.clock.now += 1.0
        await r.control.tick()
        seen.append(r.limit())
    assert seen[-1] == 4 and 3 in seen and seen == sorted(seen), seen
    snap = await r.control.tick()
    assert (snap.gate.limit, snap.gate.ceiling) == (4, 4)


async def test_a_second_alert_keeps_its_own_hold(rig: Callable[..., Any]) -> None:
    r = await rig()
    r.remediator.handle([_alert("Busy", instance="a")], r.clock())
    await r.settle(1)
    r.clock.now += 61  # past the cooldown
    r.remediator.handle([_alert("Busy", instance="b")], r.clock())
    await r.settle(2)
    assert r.limit() == 1
    r.remediator.handle([_alert("Busy", "resolved", instance="a")], r.clock())
    for _ in range(3):
        await asyncio.sleep(0.05)
        r.clock.now += 1.0
        await r.control.tick()
    assert r.limit() == 1  # b still holds it down


async def test_dry_run_throttle_changes_nothing(rig: Callable[..., Any]) -> None:
    r = await rig(dry_run=True)
    r.remediator.handle([_alert("Busy")], r.clock())
    (row,) = await r.settle(1)
    assert row.outcome == "would_do" and "lower the in-flight cap of vllm-0 by x0.5" in (row.reason or "")
    assert r.limit() == 4


async def test_throttle_session_opens_a_breaker_and_refuses_aggregates(rig: Callable[..., Any]) -> None:
    r = await rig()
    r.remediator.handle([_alert("Loop", session="agent-7"), _alert("Loop", session="other")], r.clock())
    rows = await r.settle(2)
    by_outcome = {row.outcome: row for row in rows}
    assert "session 'other' stands for many sessions" in (by_outcome["skipped"].reason or "")
    assert by_outcome["succeeded"].reason == "breaker of session agent-7 open for 10m"
    breakers = r.server.call_sync(r.server.gate.breakers, timeout=10)
    assert breakers["agent-7"][0] == pytest.approx(r.clock() + 600)
    assert "Loop" in breakers["agent-7"][1]
    assert plan_gateway(r.config.actions["breaker"], {}, r.control).skip == "the alert has no `session` label"


async def test_drain_flags_in_the_store_reach_the_gateway(rig: Callable[..., Any]) -> None:
    r = await rig()

    async def draining() -> bool:
        await asyncio.sleep(0.05)
        return bool(r.server.call_sync(lambda: r.server.gate.draining, timeout=10))

    r.store.set_drain("vllm-0", True, r.clock())
    assert await draining()
    assert (await r.control.status_json())["draining"] is True  # live, not the last tick's snapshot
    r.store.set_drain("other-target", False, r.clock())
    assert await draining()  # another target's flag is not ours
    r.store.set_drain("vllm-0", False, r.clock())
    assert not await draining()
    assert (await r.control.status_json())["draining"] is False
    job = r.remediator.run_manual("hold", "vllm-0")
    assert job.done is not None and (await job.done)["outcome"] == "succeeded"
    assert await draining() and "vllm-0" in r.store.drains()


async def _throttle_and_break_then_stop(rig: Callable[..., Any], tmp_path: Any, clock: Clock) -> None:
    """A watchdog throttles vllm-0 and opens a breaker on session agent-7, saved in tmp_path; then it stops."""
    store = ActionStore(str(tmp_path / "actions.sqlite"))
    first = await rig(store=store, clock=clock)
    first.remediator.handle([_alert("Busy"), _alert("Loop", session="agent-7")], clock())
    await first.settle(2)
    await first.aclose()
    store.close()


async def test_throttle_and_breakers_survive_a_watchdog_restart(
    rig: Callable[..., Any], tmp_path: Any
) -> None:
    clock = Clock()
    await _throttle_and_break_then_stop(rig, tmp_path, clock)

    clock.now += 30
    again = ActionStore(str(tmp_path / "actions.sqlite"))
    second = await rig(store=again, clock=clock)
    assert second.limit() == 2
    breakers = second.server.call_sync(second.server.gate.breakers, timeout=10)
    assert breakers["agent-7"][0] == pytest.approx(clock() + 570)
    second.remediator.handle([_alert("Busy", "resolved")], clock())  # the restored hold is released by name
    for _ in range(3):
        await asyncio.sleep(0.05)
        clock.now += 1.0
        await second.control.tick()
    assert second.limit() == 4


class LostAtRestore(LocalLink):
    """A gateway that answers hello, then is gone before the saved state reaches it (killed), until its own
    supervisor starts it again: found by hello then, as GatewayProcess.revive finds a gateway it does not
    supervise."""

    lost = False
    down = False

    async def request(self, op: str, args: Mapping[str, Any] | None = None) -> Any:
        if self.down or (op == "restore" and not self.lost):
            self.lost = self.down = True
            raise ChannelError(
                f"gateway control {op}: ConnectionResetError: [Errno 104] Connection reset by peer"
            )
        return await super().request(op, args)

    async def revive(self) -> dict[str, Any] | None:
        self.down = False
        return dict(await super().request("hello"))


async def test_a_gateway_lost_while_being_attached_gets_the_saved_state_when_it_answers_again(
    rig: Callable[..., Any], tmp_path: Any
) -> None:
    clock = Clock()
    await _throttle_and_break_then_stop(rig, tmp_path, clock)

    second = await rig(
        store=ActionStore(str(tmp_path / "actions.sqlite")), clock=clock, link_type=LostAtRestore
    )
    assert not second.control.reachable  # start() went on: the daemon monitors without its gateway
    assert second.limit() == 4  # nothing restored yet
    assert await second.control.tick() is not None  # the next command finds it again, and restores first
    assert second.control.reachable
    assert second.limit() == 2
    assert "agent-7" in second.server.call_sync(second.server.gate.breakers, timeout=10)


def test_window_quantile_interpolates_within_the_bucket() -> None:
    old = HistogramSnapshot((0.1, 1.0, 10.0), (0, 0, 0, 0), 0.0, 0)
    new = HistogramSnapshot((0.1, 1.0, 10.0), (0, 5, 10, 10), 30.0, 10)
    assert window_quantile(0.5, old, new) == pytest.approx(1.0)
    assert window_quantile(0.9, old, new) == pytest.approx(1.0 + 9.0 * (9 - 5) / 5)
    assert window_quantile(0.9, new, new) is None  # no observations in the window
    inf = HistogramSnapshot((0.1, 1.0, 10.0), (0, 0, 0, 10), 300.0, 10)
    assert window_quantile(0.5, old, inf) == 10.0  # beyond the last bound: the highest finite bound


def test_feed_writes_gateway_series_and_marks_them_stale_when_gone() -> None:
    from vllm_watchdog.gateway.protocol.snapshot import GateSnapshot, GatewaySnapshot, ProxySnapshot

    empty = HistogramSnapshot((1.0,), (0, 0), 0.0, 0)
    gate = GateSnapshot(3, 4, 1, {"interactive": 2}, 5.0, False, {}, {}, empty, (), {})
    snap = GatewaySnapshot("vllm-0", gate, ProxySnapshot({}, {}, empty))
    store = SampleStore(retention=600)
    feed = GatewayFeed(store)
    feed.commit(snap, 1000)
    (limit,) = list(store.select("vllm_watchdog_gateway_limit"))
    assert labels_dict(limit.labels) == {"__name__": "vllm_watchdog_gateway_limit", "target": "vllm-0"}
    assert limit.at(1000, 300_000) == (1000, 3.0)
    (queued,) = list(store.select("vllm_watchdog_gateway_queue_length"))
    assert labels_dict(queued.labels)["priority"] == "interactive"
    feed.commit(None, 2000)
    assert limit.at(2000, 300_000) is None and is_stale(limit.vals[-1])


# --- holds end: once per firing episode, repeat offences escalate, a clean period resets them -------------


def _episode(name: str, starts: float, state: str = "firing", **labels: str) -> OutgoingAlert:
    """An alert of the episode that began at `starts` (what a resend repeats: the same labels and start)."""
    return OutgoingAlert({"alertname": name, "target": "vllm-0", **labels}, {}, state, starts, 0.0, 1.0)


async def _carry(r: Rig) -> None:
    """One request through the gateway, and the tick that sees it."""
    async with httpx.AsyncClient(base_url=f"http://{r.control.listen}") as client:
        assert (await client.post("/v1/completions", json={"prompt": "x"})).status_code == 200
    await r.control.tick()


def _breaker_left(r: Rig, session: str) -> float | None:
    until = r.server.call_sync(r.server.gate.breakers, timeout=10).get(session)
    return None if until is None else float(until[0]) - r.clock()


async def test_a_resend_of_the_firing_alert_neither_reopens_nor_extends_the_breaker(
    rig: Callable[..., Any],
) -> None:
    r = await rig()
    loop = _episode("Loop", r.clock(), session="agent-7")
    r.remediator.handle([loop], r.clock())
    await r.settle(1)
    for _ in range(3):  # resent every minute while it fires
        r.clock.now += 60
        assert r.remediator.handle([loop], r.clock()) == 0
    assert _breaker_left(r, "agent-7") == pytest.approx(600 - 180)
    r.clock.now += 421
    r.remediator.handle([loop], r.clock())  # the breaker's time is up: a resend does not open another
    assert _breaker_left(r, "agent-7") is None
    assert len(r.store.history(limit=50)) == 1


async def test_repeat_offences_double_the_breaker_up_to_its_cap_until_a_clean_period(
    rig: Callable[..., Any], tmp_path: Any
) -> None:
    """`breaker`: 10m, and the defaults max_duration 1h, reset_after 1h. The record survives a restart of the
    watchdog with a fresh gateway (saved in the action store with the breakers)."""
    clock = Clock()
    store = ActionStore(str(tmp_path / "actions.sqlite"))
    r = await rig(store=store, clock=clock)
    lengths = []
    for n in range(6):
        if n == 3:  # a watchdog restart, and a new gateway process that knows nothing
            await r.aclose()
            r = await rig(store=store, clock=clock)
        alert = _episode("Loop", clock(), session="agent-7")
        r.remediator.handle([alert], clock())
        await r.settle(n + 1)
        lengths.append(round(_breaker_left(r, "agent-7") or 0))
        r.remediator.handle([_episode("Loop", alert.starts_at, "resolved", session="agent-7")], clock())
        clock.now += lengths[-1] + 50 * 60  # the breaker ended 50 minutes ago: not clean yet
    assert lengths == [600, 1200, 2400, 3600, 3600, 3600]
    reasons = [row.reason for row in r.store.history(limit=3)]
    assert reasons[0] == "breaker of session agent-7 open for 1h (repeat offence 6)"
    clock.now += 10 * 60 + 1  # an hour clean after the last breaker ended: forgiven
    r.remediator.handle([_episode("Loop", clock(), session="agent-7")], clock())
    await r.settle(7)
    assert round(_breaker_left(r, "agent-7") or 0) == 600
    assert r.store.history(limit=1)[0].reason == "breaker of session agent-7 open for 10m"


async def test_a_throttle_holds_once_per_episode_and_holds_again_only_if_the_gateway_lost_it(
    rig: Callable[..., Any],
) -> None:
    r = await rig()
    busy = _episode("Busy", r.clock())
    r.remediator.handle([busy], r.clock())
    await r.settle(1)
    assert r.limit() == 2
    for _ in range(20):  # resent each minute, past the cooldown and past HOLD_TTL: not tightened, not dropped
        r.clock.now += 61
        assert r.remediator.handle([busy], r.clock()) == 0
        await r.control.tick()
    assert r.limit() == 2
    r.control._holds_seen.clear()  # as after a lapsed lease: the gateway released it, the daemon forgot it
    assert r.remediator.handle([busy], r.clock()) == 1
    await r.settle(2)
    assert r.limit() == 1
    r.remediator.handle([_episode("Busy", busy.starts_at, "resolved")], r.clock())
    r.clock.now += 61
    await _carry(r)  # traffic goes through the gateway (else a throttle is skipped: it could not help)
    assert r.remediator.handle([_episode("Busy", r.clock())], r.clock()) == 1  # a new episode: a new hold
    assert [row.outcome for row in await r.settle(3)] == ["succeeded"] * 3


async def test_a_dry_run_reports_a_throttle_once_per_episode_with_the_cap_it_would_set(
    rig: Callable[..., Any],
) -> None:
    """As the real run holds once per firing episode, the dry run writes one would_do per episode (not one per
    resend), and says what the cap would become."""
    r = await rig(dry_run=True)
    await r.control.tick()  # the cap as the gateway has it
    busy = _episode("Busy", r.clock())
    r.remediator.handle([busy], r.clock())
    (row,) = await r.settle(1)
    assert row.outcome == "would_do" and row.reason == (
        "dry run: would lower the in-flight cap of vllm-0 by x0.5 (floor 1): max_in_flight 4 -> 2"
    )
    for _ in range(5):  # resent each minute, past the cooldown: nothing more to report
        r.clock.now += 61
        assert r.remediator.handle([busy], r.clock()) == 0
    assert [row.outcome for row in r.store.history(limit=50)] == ["would_do"] and r.limit() == 4
    r.remediator.handle([_episode("Busy", busy.starts_at, "resolved")], r.clock())
    r.clock.now += 61
    await _carry(r)
    assert r.remediator.handle([_episode("Busy", r.clock())], r.clock()) == 1  # a new episode: reported again
    assert [row.outcome for row in await r.settle(2)] == ["would_do"] * 2


async def test_a_throttle_is_skipped_while_nothing_goes_through_the_gateway_and_acts_once_traffic_does(
    rig: Callable[..., Any],
) -> None:
    """Clients that bypass the gateway: a lower cap cannot relieve vLLM, so the audit says why nothing was done;
    once a request goes through the gateway, the next resend throttles."""
    r = await rig()
    for _ in range(3):  # watched for two minutes, nothing admitted
        await r.control.tick()
        r.clock.now += 60
    busy = _episode("Busy", r.clock() - 60)  # pending for a minute, then firing
    r.remediator.handle([busy], r.clock())
    (row,) = await r.settle(1)
    assert (row.outcome, row.reason) == (
        "skipped",
        "the gateway of vllm-0 carried no request since 30s before the alert began: its load bypasses the "
        "gateway, so lowering the cap cannot help",
    )
    assert r.limit() == 4
    await _carry(r)
    r.clock.now += 61
    r.remediator.handle([busy], r.clock())  # the resend
    rows = await r.settle(2)
    assert (rows[0].outcome, rows[0].reason) == ("succeeded", "in-flight cap 4 -> 2") and r.limit() == 2
