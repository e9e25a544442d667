"""The daemon's loop keeps its schedule whatever the read API is asked.

Every query, and /api/v1/samples, runs its whole work (parse, evaluate, sort, redact, encode) in a child
process while the loop only waits on a pipe. Before this, a query ran on the loop: its deadline covered the
evaluation only, so a range query answering 330,000 points held the loop for more than a second while its
answer was built and encoded, /api/v1/samples had no deadline at all, and one client with forty subqueries
kept the 32-place queue full, so that every other client's `up` got 503.

The loop's health is a task ticking every 50 ms on it: the test counts the ticks it missed.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from vllm_watchdog.api.fairqueue import Busy
from vllm_watchdog.api.prometheus import QueryOptions, query_routes
from vllm_watchdog.api.querychild import Answer, Child, ChildLimits, spawn
from vllm_watchdog.api.queryrunner import QueryRunner, RunnerLimits
from vllm_watchdog.api.samples import samples_route
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.redact import Redactor
from vllm_watchdog.store import SampleStore, make_labels

T0 = 1_700_000_000.0
SERIES = 25
SPAN = 1200  # seconds of stored samples, one every 30 s per series
TICK = 0.05
HUGE = {"query": "q", "start": str(T0), "end": str(T0 + 1099.9), "step": "0.1"}  # 25 x 11,000 points: 7.6 MB
SLOW = "max_over_time(q[1000s:1ms])"  # a million subquery steps: runs until its deadline


def _store() -> SampleStore:
    store = SampleStore(retention=3 * SPAN)
    for t in range(0, SPAN, 30):
        for i in range(SERIES):
            store.append(
                make_labels("q", {"job": "vllm", "pod": f"pod-{i}"}), round((T0 + t) * 1000), float(i + t)
            )
        store.append(make_labels("up", {"job": "vllm"}), round((T0 + t) * 1000), 1.0)
    return store


def _hang() -> Answer:
    time.sleep(60)  # past any deadline, where no step of the engine checks it
    return Answer(200, b"[]")


class Faults:
    """A spawn whose next children run these instead of their work: os.abort as a segfaulting parser would
    die, _hang as a query stuck where no deadline is checked."""

    def __init__(self) -> None:
        self.pending: list[Callable[[], Answer]] = []

    def __call__(self, work: Callable[[], Answer], limits: ChildLimits) -> Child:
        return spawn(self.pending.pop(0) if self.pending else work, limits)


def _clients(runner: QueryRunner, *addresses: str) -> list[httpx.AsyncClient]:
    store, config = _store(), parse_config("targets: []\n", "test.yml")
    options = QueryOptions(
        lambda: config, lambda: store, Redactor, lambda: T0 + SPAN, runner.monotonic, lambda: True, runner
    )
    app = Starlette(routes=[*query_routes(options), samples_route(lambda: store, Redactor, runner)])
    return [
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, client=(a, 40000)), base_url="http://api", timeout=30
        )
        for a in addresses
    ]


async def _up(client: httpx.AsyncClient) -> httpx.Response:
    return await client.get("/api/v1/query", params={"query": "up", "time": str(T0 + SPAN)})


@pytest.mark.anyio
async def test_hostile_queries_back_to_back_leave_the_loop_its_ticks() -> None:
    faults = Faults()
    runner = QueryRunner(limits=RunnerLimits(grace=0.3), spawn=faults)
    (client,) = _clients(runner, "192.0.2.1")
    loop, stamps, done = asyncio.get_running_loop(), [], asyncio.Event()

    async def tick() -> None:
        while not done.is_set():
            await asyncio.sleep(TICK)
            stamps.append(loop.time())

    ticker = asyncio.ensure_future(tick())
    statuses: list[int] = []
    at = str(T0 + SPAN)
    for query in ("huge", SLOW, "sort_desc(sort_desc(sort_desc(sort_desc(q))))", "samples", "crash", "huge"):
        if query == "huge":
            r = await client.get("/api/v1/query_range", params=HUGE)
        elif query == "samples":
            r = await client.get("/api/v1/samples", params={"match": "q"})
        else:
            faults.pending = [os.abort] if query == "crash" else []
            r = await client.get("/api/v1/query", params={"query": query, "time": at, "timeout": "0.5"})
        statuses.append(r.status_code)
    done.set()
    await ticker
    missed = [round((b - a) / TICK) - 1 for a, b in itertools.pairwise(stamps)]
    assert max(missed) <= 4, f"the loop missed {max(missed)} ticks in a row (of {len(stamps)} ticks)"
    assert statuses[1:5] == [503, 200, 200, 422] and {statuses[0], statuses[5]} <= {200, 503}, statuses
    assert (await _up(client)).status_code == 200


@pytest.mark.anyio
async def test_a_crashed_hung_or_oversized_child_is_a_prometheus_error_and_the_next_query_works() -> None:
    faults = Faults()
    # The kill comes `grace` after the query's own deadline: long enough that a child slowed by a loaded machine
    # (CI once took over 0.2 s to start one) still reaches its own deadline first and says where it stopped.
    runner = QueryRunner(limits=RunnerLimits(max_bytes=2000, grace=2.0), spawn=faults)
    (client,) = _clients(runner, "192.0.2.1")
    at = str(T0 + SPAN)
    expected: list[tuple[Callable[[], Any], int, str, str]] = [
        (
            lambda: client.get("/api/v1/query", params={"query": "q", "time": at}),
            422,
            "execution",
            "the answer is larger than 2000 bytes",
        ),
        (
            lambda: client.get("/api/v1/query", params={"query": SLOW, "time": at, "timeout": "0.1"}),
            503,
            "timeout",
            "query timed out in expression evaluation",
        ),
        (
            lambda: client.get("/api/v1/series", params={"match[]": "up"}),
            422,
            "execution",
            "the query's process died (killed by SIGABRT)",
        ),
        (
            lambda: client.get("/api/v1/samples", params={"match": "up"}),
            422,
            "execution",
            "the query's process died (killed by SIGABRT)",
        ),
    ]
    hang = (
        lambda: client.get("/api/v1/query", params={"query": "up", "time": at, "timeout": "0.1"}),
        503,
        "timeout",
        "query timed out in query execution",
    )
    for i, (ask, status, kind, message) in enumerate([*expected, hang]):
        faults.pending = [os.abort] if i in (2, 3) else [_hang] if i == 4 else []
        r = await ask()
        assert r.status_code == status, r.text
        assert r.json() == {"status": "error", "errorType": kind, "error": message}
        assert (await _up(client)).json()["data"]["result"][0]["value"] == [T0 + SPAN, "1"]
    samples = (await client.get("/api/v1/samples", params={"match": "up"})).json()["data"]
    assert len(samples) == 1 and samples[0]["samples"][0] == [T0, "1.0"]


@pytest.mark.anyio
async def test_one_client_with_forty_slow_queries_cannot_keep_another_clients_up_out() -> None:
    runner = QueryRunner(limits=RunnerLimits(grace=0.2))
    hostile, grafana = _clients(runner, "192.0.2.1", "192.0.2.2")
    slow = {"query": SLOW, "time": str(T0 + SPAN), "timeout": "0.3"}
    flood = [asyncio.ensure_future(hostile.get("/api/v1/query", params=slow)) for _ in range(40)]
    for _ in range(1000):  # until the queue has taken what it takes from this client, and refused the rest
        if runner.queue.waiting_for("address:192.0.2.1") == 8 and sum(t.done() for t in flood) == 31:
            break
        await asyncio.sleep(0.01)
    refused = [t.result() for t in flood if t.done()]
    assert {r.status_code for r in refused} == {503}
    assert refused[0].json()["error"] == "this client has 8 queries waiting; try again later"
    r = await _up(grafana)
    assert r.status_code == 200 and r.json()["data"]["result"][0]["metric"] == {
        "__name__": "up",
        "job": "vllm",
    }
    assert sum(t.done() for t in flood) <= 33  # served after at most the running one and the next in turn
    for t in flood:
        t.cancel()
    await asyncio.gather(*flood, return_exceptions=True)


@pytest.mark.anyio
async def test_answers_a_client_leaves_unread_are_capped_and_released_once_sent() -> None:
    runner = QueryRunner(limits=RunnerLimits(held=3000, held_per_client=1500))
    scope = {"client": ("192.0.2.1", 40000), "server": ("192.0.2.9", 9090)}
    other = {"client": ("192.0.2.2", 40000), "server": ("192.0.2.9", 9090)}
    work = lambda: Answer(200, b"x" * 1000)  # noqa: E731
    first = await runner.run(scope, work, 1.0)
    second = await runner.run(scope, work, 1.0)  # 1,000 held: still under this client's 1,500
    with pytest.raises(Busy, match="answers not yet read by their clients hold 2000 bytes"):
        await runner.run(scope, work, 1.0)
    third = await runner.run(other, work, 1.0)
    with pytest.raises(Busy):
        await runner.run(other, work, 1.0)  # 3,000 held in all
    for delivery in (first, second, third):
        delivery.sent()
    assert runner.held == {}
    assert (await runner.run(scope, work, 1.0)).answer == Answer(200, b"x" * 1000)
