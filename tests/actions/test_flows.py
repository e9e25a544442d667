"""The drain step of a restart: it waits for what the gateway itself still has in flight, not a cached count."""

from __future__ import annotations

import httpx
import pytest

from tests.support.clock import Clock
from vllm_watchdog.actions.flows import DRAIN_POLL, FlowContext, drain
from vllm_watchdog.actions.readiness import ReadyCheck
from vllm_watchdog.actions.state import ActionStore
from vllm_watchdog.actions.targetruntimes import UnavailableRuntime
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
