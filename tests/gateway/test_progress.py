"""The gateway tells a drain how recently its requests in flight heard from vLLM: a real GatewayServer (own
thread) in front of a real loopback upstream, asked through a GatewayControl as the daemon asks it; the
gateway's monotonic clock is a test clock, so the seconds it reports are exact."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import pytest

from tests.support.clock import Clock
from tests.support.gateway_upstream import Upstream, hang, sse
from tests.support.vllm_server import free_port
from vllm_watchdog.actions.pipeline.flows import FlowContext, drain
from vllm_watchdog.actions.pipeline.progress import EngineSteps, progress_reader
from vllm_watchdog.actions.runtimes.readiness import ReadyCheck
from vllm_watchdog.actions.runtimes.targetruntimes import UnavailableRuntime
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.gateway.config import GatewayConfig
from vllm_watchdog.gateway.control.handle import GatewayControl, GatewayControlOptions
from vllm_watchdog.gateway.dataplane.locallink import LocalLink
from vllm_watchdog.gateway.dataplane.server import GatewayServer
from vllm_watchdog.gateway.protocol.progress import UpstreamProgress, read_drain_answer

pytestmark = pytest.mark.anyio
STREAM = {"model": "m", "prompt": "hi", "stream": True}
PLAIN = {"model": "m", "prompt": "hi"}


class OldGateway(LocalLink):
    """A gateway from before the progress: it ignores the flag and answers set_drain with the bare count."""

    async def request(self, op: str, args: Mapping[str, Any] | None = None) -> Any:
        return await super().request(op, {k: v for k, v in (args or {}).items() if k != "progress"})


class Rig:
    """A gateway on a test clock, the daemon's control of it, and a client."""

    def __init__(self, upstream: Upstream, link_type: type[LocalLink] = LocalLink) -> None:
        self.clock = Clock()
        config = GatewayConfig(target="vllm-0", listen_port=free_port(), upstream=upstream.url)
        self.server = GatewayServer(config, monotonic=self.clock)
        self.link = link_type(self.server, monotonic=self.clock)
        self.store = ActionStore(None)
        options = GatewayControlOptions(self.link, self.store, clock=self.clock, monotonic=self.clock)
        self.control = GatewayControl(config, options)
        self.client = httpx.AsyncClient(base_url=self.server.url, timeout=30)
        self.tasks: list[asyncio.Task[None]] = []

    async def progress(self) -> UpstreamProgress | None:
        """Ask as a drain does (not drained here, so that the test's own requests are admitted)."""
        await self.control.set_drain(False)
        return self.control.progress()

    def stream(self, first: asyncio.Event) -> None:
        """A streamed completion that sets `first` once its first chunk arrived, then reads on."""

        async def run() -> None:
            async with self.client.stream("POST", "/v1/completions", json=STREAM) as r:
                async for _ in r.aiter_raw():
                    first.set()

        self.tasks.append(asyncio.create_task(run()))

    def plain(self) -> None:
        """A non-streamed request to the hanging route."""

        async def run() -> None:
            await self.client.post("/v1/chat/completions", json=PLAIN)

        self.tasks.append(asyncio.create_task(run()))

    async def until(self, in_flight: int) -> None:
        for _ in range(500):
            if self.control.in_flight() == in_flight:
                return
            await self.control.set_drain(False)
            await asyncio.sleep(0.01)
        raise AssertionError(f"never {in_flight} in flight")

    async def aclose(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.client.aclose()
        await self.control.aclose(grace=1.0)


@pytest.fixture
async def rig(upstream: Upstream) -> AsyncIterator[Rig]:
    r = Rig(upstream)
    await r.control.start()
    yield r
    await r.aclose()


async def test_streams_report_their_last_chunk_and_silent_requests_are_counted(
    rig: Rig, upstream: Upstream
) -> None:
    go = threading.Event()
    upstream.routes["/v1/completions"] = sse([b"data: first\n\n", b"data: [DONE]\n\n"], go)
    upstream.routes["/v1/chat/completions"] = hang(upstream)
    assert await rig.progress() == UpstreamProgress(0, None, 0)  # nothing in flight: nothing to tell
    first = asyncio.Event()
    rig.stream(first)
    await asyncio.wait_for(first.wait(), 10)
    assert await rig.progress() == UpstreamProgress(1, 0.0, 0, 0.0)
    rig.clock.advance(7.0)
    assert await rig.progress() == UpstreamProgress(1, 7.0, 0, 7.0)  # the stream heard nothing for 7 s
    rig.plain()  # sent now: it heard nothing yet, which only vLLM's steps can judge
    await rig.until(2)
    rig.clock.advance(3.0)
    assert await rig.progress() == UpstreamProgress(2, 3.0, 1, 10.0)
    go.set()  # the stream ends: only the silent one is left
    await rig.until(1)
    assert await rig.progress() == UpstreamProgress(1, 3.0, 1, 3.0)


@pytest.mark.parametrize(
    ("streamed", "engine", "took", "ended"),
    [
        # A stream that stopped: the gateway alone can tell.
        (True, EngineSteps(), 5.0, "stalled: no progress for 5s"),
        # A non-streamed request, no word from the engine: it may be moving without a byte.
        (False, EngineSteps(), 20.0, "timeout: still running after 20s"),
        # The same with the engine's counter still for a minute and its gauge frozen at 0 with it: the engine
        # has had the gateway's request for 5 s without a step.
        (False, EngineSteps(still=60.0, busy=0.0), 5.0, "stalled: no progress for 5s"),
    ],
)
async def test_a_drain_in_front_of_a_frozen_engine_ends_after_stall_after(
    rig: Rig, upstream: Upstream, streamed: bool, engine: EngineSteps, took: float, ended: str
) -> None:
    upstream.routes["/v1/completions"] = sse([b"data: first\n\n", b"data: [DONE]\n\n"], threading.Event())
    upstream.routes["/v1/chat/completions"] = hang(upstream)
    if streamed:
        first = asyncio.Event()
        rig.stream(first)
        await asyncio.wait_for(first.wait(), 10)
    else:
        rig.plain()
        await rig.until(1)
    target = parse_config("targets:\n  - {name: vllm-0, url: 'http://127.0.0.1:9'}\n", "c.yml").targets[0]

    async def in_flight() -> int | None:
        await rig.control.set_drain(True)
        return rig.control.in_flight()

    async def sleep(seconds: float) -> None:
        rig.clock.advance(seconds)

    ctx = FlowContext(
        store=rig.store,
        target=target,
        runtime=UnavailableRuntime("none", "vllm-0", "test"),
        ready=ReadyCheck(rig.client),
        running_requests=lambda: None,  # no vLLM gauge, no engine steps: the gateway alone
        gateway_in_flight=in_flight,
        progress=progress_reader(rig.control, lambda: engine),
        clock=rig.clock,
        monotonic=rig.clock,
        sleep=sleep,
    )
    action_id = rig.store.begin("restart", "restart", "vllm-0", "VLLMEngineHung", {}, False, rig.clock())
    start = rig.clock.now
    await drain(ctx, action_id, 20.0, 5.0)
    assert rig.clock.now - start == pytest.approx(took)
    steps = next(r for r in rig.store.history(limit=5) if r.id == action_id).steps
    assert [s.details for s in steps if s.step == "drained"] == [{"running": 1.0, "ended": ended}]


async def test_an_old_gateway_and_an_old_daemon_still_understand_each_other(upstream: Upstream) -> None:
    old = Rig(upstream, OldGateway)
    await old.control.start()
    try:
        upstream.routes["/v1/chat/completions"] = hang(upstream)
        old.plain()
        await old.until(1)  # the count still arrives ...
        assert await old.progress() is None  # ... and no progress, so the drain judges by vLLM alone
        # An old daemon never asks for the progress: a new gateway answers it the bare count.
        assert await old.link.request("set_drain", {"drained": False}) == 1
        assert await LocalLink.request(old.link, "set_drain", {"drained": False, "progress": True}) == {
            "in_flight": 1,
            "progress": {"in_flight": 1, "idle": 0.0, "silent": 1, "oldest": 0.0},
        }
    finally:
        await old.aclose()


def test_an_answer_the_daemon_cannot_read_gives_the_count_and_no_progress() -> None:
    assert read_drain_answer(3) == (3, None)
    assert read_drain_answer({"in_flight": 2, "progress": {"in_flight": 2, "idle": 1.5}}) == (
        2,
        UpstreamProgress(2, 1.5, 0),
    )
    assert read_drain_answer({"in_flight": 2, "progress": {"in_flight": 2, "idle": 1.5, "new": 1}}) == (
        2,
        None,
    )
    assert read_drain_answer({"in_flight": 2, "progress": {"in_flight": 2, "idle": "nan"}}) == (2, None)
    assert read_drain_answer({"in_flight": 2, "progress": {"in_flight": 2, "idle": -1.0}}) == (2, None)
    assert read_drain_answer({"in_flight": 2, "progress": {"in_flight": 2, "idle": 1, "oldest": "inf"}}) == (
        2,
        None,
    )
    for bad in ({"progress": {}}, {"in_flight": True}, "2", None):
        with pytest.raises(TypeError):
            read_drain_answer(bad)
