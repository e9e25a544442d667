"""The drain step of a restart: it waits for what the gateway itself still has in flight, not a cached count;
and every disruptive flow waits for its incident's evidence before it stops or changes vLLM."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from tests.support.clock import Clock
from vllm_watchdog.actions.config import ActionConfig
from vllm_watchdog.actions.pipeline.flows import DRAIN_POLL, FlowContext, drain
from vllm_watchdog.actions.pipeline.plans import Plan, execute_plan
from vllm_watchdog.actions.runtimes.readiness import ReadyCheck
from vllm_watchdog.actions.runtimes.runtime import Launch
from vllm_watchdog.actions.runtimes.targetruntimes import UnavailableRuntime
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.config.model import parse_config

CONFIG = "targets:\n  - {name: vllm-0, url: 'http://127.0.0.1:9'}\n"


def context(store: ActionStore, clock: Clock, gauge: float | None, answers: list[int | None]) -> FlowContext:
    """A flow context whose vLLM gauge says `gauge` and whose gateway answers `answers` in turn."""
    target = parse_config(CONFIG, "c.yml").targets[0]

    async def gateway_in_flight() -> int | None:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    return FlowContext(
        store=store,
        target=target,
        runtime=UnavailableRuntime("none", target.name, "test"),
        ready=ReadyCheck(httpx.AsyncClient()),
        running_requests=lambda: gauge,
        gateway_in_flight=gateway_in_flight,
        clock=clock,
        monotonic=clock,
        sleep=sleep,
    )


def begin(store: ActionStore, clock: Clock) -> int:
    return store.begin("restart", "restart", "vllm-0", "VLLMEngineHung", {}, False, clock())


@pytest.mark.anyio
async def test_a_request_the_gateway_admitted_a_moment_ago_is_waited_for() -> None:
    # vLLM's gauge (a scrape old) and the gateway's cached count both say 0; the gateway, asked, says 1.
    store, clock = ActionStore(None), Clock()
    ctx = context(store, clock, 0.0, [1, 1, 0])
    await drain(ctx, begin(store, clock), timeout=60.0)
    assert clock.now - Clock().now == pytest.approx(2 * DRAIN_POLL)  # it waited until the gateway said 0
    assert set(store.drains()) == {"vllm-0"}  # and the flag that holds new requests is set


@pytest.mark.anyio
async def test_without_a_gateway_the_gauge_decides_and_the_timeout_ends_the_wait() -> None:
    store, clock = ActionStore(None), Clock()
    await drain(context(store, clock, 3.0, [None]), begin(store, clock), timeout=10.0)
    assert clock.now - Clock().now == pytest.approx(10.0)


class Recording:
    """A runtime and a GPU power control that note each call, in order, in one list with the evidence wait."""

    kind = "docker"
    target = "vllm-0"

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    async def stop(self, timeout: float) -> None:
        self.calls.append("stop")

    async def start(self) -> None:
        self.calls.append("start")

    async def replace(self, launch: Launch, stop_timeout: float) -> None:
        self.calls.append("replace")

    async def is_running(self) -> bool:
        return True

    async def commit(self) -> None:
        self.calls.append("commit")

    def current(self, index: int) -> float:
        return 700.0

    def set_limit(self, index: int, watts: float) -> float:
        self.calls.append("power")
        return watts


class AlwaysReady:
    async def wait(self, target: object, timeout: float, alive: object = None) -> tuple[bool, str]:
        return True, ""


@pytest.mark.anyio
async def test_the_evidence_is_awaited_before_the_first_step_that_stops_or_changes_vllm() -> None:
    store, clock = ActionStore(None), Clock()
    for plan, first in (
        (Plan("restart", "restart"), "stop"),
        (Plan("relaunch", "relaunch", new=Launch("docker", ("--x",))), "replace"),
        (Plan("power", "power", power={0: 500.0}), "power"),
    ):
        calls: list[str] = []
        rec = Recording(calls)

        async def evidence(calls: list[str] = calls) -> None:
            calls.append("evidence")

        ctx = replace(
            context(store, clock, None, [None]), runtime=rec, ready=AlwaysReady(), evidence=evidence
        )  # type: ignore[arg-type]
        action = ActionConfig("a", "restart", drain_timeout=0.0)
        outcome = await execute_plan(plan, action, ctx, begin(store, clock), store, rec)
        assert outcome.outcome == "succeeded", outcome
        assert calls[:2] == ["evidence", first], (plan.kind, calls)
