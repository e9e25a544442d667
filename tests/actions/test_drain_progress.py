"""The drain that knows progress: it ends as soon as nothing in flight can move (no upstream byte and no engine
step for `stall_after`), waits for a healthy engine's requests, keeps the old wait with no signal, and says in
its `drained` step why it ended. Also the signals themselves: the engine's idle time as the sample store and
the action plane see it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import httpx
import pytest

from tests.actions.test_flows import AlwaysReady, Recording, begin
from tests.actions.test_flows import context as flow_context
from tests.support.clock import Clock
from vllm_watchdog.actions.config import ActionConfig
from vllm_watchdog.actions.pipeline.flows import STALLED_STOP_TIMEOUT, FlowContext, drain
from vllm_watchdog.actions.pipeline.plans import Plan, execute_plan
from vllm_watchdog.actions.pipeline.progress import (
    RUNNING,
    STALL_AFTER,
    STEPS,
    EngineSteps,
    Progress,
    engine_steps,
    stalled_for,
)
from vllm_watchdog.actions.runtimes.runtime import Launch
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.gateway.protocol.progress import UpstreamProgress
from vllm_watchdog.promql.engine import Engine
from vllm_watchdog.service.actionplane import ActionPlane
from vllm_watchdog.service.actionwiring import ActionPlaneOptions
from vllm_watchdog.store import STALE_NAN, SampleStore, make_labels

CONFIG = "targets:\n  - {name: vllm-0, url: 'http://127.0.0.1:9'}\n"


def frozen(seconds: float) -> Progress:
    """An engine whose counter stood still for `seconds` while vLLM reported requests running (for longer)."""
    return Progress(EngineSteps(still=seconds, busy=seconds + 30.0))


def context(
    store: ActionStore,
    clock: Clock,
    running: Callable[[], float | None],
    progress: Callable[[], Progress],
    gateway: Callable[[], int | None] = lambda: None,
) -> FlowContext:
    """A flow context whose vLLM gauge, gateway count and progress are the given callables of the clock (the
    flow tests' context, on a test clock, with these three read live)."""

    async def gateway_in_flight() -> int | None:
        return gateway()

    return replace(
        flow_context(store, clock, None, [None]),
        running_requests=running,
        gateway_in_flight=gateway_in_flight,
        progress=progress,
    )


async def drained(ctx: FlowContext, store: ActionStore, clock: Clock, **kw: float) -> tuple[float, dict]:
    """Run a drain from the clock's now; seconds it took and its `drained` step's details."""
    start = clock.now
    action_id = store.begin("restart", "restart", "vllm-0", "VLLMEngineHung", {}, False, clock())
    await drain(ctx, action_id, **{"timeout": 60.0, **kw})
    record = next(r for r in store.history(limit=5) if r.id == action_id)
    step = next(s for s in record.steps if s.step == "drained")
    assert step.details is not None
    return clock.now - start, step.details


@pytest.mark.anyio
async def test_a_frozen_engine_without_a_gateway_ends_the_drain_after_stall_after() -> None:
    # The engine froze just before the drain: its step counter stands still from now on, two requests run.
    store, clock = ActionStore(None), Clock()
    frozen_at = clock.now
    ctx = context(store, clock, lambda: 2.0, lambda: frozen(clock.now - frozen_at))
    took, step = await drained(ctx, store, clock)
    assert took == pytest.approx(STALL_AFTER)  # not the 60 s drain_timeout
    assert step["ended"] == "stalled: no progress for 5s"
    assert step["running"] == 2.0


@pytest.mark.anyio
async def test_an_engine_frozen_long_before_the_drain_is_stopped_at_once() -> None:
    store, clock = ActionStore(None), Clock()
    ctx = context(store, clock, lambda: 1.0, lambda: frozen(120.0))
    took, step = await drained(ctx, store, clock)
    assert took == 0.0
    assert step["ended"] == "stalled: no progress for 120s"


@pytest.mark.anyio
async def test_a_healthy_engines_requests_finish_even_past_stall_after() -> None:
    # Its counter moves on every scrape; its requests take 12 s, longer than stall_after.
    store, clock = ActionStore(None), Clock()
    start = clock.now
    ctx = context(
        store,
        clock,
        lambda: 3.0 if clock.now - start < 12.0 else 0.0,
        lambda: frozen((clock.now - start) % 1.0),
    )
    took, step = await drained(ctx, store, clock)
    assert took == pytest.approx(12.0)
    assert step["ended"] == "all finished"


@pytest.mark.anyio
async def test_with_neither_signal_the_drain_waits_for_its_timeout_and_says_so() -> None:
    store, clock = ActionStore(None), Clock()
    took, step = await drained(context(store, clock, lambda: 3.0, Progress), store, clock, timeout=10.0)
    assert took == pytest.approx(10.0)
    assert step["ended"] == "timeout: still running after 10s"


@pytest.mark.anyio
async def test_stall_after_zero_keeps_the_old_wait() -> None:
    store, clock = ActionStore(None), Clock()
    ctx = context(store, clock, lambda: 1.0, lambda: frozen(600.0))
    took, step = await drained(ctx, store, clock, timeout=10.0, stall_after=0.0)
    assert took == pytest.approx(10.0)
    assert step["ended"].startswith("timeout")


@pytest.mark.anyio
async def test_nothing_known_in_flight_ends_at_once_as_before() -> None:
    store, clock = ActionStore(None), Clock()
    took, step = await drained(context(store, clock, lambda: None, Progress), store, clock)
    assert took == 0.0
    assert step["ended"].startswith("nothing known in flight")


@pytest.mark.anyio
async def test_the_gateway_alone_judges_its_streams_but_not_silent_requests() -> None:
    # Streams that stopped 1 s before the drain: stalled 4 s later. A non-streamed request among them (silent)
    # could be moving without a byte: without the engine's steps the drain waits for its timeout.
    for silent, expected in ((0, STALL_AFTER - 1.0), (1, 20.0)):
        store, clock = ActionStore(None), Clock()
        last_byte = clock.now - 1.0

        def progress(silent: int = silent, last_byte: float = last_byte, clock: Clock = clock) -> Progress:
            return Progress(upstream=UpstreamProgress(2, clock.now - last_byte, silent))

        ctx = context(store, clock, lambda: 2.0, progress, gateway=lambda: 2)
        took, step = await drained(ctx, store, clock, timeout=20.0)
        assert took == pytest.approx(expected), silent
        assert step["ended"].startswith("stalled" if silent == 0 else "timeout"), step


@pytest.mark.anyio
async def test_the_plan_passes_the_actions_stall_after_to_the_drain() -> None:
    store, clock = ActionStore(None), Clock()
    frozen_at = clock.now

    class Stopped(Exception):
        pass

    async def evidence() -> None:
        raise Stopped  # the drain is done by now: stop before the runtime is touched

    ctx = replace(
        context(store, clock, lambda: 1.0, lambda: frozen(clock.now - frozen_at)),
        evidence=evidence,
    )
    action = ActionConfig("a", "restart", stall_after=2.0)
    action_id = store.begin("restart", "restart", "vllm-0", "VLLMEngineHung", {}, False, clock())
    with pytest.raises(Stopped):
        await execute_plan(Plan("restart", "restart"), action, ctx, action_id, store, None)
    assert clock.now - frozen_at == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("progress", "running", "expected"),
    [
        (Progress(), 2.0, None),
        (frozen(7.0), 2.0, 7.0),
        (Progress(EngineSteps(still=7.0)), 2.0, 0.0),  # no word of requests running: it may just be idle
        (Progress(EngineSteps(still=7.0, busy=2.0)), 2.0, 2.0),  # idle until a request came 2 s ago
        (frozen(7.0), 2.0, 7.0),
        (Progress(upstream=UpstreamProgress(2, 9.0, 0)), 2.0, 9.0),
        (Progress(upstream=UpstreamProgress(2, 9.0, 1)), 2.0, None),  # a silent one only steps can tell
        (Progress(upstream=UpstreamProgress(2, 9.0, 0)), 3.0, None),  # vLLM runs one the gateway never saw
        (Progress(frozen(7.0).engine, UpstreamProgress(2, 1.0, 0, 9.0)), 2.0, 1.0),  # a stream moves
        (Progress(frozen(1.0).engine, UpstreamProgress(2, 9.0, 2, 9.0)), 2.0, 1.0),  # the engine steps
        # vLLM's gauge froze with the engine at 0; the gateway's oldest request was sent 8 s ago: the engine
        # has had work for 8 s, and not one step.
        (Progress(EngineSteps(still=60.0, busy=0.0), UpstreamProgress(1, 8.0, 1, 8.0)), 1.0, 8.0),
        (Progress(EngineSteps(still=60.0), UpstreamProgress(1, 8.0, 1, 8.0)), 1.0, 8.0),
        (Progress(frozen(6.0).engine, UpstreamProgress(0, None, 0)), 1.0, 6.0),  # the gateway has none
    ],
)
def test_stalled_for_takes_the_least_idle_signal_that_can_tell(
    progress: Progress, running: float, expected: float | None
) -> None:
    assert stalled_for(progress, running) == expected


def test_engine_steps_reads_how_long_the_counter_stood_still_and_requests_ran() -> None:
    ts = [1000, 2000, 3000, 4000, 5000, 6000]
    # Idle (0 running) for 3 scrapes, then a request runs and the counter stops.
    steps = [(ts, [10.0, 10.0, 10.0, 10.0, 10.0, 10.0])]
    running = [(ts, [0.0, 0.0, 0.0, 1.0, 1.0, 1.0])]
    assert engine_steps(steps, running, now=6.5, fresh=2.0) == EngineSteps(still=5.0, busy=2.0)
    # Moving on every scrape: 0; a second engine that moves makes it 0 too; the gauge sums the engines.
    assert engine_steps([(ts, [1.0, 2, 3, 4, 5, 6])], running, now=6.5, fresh=2.0).still == 0.0
    both = [*steps, (ts, [1.0, 2, 3, 4, 5, 6])]
    other = (ts, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0])  # engine 1 ran one just before engine 0
    assert engine_steps(both, [*running, other], now=6.5, fresh=2.0) == EngineSteps(still=0.0, busy=3.0)
    # Stale samples (the scrapes stopped) tell nothing; staleness markers are no samples.
    assert engine_steps(steps, running, now=60.0, fresh=2.0) == EngineSteps()
    gone = [([*ts, 7000], [10.0, 10.0, 10.0, 10.0, 10.0, 10.0, STALE_NAN])]
    assert engine_steps(gone, running, now=7.5, fresh=2.0) == EngineSteps(still=5.0, busy=2.0)
    assert engine_steps([], [], now=6.5, fresh=2.0) == EngineSteps()


@pytest.mark.anyio
async def test_the_action_plane_reads_the_engine_steps_from_the_sample_store() -> None:
    clock = Clock()
    samples = SampleStore(retention=600.0)
    config = parse_config(CONFIG, "c.yml")
    plane = ActionPlane(
        config,
        ActionPlaneOptions(
            engine=lambda: Engine(samples), client_factory=lambda *a, **k: httpx.AsyncClient(), clock=clock
        ),
    )
    assert plane.engine_steps("vllm-0") == EngineSteps()  # nothing scraped yet
    base = {"target": "vllm-0", "engine": "0"}
    for second in range(30):  # 20 s moving, then frozen; 2 running from second 10 on
        t_ms = int((clock.now - 30 + second) * 1000)
        samples.append(make_labels(STEPS, base), t_ms, float(min(second, 20)))
        samples.append(make_labels(RUNNING, base), t_ms, 2.0 if second >= 10 else 0.0)
    assert plane.engine_steps("vllm-0") == EngineSteps(still=9.0, busy=19.0)
    assert plane.engine_steps("other") == EngineSteps()


class StopTimeouts(Recording):  # type: ignore[misc]
    """A runtime that notes the SIGTERM-to-SIGKILL wait each stop and replace were given."""

    async def stop(self, timeout: float) -> None:
        self.calls.append(f"stop {timeout:g}")

    async def replace(self, launch: Launch, stop_timeout: float) -> None:
        self.calls.append(f"replace {stop_timeout:g}")


@pytest.mark.anyio
@pytest.mark.parametrize(("stalled", "waits"), [(True, STALLED_STOP_TIMEOUT), (False, 90.0)])
async def test_a_server_whose_drain_found_it_stalled_is_killed_without_the_graceful_wait(
    stalled: bool, waits: float
) -> None:
    """A frozen EngineCore never handles SIGTERM (its API server waits on it), so the stop's 90 s would be
    wasted on it: after a drain that ended stalled, SIGKILL follows 5 s after SIGTERM. A healthy server's
    drain (everything finished) keeps the whole graceful wait."""
    store, clock = ActionStore(None), Clock()
    for plan, verb in (
        (Plan("restart", "restart"), "stop"),
        (Plan("relaunch", "relaunch", new=Launch("docker", ("--x",))), "replace"),
    ):
        calls: list[str] = []
        ctx = replace(
            context(store, clock, lambda: 1.0 if stalled else 0.0, lambda: frozen(30.0)),
            runtime=StopTimeouts(calls),
            ready=AlwaysReady(),
        )  # type: ignore[arg-type]
        action = ActionConfig("a", "restart", drain_timeout=60.0, stop_timeout=90.0)
        outcome = await execute_plan(plan, action, ctx, begin(store, clock), store, None)
        assert outcome.outcome == "succeeded", outcome
        assert f"{verb} {waits:g}" in calls, calls
