"""The remediator asks the fleet's disruption budget before a disruptive action: a refusal is the `fleet` rail
(skipped, counted, a restore due again later), a grant is given back however the flow ends, the rails are
asked again after the wait, and nothing else (a throttle, a dead child's respawn, a dry run) takes a slot."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.clock import Clock
from tests.support.remediation import CONFIG, Hub, Ready, ScriptedRuntime, alert, settle
from vllm_watchdog.actions.pipeline.remediator import Remediator, RemediatorOptions
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.fleet.budget import Grant
from vllm_watchdog.notifiers.alert import OutgoingAlert

pytestmark = pytest.mark.anyio


class Budget:
    """Grants or refuses as told, and records what it was asked and given back."""

    def __init__(self, refusal: str = "", rail: str = "fleet") -> None:
        self.refusal = refusal
        self.rail = rail
        self.asked: list[tuple[str, str]] = []
        self.released: list[Grant] = []
        self.noted: list[tuple[str, str, bool, float]] = []
        self.gate: asyncio.Event | None = None  # set: acquire waits for it

    async def acquire(self, target: str, action: str) -> Grant:
        self.asked.append((target, action))
        if self.gate is not None:
            await self.gate.wait()
        return Grant(target, action, self.refusal, 1.0, rail=self.rail)

    async def release(self, grant: Grant) -> None:
        self.released.append(grant)

    def json(self) -> dict[str, Any]:
        return {"enabled": True}

    def alerts(self, now: float) -> list[OutgoingAlert]:
        return []

    def note_alert(self, alertname: str, target: str, firing: bool, until: float, now: float) -> None:
        self.noted.append((alertname, target, firing, until))

    def retired(self, target: str, now: float) -> None:
        self.noted.append(("", target, False, now))

    async def group(self) -> dict[str, Any]:
        return {"enabled": True}


def make(budget: Budget, text: str = CONFIG) -> tuple[Remediator, ScriptedRuntime, Clock]:
    runtime, clock = ScriptedRuntime(), Clock()
    r = Remediator(
        parse_config(text, "c.yml"),
        {"vllm-0": runtime},
        RemediatorOptions(
            ActionStore(None),
            Ready(runtime),  # type: ignore[arg-type]
            hub=Hub(),  # type: ignore[arg-type]
            clock=clock,
            monotonic=clock,
            budget=budget,
        ),
    )
    r.reconciled.set()
    return r, runtime, clock


async def test_a_refusal_skips_on_the_fleet_rail_and_touches_nothing() -> None:
    budget = Budget("fleet: etcd cannot be relied on: no etcd endpoint answered")
    r, rt, _ = make(budget)
    r.handle([alert("Hung")], 0.0)
    await settle(r)
    assert rt.calls == [] and budget.asked == [("vllm-0", "restart")]
    (row,) = r.store.history()
    assert (row.outcome, row.reason) == ("skipped", budget.refusal)
    assert r.audit.counts[("restart", "vllm-0", "skipped")] == 1


async def test_a_grant_is_given_back_after_the_flow_whether_it_succeeds_or_fails() -> None:
    budget = Budget()
    r, rt, clock = make(budget)
    r.handle([alert("Hung")], 0.0)
    await settle(r)
    rt.fail_stop = True
    clock.advance(3600)
    r.handle([alert("Hung", starts="later")], clock())
    await settle(r)
    assert [row.outcome for row in r.store.history()] == ["failed", "succeeded"]
    assert [g.action for g in budget.released] == ["restart", "restart"]


async def test_the_rails_are_asked_again_after_the_wait() -> None:
    budget = Budget()
    budget.gate = asyncio.Event()
    r, rt, clock = make(budget)
    r.handle([alert("Hung")], 0.0)
    for _ in range(100):
        if budget.asked:
            break
        await asyncio.sleep(0.001)
    r.store.set_paused(True, "maintenance", clock())  # an operator paused actions while it waited
    budget.gate.set()
    await settle(r)
    assert rt.calls == []
    (row,) = r.store.history()
    assert row.outcome == "skipped" and "paused" in row.reason
    assert len(budget.released) == 1


async def test_a_refused_restore_is_due_again_later() -> None:
    budget = Budget()
    r, rt, clock = make(budget)
    r.handle([alert("Hot")], 0.0)  # reconfigure with restore_after: 10m
    await settle(r)
    assert rt.calls == ["replace", "commit"]
    r.handle([alert("Hot", "resolved")], clock())
    budget.refusal = "fleet: etcd cannot be relied on"
    clock.advance(601)
    await r.tick(clock())
    await settle(r)
    assert rt.calls == ["replace", "commit"]  # not restored while refused
    budget.refusal = ""
    clock.advance(120)
    for _ in range(20):
        await r.tick(clock())
        await settle(r)
        if rt.calls[-1] == "commit" and len(rt.calls) == 4:
            break
        clock.advance(60)
    assert rt.calls == ["replace", "commit", "replace", "commit"]  # restored once etcd answered again


async def test_dry_runs_and_non_disruptive_actions_take_no_slot() -> None:
    budget = Budget()
    r, rt, _ = make(budget, CONFIG + "dry_run: true\n")
    r.handle([alert("Hung")], 0.0)
    await settle(r)
    assert budget.asked == [] and rt.calls == []


async def test_a_target_removed_while_its_action_waits_for_a_slot_is_not_acted_on() -> None:
    budget = Budget()
    budget.gate = asyncio.Event()
    r, rt, _ = make(budget)
    r.handle([alert("Hung")], 0.0)
    for _ in range(100):
        if budget.asked:
            break
        await asyncio.sleep(0.001)
    removed = CONFIG.replace(
        'targets: [{name: vllm-0, url: "http://127.0.0.1:1", container: vllm-0}]', "targets: []"
    )
    r.apply(parse_config(removed, "c.yml"), {})  # a reload or discovery drops it meanwhile
    budget.gate.set()
    await settle(r)
    assert rt.calls == [] and len(budget.released) == 1  # the slot is given back, nothing touched
    assert budget.noted[-1][:3] == ("", "vllm-0", False)  # its alerts no longer count for the fleet
    (row,) = r.store.history()
    assert row.outcome == "skipped" and row.reason.startswith("target_removed: target vllm-0 was removed")


async def test_a_correlated_fault_skips_on_the_fleet_hold_rail() -> None:
    budget = Budget(
        "fleet_hold: 3 of 4 live members of group g fire Hung (a, b, c), more than ...", "fleet_hold"
    )
    r, rt, _ = make(budget)
    r.handle([alert("Hung")], 0.0)
    await settle(r)
    assert rt.calls == []
    (row,) = r.store.history()
    assert (row.outcome, row.reason) == ("skipped", budget.refusal)
    job = r.run_manual("restart", "vllm-0")
    assert job.done is not None
    result = await asyncio.wait_for(job.done, 10)
    assert (result["outcome"], result["rail"]) == ("skipped", "fleet_hold")
    assert rt.calls == [] and r.audit.counts[("restart", "vllm-0", "skipped")] == 2


async def test_alerts_routed_to_disruptive_actions_are_told_to_the_fleet_until_they_resolve() -> None:
    budget = Budget()
    text = CONFIG.replace("routes:\n", "routes:\n  - {match: {alertname: Busy}, actions: [slow]}\n").replace(
        "actions:\n  restart:", "actions:\n  slow: {type: throttle}\n  restart:"
    )
    r, _, _ = make(budget, text)
    firing = OutgoingAlert({"alertname": "Hung", "instance": "vllm-0"}, {}, "firing", 0.0, 240.0, 1.0)
    r.handle([firing], 10.0)
    r.handle([alert("Hung", "resolved")], 20.0)
    r.handle([alert("Busy")], 30.0)  # a throttle is no disruption
    r.handle([alert("Hung", instance="elsewhere")], 40.0)  # not about a target of this member
    no_end = OutgoingAlert({"alertname": "SpecBad", "instance": "vllm-0"}, {}, "firing", 0.0, 0.0, 1.0)
    r.handle([no_end], 50.0)  # an Alertmanager's firing alert: no end, counted FIRING_HOLD from now
    assert budget.noted == [
        ("Hung", "vllm-0", True, 240.0),
        ("Hung", "vllm-0", False, 320.0),
        ("SpecBad", "vllm-0", True, 350.0),
    ]
