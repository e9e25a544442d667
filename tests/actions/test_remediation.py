"""The remediator's orchestration with injected time: routes, rails, dry run, merging, rollback, reconcile.

The runtime here is a scripted double that records calls (tests/support/remediation.py): real runtimes
(Docker, processes) are tested in their own files and end to end in test_remediation_e2e.py. What this file
checks is the decision logic, which must hold over hours of simulated alerts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

import pytest

from tests.support.clock import T0, Clock
from tests.support.fake_nvml import FakeNvml
from tests.support.remediation import ARGS, CONFIG, SPEC, Hub, Ready, ScriptedRuntime, alert, settle
from vllm_watchdog.actions.pipeline.decisions import Job
from vllm_watchdog.actions.pipeline.jobqueues import MAX_QUEUED, QUEUE_RAIL
from vllm_watchdog.actions.pipeline.remediator import Remediator, RemediatorOptions
from vllm_watchdog.actions.pipeline.restores import RESTORE_RECHECK
from vllm_watchdog.actions.pipeline.supervisor import RESPAWN
from vllm_watchdog.actions.runtimes.power import PowerLimiter
from vllm_watchdog.actions.runtimes.runtime import Launch
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.config.model import Config, parse_config
from vllm_watchdog.notifiers.alert import OutgoingAlert

pytestmark = pytest.mark.anyio


def make(
    text: str = CONFIG,
    env: Mapping[str, str] | None = None,
    engine_state: Callable[[str, float], str] = lambda _, __: "",
    ready_since: Callable[[str, float], bool] = lambda _, __: False,
    runtime: ScriptedRuntime | None = None,
) -> tuple[Remediator, ScriptedRuntime, Ready, Hub, Clock]:
    cfg: Config = parse_config(text, "c.yml", env=env or {})
    runtime = runtime or ScriptedRuntime()
    ready, hub, clock = Ready(runtime), Hub(), Clock()

    async def no_sleep(_: float) -> None:
        await asyncio.sleep(0)

    r = Remediator(
        cfg,
        {"vllm-0": runtime},
        RemediatorOptions(
            ActionStore(None),
            ready,  # type: ignore[arg-type]
            hub=hub,  # type: ignore[arg-type]
            clock=clock,
            monotonic=clock,  # the rails age runs in monotonic time: replayed time must move both clocks
            sleep=no_sleep,
            engine_state=engine_state,
            ready_since=ready_since,
        ),
    )
    r.reconciled.set()
    return r, runtime, ready, hub, clock


async def test_a_routed_alert_restarts_gracefully_and_is_audited() -> None:
    r, rt, _, hub, _ = make()
    assert r.handle([alert("Hung")], 0.0) == 1
    await settle(r)
    assert rt.calls == ["stop", "start"]
    (rec,) = r.store.history()
    assert (rec.action, rec.target, rec.outcome) == ("restart", "vllm-0", "succeeded")
    assert r.store.drains() == {}  # undrained afterwards
    assert [e.outcome for e in hub.events] == ["started", "succeeded"]


async def test_unrouted_and_resolved_alerts_do_nothing() -> None:
    r, rt, *_ = make()
    assert r.handle([alert("Other"), alert("Hung", "resolved")], 0.0) == 0
    await settle(r)
    assert rt.calls == [] and r.store.history() == []


async def test_dry_run_evaluates_everything_and_touches_nothing() -> None:
    r, rt, _, hub, _ = make(CONFIG + "dry_run: true\n")
    r.handle([alert("Hung"), alert("SpecBad")], 0.0)
    await settle(r)
    assert rt.calls == []
    outcomes = sorted((rec.action, rec.outcome) for rec in r.store.history())
    assert outcomes == [("draft_off", "would_do"), ("restart", "would_do")]
    reasons = {rec.action: rec.reason for rec in r.store.history()}
    assert "without --speculative-config" in reasons["draft_off"]
    assert r.store.load_spec("vllm-0", "draft") is None  # a dry run saves nothing either
    assert sorted(e.outcome for e in hub.events) == ["would_do", "would_do"] and all(
        e.dry_run for e in hub.events
    )


async def test_concurrent_alerts_merge_and_never_interleave() -> None:
    r, rt, *_ = make()
    r.handle([alert("Hung"), alert("Hung", pod="a"), alert("SpecBad")], 0.0)
    await settle(r)
    assert rt.calls == ["stop", "start", "replace", "commit"]  # one restart, then the relaunch; in order


async def test_cooldown_then_budget_then_alert() -> None:
    r, rt, _, hub, clock = make()
    start = clock.now
    for minute in (0, 5, 16, 32, 48, 64):
        clock.now = start + 60 * minute
        r.handle([alert("Hung")], clock.now)
        await settle(r)
    assert rt.calls.count("stop") == 3  # minutes 0, 16, 32; 5 was cooling down; 48 and 64 are over budget
    rails = [rec.reason for rec in r.store.history() if rec.outcome == "skipped"]
    assert any("cooldown" in x for x in rails) and any("budget" in x for x in rails)
    budget = [a for a in hub.sent if a.labels["alertname"] == "VLLMWatchdogRestartBudgetExhausted"]
    assert budget and budget[0].state == "firing" and budget[0].labels["target"] == "vllm-0"
    # named as every per-target series: `instance` is the server's host:port, not its name
    assert {k: budget[0].labels[k] for k in ("job", "instance", "target")} == {
        "job": "vllm",
        "instance": "127.0.0.1:1",
        "target": "vllm-0",
    }
    assert budget[0].annotations["runbook_url"] == (
        "http://127.0.0.1:9460/docs/runbooks.md#vllmwatchdogrestartbudgetexhausted"
    )
    clock.advance(7 * 3600)  # the window frees the budget: the own alert resolves
    await r.tick(clock.now)
    assert (
        hub.sent[-1].labels["alertname"] == "VLLMWatchdogRestartBudgetExhausted"
        and hub.sent[-1].state == "resolved"
    )


async def test_disable_then_enable_draft_restores_the_exact_spec() -> None:
    r, rt, *_ = make()
    r.handle([alert("SpecBad")], 0.0)
    await settle(r)
    assert "--speculative-config" not in rt.current.args
    assert rt.current.args == (
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
        "--max-num-seqs",
        "4",
    )
    assert rt.current.data == {"image": "vllm:test"}
    r.handle([alert("SpecBad")], 1.0)  # already off: nothing to do
    await settle(r)
    assert rt.calls == ["replace", "commit"]
    job = r.run_manual("draft_on", None)
    await settle(r)
    assert job.done is not None and (await job.done)["outcome"] == "succeeded"
    assert (
        dict(zip(rt.current.args[::2], rt.current.args[1::2], strict=False))["--speculative-config"] == SPEC
    )
    assert r.store.load_spec("vllm-0", "draft") is None


async def test_a_replacement_that_is_not_ready_is_rolled_back_and_alerted() -> None:
    r, rt, ready, hub, _ = make()
    ready.broken.add(("-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--max-num-seqs", "4"))
    r.handle([alert("SpecBad")], 0.0)
    await settle(r)
    assert rt.calls == ["replace", "rollback"] and rt.current.args == ARGS
    (rec,) = r.store.history()
    assert rec.outcome == "rolled_back" and "connection refused" in rec.reason
    assert hub.sent[-1].labels["alertname"] == "VLLMWatchdogActionRolledBack"


async def test_reconfigure_restores_after_the_hold() -> None:
    r, rt, _, _, clock = make()
    r.handle([alert("Hot")], clock.now)
    await settle(r)
    assert (
        "--max-num-seqs" in rt.current.args
        and rt.current.args[rt.current.args.index("--max-num-seqs") + 1] == "1"
    )
    r.handle([alert("Hot", "resolved")], clock.now)
    clock.advance(300)
    await r.tick(clock.now)
    await settle(r)
    assert rt.calls == ["replace", "commit"]  # still within the 10 m hold
    clock.advance(301)
    await r.tick(clock.now)
    await settle(r)
    assert rt.current.args == ARGS and rt.calls == ["replace", "commit", "replace", "commit"]


async def test_a_restore_is_due_from_the_resolution_not_from_each_resend_of_it() -> None:
    r, rt, _, _, clock = make()
    r.handle([alert("Hot")], clock.now)
    await settle(r)
    resolved_at = clock.now
    resolved = replace(alert("Hot", "resolved"), ends_at=resolved_at)
    for _ in range(10):  # Prometheus resends a resolved alert every minute for 15 minutes
        r.handle([resolved], clock.now)
        clock.advance(60)
        await r.tick(clock.now)
        await settle(r)
    assert clock.now >= resolved_at + 600
    assert rt.current.args == ARGS  # restored 10 m after the resolution, though it was resent since
    for _ in range(5):
        r.handle([resolved], clock.now)
        clock.advance(60)
        await r.tick(clock.now)
        await settle(r)
    assert rt.calls == ["replace", "commit", "replace", "commit"]  # and only once
    assert [rec.outcome for rec in r.store.history()] == ["succeeded", "succeeded"]


async def test_relaunch_actions_run_with_info_logging(caplog: pytest.LogCaptureFixture) -> None:
    r, *_ = make()
    with caplog.at_level(logging.INFO, logger="vllm_watchdog"):
        r.handle([alert("SpecBad")], 0.0)
        await settle(r)
    assert [rec.outcome for rec in r.store.history()] == ["succeeded"]
    assert any(rec.getMessage() == "action step" for rec in caplog.records)


async def test_a_crashing_flow_is_recorded_as_failed_and_does_not_block_the_target() -> None:
    r, rt, *_ = make()

    async def broken(launch: Launch, stop_timeout: float) -> None:
        raise RuntimeError("a bug")

    rt.replace = broken  # type: ignore[method-assign]
    r.handle([alert("SpecBad")], 0.0)
    await settle(r)
    (rec,) = r.store.history()
    assert rec.outcome == "failed" and rec.reason == "internal error: a bug"
    r.handle([alert("Hung")], 1.0)
    await settle(r)
    assert r.store.history()[0].outcome == "succeeded" and rt.calls[-2:] == ["stop", "start"]


async def test_a_failed_stop_fails_the_action_and_backs_off() -> None:
    r, rt, *_ = make(CONFIG.replace("cooldown: 15m, ", "cooldown: 0s, "))
    rt.fail_stop = True
    r.handle([alert("Hung")], 0.0)
    await settle(r)
    (rec,) = r.store.history()
    assert rec.outcome == "failed" and "stop failed" in rec.reason and r.store.drains() == {}
    r.handle([alert("Hung")], 1.0)
    await settle(r)
    assert r.store.history()[0].outcome == "skipped" and "backoff" in r.store.history()[0].reason


async def test_refusals() -> None:
    text = CONFIG.replace("container: vllm-0", "unit: vllm.service")
    r, rt, *_ = make(text)
    r.runtimes["vllm-0"].kind = "systemd"  # type: ignore[misc]
    r.handle([alert("SpecBad"), alert("Hung", instance="some-other-server")], 0.0)
    await settle(r)
    reasons = sorted(rec.reason for rec in r.store.history())
    assert any("systemd mode supports restart only" in x for x in reasons)
    assert any("names no configured target" in x for x in reasons)
    assert rt.calls == []


async def test_a_repeated_refusal_is_recorded_once_per_ten_minutes_and_counted_each_time() -> None:
    r, rt, *_ = make()
    for t in (0.0, 60.0, 120.0, 599.0, 600.0):  # a firing alert about an unknown server, resent each minute
        r.handle([alert("Hung", instance="some-other-server")], t)
        await settle(r)
    rows = [rec for rec in r.store.history() if rec.outcome == "refused"]
    assert sorted(rec.started_at for rec in rows) == [0.0, 600.0]
    assert r.audit.counts[("restart", "", "refused")] == 5
    assert rt.calls == []


async def test_reconcile_finishes_an_uncommitted_replacement_and_undrains() -> None:
    r, rt, *_ = make()
    aid = r.store.begin("draft_off", "disable_draft", "vllm-0", "alert", {}, False, 0.0)
    r.store.set_drain("vllm-0", True, 0.0, aid)
    rt.previous = rt.current
    rt.current = rt.current.with_args(ARGS[:4])
    await r.reconcile()
    rec = r.store.history()[0]
    assert rec.outcome == "succeeded" and "after a watchdog restart" in rec.reason
    assert rt.calls == ["commit"] and r.store.drains() == {}


async def test_gpu_power_limit_caps_then_restores_after_the_hold() -> None:
    text = """
targets: [{name: vllm-0, url: "http://127.0.0.1:1", container: vllm-0, gpus: [0, 1]}]
routes: [{match: {alertname: Hot}, actions: [cap]}]
actions:
  cap: {type: gpu_power_limit, ratio: 0.5, restore_after: 5m, startup_grace: 0s}
"""
    r, rt, _, hub, clock = make(text)
    fake = FakeNvml(gpus=2)
    fake.gpus[0].power_limit_mw = 650_000  # an operator-set limit below the default: restored exactly
    r.power = PowerLimiter(fake)
    r.handle([alert("Hot")], clock.now)
    await settle(r)
    assert [g.power_limit_mw for g in fake.gpus] == [350_000, 350_000]  # half the 700 W default
    assert rt.calls == []  # not disruptive: the server is not touched
    r.handle([alert("Hot", "resolved")], clock.now)
    clock.advance(301)
    await r.tick(clock.now)
    await settle(r)
    assert [g.power_limit_mw for g in fake.gpus] == [650_000, 700_000]
    assert [h.outcome for h in r.store.history()] == ["succeeded", "succeeded"]
    assert [e.outcome for e in hub.events] == ["started", "succeeded", "started", "succeeded"]


async def test_gpu_power_limit_without_nvml_or_gpus_is_refused() -> None:
    text = """
targets: [{name: vllm-0, url: "http://127.0.0.1:1", container: vllm-0}]
routes: [{match: {alertname: Hot}, actions: [cap]}]
actions: {cap: {type: gpu_power_limit, watts: 300, startup_grace: 0s}}
"""
    r, *_ = make(text)
    r.handle([alert("Hot")], 0.0)
    await settle(r)
    r.power = PowerLimiter(FakeNvml(gpus=1))
    r.handle([alert("Hot")], 1.0)
    await settle(r)
    reasons = [h.reason for h in r.store.history()]
    assert [h.outcome for h in r.store.history()] == ["refused", "refused"]
    assert "lists no gpus" in reasons[0] and "needs NVML" in reasons[1]


async def test_a_crash_loop_stops_the_action_and_alerts() -> None:
    text = CONFIG.replace(
        "restart: {type: restart, cooldown: 15m, startup_grace: 0s, max_per_window: {count: 3, window: 6h}}",
        "restart: {type: restart, cooldown: 0s, startup_grace: 0s, crash_loop_window: 10m, crash_loop_max: 2}",
    )
    r, rt, _, hub, clock = make(text)
    for _ in range(4):  # a new need each time, right after each successful restart
        clock.advance(60)
        r.handle(
            [OutgoingAlert({"alertname": "Hung", "instance": "vllm-0"}, {}, "firing", clock.now, 0.0, 1.0)],
            clock.now,
        )
        await settle(r)
    assert rt.calls == ["stop", "start", "stop", "start"]  # two restarts, then no more
    assert [h.outcome for h in r.store.history()] == [
        "skipped",
        "succeeded",
        "succeeded",
    ]  # repeats logged once
    assert "crash loop" in r.store.history()[0].reason
    assert any(a.labels["alertname"] == "VLLMWatchdogCrashLoop" and a.state == "firing" for a in hub.sent)


async def test_a_target_queues_at_most_max_queued_jobs_and_skips_the_rest_on_an_audited_rail() -> None:
    r, *_ = make()
    restart, target = r.config.actions["restart"], r.config.targets[0]
    distinct = [
        Job(replace(restart, name=f"restart-{i}"), target, {}, "inbound") for i in range(MAX_QUEUED + 36)
    ]
    queued = [r.enqueue(job) for job in distinct]  # all before the worker first runs
    assert sum(queued) == MAX_QUEUED and len(r.queues["vllm-0"]) == MAX_QUEUED
    skipped = [rec for rec in r.store.history(limit=1000) if rec.outcome == "skipped"]
    assert len(skipped) == 36 and all(QUEUE_RAIL in rec.reason for rec in skipped)
    assert sum(n for (_, _, outcome), n in r.audit.counts.items() if outcome == "skipped") == 36
    r.queues["vllm-0"].clear()  # the queued ones are not what this test runs
    await settle(r)


class Pause:
    """What the monitor says about the target's engine: paused on purpose, or not."""

    def __init__(self) -> None:
        self.reason = ""

    def __call__(self, target: str, now: float) -> str:
        return self.reason if target == "vllm-0" else ""


async def test_a_paused_engine_is_not_restarted_by_any_alert_and_the_refusal_is_audited() -> None:
    pause = Pause()
    r, rt, _, hub, clock = make(engine_state=pause)
    pause.reason = "the engine is paused on purpose (GET /is_paused answered true since 12:00:00Z)"
    r.handle([alert("Hung"), alert("SpecBad")], clock.now)  # an operator's rule without `unless paused`
    await settle(r)
    assert rt.calls == []
    rows = {(rec.action, rec.outcome, rec.reason) for rec in r.store.history()}
    assert rows == {("restart", "skipped", pause.reason), ("draft_off", "skipped", pause.reason)}
    assert [e.outcome for e in hub.events] == ["skipped", "skipped"]
    pause.reason = ""  # POST /resume: the same alert, re-sent, restarts a hung engine as before
    clock.advance(60)
    r.handle([alert("Hung")], clock.now)
    await settle(r)
    assert rt.calls == ["stop", "start"]


async def test_a_child_that_exited_is_respawned_even_if_it_last_said_it_was_paused() -> None:
    pause = Pause()
    r, rt, *_ = make(engine_state=pause)
    pause.reason = "the engine is paused on purpose (GET /is_paused answered true since 12:00:00Z)"
    target = r.config.targets[0]
    r.enqueue(Job(RESPAWN, target, {"target": "vllm-0", "exit_code": "1"}, "supervisor"))
    await settle(r)
    assert rt.calls == ["stop", "start"]


async def test_a_restore_refused_while_paused_is_due_again_and_runs_after_the_resume() -> None:
    pause = Pause()
    r, rt, _, _, clock = make(engine_state=pause)
    r.handle([alert("Hot")], clock.now)
    await settle(r)
    r.handle([replace(alert("Hot", "resolved"), ends_at=clock.now)], clock.now)
    pause.reason = "the engine is asleep on purpose (GET /is_sleeping answered true)"
    clock.advance(601)  # the 10 m hold is over, but the engine sleeps
    await r.tick(clock.now)
    await settle(r)
    assert rt.calls == ["replace", "commit"]
    assert r.store.history()[0].outcome == "skipped"
    pending = r.store.get("restore/smaller/vllm-0")
    assert isinstance(pending, dict) and pending["due"] == clock.now + RESTORE_RECHECK
    pause.reason = ""  # POST /wake_up
    clock.advance(RESTORE_RECHECK)
    await r.tick(clock.now)
    await settle(r)
    assert rt.calls == ["replace", "commit", "replace", "commit"] and rt.current.args == ARGS


class HeldRuntime(ScriptedRuntime):
    """Its replace waits until `gate` is set: a flow still running when its target is removed."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def replace(self, launch: Launch, stop_timeout: float) -> None:
        self.calls.append("replace:held")
        await self.gate.wait()
        await super().replace(launch, stop_timeout)


async def test_a_removed_target_ends_its_running_flow_and_nothing_else_of_it_runs() -> None:
    r, rt, _, _, clock = make()
    r.handle([alert("Hot")], clock.now)  # reconfigured; resolved: its restore is due in 10 m
    await settle(r)
    r.handle([alert("Hot", "resolved")], clock.now)
    rt.fail_stop = True
    r.handle([alert("Hung")], clock.now)  # fails: retried while the alert fires
    await settle(r)
    assert r.retries.get("restart", "vllm-0") is not None and r.store.get("restore/smaller/vllm-0")
    held = HeldRuntime()
    r.runtimes = {"vllm-0": held}
    running = r.run_manual("draft_off", "vllm-0")
    waiting = r.run_manual("draft_on", "vllm-0")
    for _ in range(100):
        if "replace:held" in held.calls:
            break
        await asyncio.sleep(0.001)
    assert r.store.drains() and [j.action.name for j in r.queues["vllm-0"]] == ["draft_on"]

    removed = CONFIG.replace(
        'targets: [{name: vllm-0, url: "http://127.0.0.1:1", container: vllm-0}]', "targets: []"
    )
    r.apply(parse_config(removed, "c.yml"), {})
    assert waiting.done is not None and (await waiting.done)["outcome"] == "skipped"
    assert r.retries.get("restart", "vllm-0") is None and r.store.get("restore/smaller/vllm-0") is None
    assert r.current["vllm-0"] is running  # the flow goes on to its end: never left half done
    held.gate.set()
    assert running.done is not None and (await running.done)["outcome"] == "succeeded"
    await r.jobs.finished("vllm-0")
    await asyncio.sleep(0)
    assert r.store.drains() == {} and held.calls == ["replace:held", "replace", "commit"]
    rows = {rec.action: rec for rec in r.store.history(limit=10)}
    assert rows["draft_on"].outcome == "skipped" and rows["draft_on"].reason.startswith(
        "target_removed: target vllm-0 was removed from the config"
    )
    assert not any(key[1] == "vllm-0" for key in r.audit.counts)  # nothing kept of it for /metrics
    clock.advance(3600)
    await r.tick(clock.now)  # no restore, retry or respawn for a target that is gone
    await settle(r)
    assert held.calls == ["replace:held", "replace", "commit"] and r.queues == {}


class StartedRecently(ScriptedRuntime):
    """A server that (re)started one minute before the test's clock."""

    async def started_at(self) -> float | None:
        return T0 - 60.0


@pytest.mark.parametrize("ready", [False, True])
async def test_the_startup_grace_ends_once_the_server_was_ready(ready: bool) -> None:
    """A server that was ready since its start and then froze is restarted within its 10 m grace; one still
    loading is left alone, and the audit says why."""
    seen: list[tuple[str, float]] = []

    def ready_since(target: str, started: float) -> bool:
        seen.append((target, started))
        return ready

    text = CONFIG.replace(
        "restart: {type: restart, cooldown: 15m, startup_grace: 0s", "restart: {type: restart"
    )
    r, rt, *_ = make(text, ready_since=ready_since, runtime=StartedRecently())
    r.handle([alert("Hung")], T0)
    await settle(r)
    assert set(seen) == {("vllm-0", T0 - 60.0)}  # asked of the start the rails read
    (rec,) = r.store.history()
    if ready:
        assert (rt.calls, rec.outcome) == (["stop", "start"], "succeeded")
    else:
        assert (rt.calls, rec.outcome) == ([], "skipped")
        assert rec.reason.startswith("the server started 1m ago and has not been ready since")


SUPERSEDING = CONFIG.replace(
    "  - {match: {alertname: Hung}, actions: [restart]}\n",
    "  - {match: {alertname: Hung}, actions: [restart]}\n  - {match: {alertname: Down}, actions: [restart_down]}\n",
).replace(
    "actions:\n",
    "actions:\n  restart_down: {type: restart, cooldown: 15m, startup_grace: 0s}\n",
)


class SlowStop(ScriptedRuntime):
    """A stop that takes 20 s of the test's clock."""

    clock: Clock

    async def stop(self, timeout: float) -> None:
        self.clock.now += 20
        await super().stop(timeout)


def _firing(name: str, starts_at: float) -> OutgoingAlert:
    return replace(alert(name), starts_at=starts_at, ends_at=starts_at + 3600)


async def test_a_need_raised_while_another_restart_had_the_server_down_is_superseded_by_it() -> None:
    """VLLMDown fires while a restart has the server stopped; its own restart waits behind that one. Once the
    first succeeded, the server it restarted is the cure: the waiting restart is skipped (superseded), so a
    healthy, verified server is not drained and restarted again. A need that began after is acted on."""
    slow = SlowStop()
    r, rt, _, _, clock = make(SUPERSEDING, runtime=slow)
    slow.clock = clock
    began = clock.now
    r.handle([_firing("Hung", began)], clock.now)
    await settle(r)  # the stop took 20 s of the clock
    clock.now += 30
    r.handle([_firing("Down", began + 10)], clock.now)  # raised while the restart had the server stopped
    await settle(r)
    assert rt.calls == ["stop", "start"]  # one restart only
    down = next(rec for rec in r.store.history() if rec.action == "restart_down")
    assert down.outcome == "skipped", down
    assert "superseded: restart (id 1) restarted vllm-0" in down.reason
    clock.now += 60
    r.handle([_firing("Down", clock.now - 5)], clock.now)  # a fault that remains: raised again, later
    await settle(r)
    assert rt.calls == ["stop", "start", "stop", "start"]
    clock.now += 16 * 60  # past restart_down's cooldown, which a manual run obeys like every rail
    manual = Job(r.config.actions["restart_down"], r.config.targets[0], {}, "manual", needed_at=began)
    r.enqueue(manual)
    await settle(r)
    assert rt.calls[-2:] == ["stop", "start"] and len(rt.calls) == 6  # a person's run is never superseded
