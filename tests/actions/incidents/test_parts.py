"""The collection runner on a test-moved clock: parts run at once, each within its timeout, all within the
budget; what ends badly is recorded, and nothing waits past the budget."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.incidents import Sleeper
from vllm_watchdog.actions.incidents.parts import Absent, Collection, Found, Part

pytestmark = pytest.mark.anyio


async def test_each_outcome_is_recorded_and_the_found_files_kept() -> None:
    clock = Sleeper()

    async def ok() -> Found:
        return Found({"a.txt": b"a"}, {"n": 1})

    async def absent() -> Found:
        raise Absent("no journalctl")

    async def broken() -> Found:
        raise RuntimeError("a bug")

    parts = [Part("ok", ok, 5), Part("absent", absent, 5), Part("broken", broken, 5)]
    results = await Collection(clock.sleep, clock.monotonic).run(parts, 5)
    assert [(r.name, r.status) for r in results] == [("ok", "ok"), ("absent", "absent"), ("broken", "failed")]
    assert results[0].found.files == {"a.txt": b"a"} and results[0].found.facts == {"n": 1}
    assert results[1].error == "no journalctl" and results[2].error == "RuntimeError: a bug"
    assert results[0].json() == {"name": "ok", "status": "ok", "seconds": 0.0, "files": ["a.txt"]}


async def test_a_part_past_its_timeout_stops_and_the_rest_go_on_until_the_budget_cuts_them() -> None:
    clock = Sleeper()
    cancelled: list[str] = []
    slow_done = asyncio.Event()

    async def hangs(name: str) -> Found:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.append(name)
        return Found()

    async def slow() -> Found:
        await clock.sleep(2)
        slow_done.set()
        return Found({"slow.txt": b"x"})

    parts = [
        Part("short", lambda: hangs("short"), 1),
        Part("slow", slow, 5),
        Part("long", lambda: hangs("long"), 9),
    ]
    run = asyncio.ensure_future(Collection(clock.sleep, clock.monotonic).run(parts, 4))
    await clock.advance(0)
    assert not run.done()
    await clock.advance(1)  # `short` reaches its own timeout
    assert cancelled == ["short"] and not run.done()
    await clock.advance(1)  # `slow` finishes
    assert slow_done.is_set() and not run.done()
    await clock.advance(1.5)
    assert not run.done()
    await clock.advance(0.5)  # the budget: `long`, whose timeout (9) lies past it, is cut
    results = await asyncio.wait_for(run, 1)
    assert [(r.name, r.status) for r in results] == [("short", "timeout"), ("slow", "ok"), ("long", "cut")]
    assert results[0].error == "no answer within 1s" and results[2].error == "cut at the 4s budget"
    assert results[1].seconds == 2.0 and results[2].seconds == 4.0
    await asyncio.sleep(0)
    assert cancelled == ["short", "long"]  # a cut part is cancelled, not left running


async def test_a_part_that_ignores_cancellation_does_not_hold_the_collection() -> None:
    clock = Sleeper()
    release = asyncio.Event()

    async def stubborn() -> Found:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # a part that swallows its cancellation (as a blocked worker thread would)
        return Found()

    collection = Collection(clock.sleep, clock.monotonic)
    run = asyncio.ensure_future(collection.run([Part("stubborn", stubborn, 10)], 3))
    try:
        await clock.advance(3)
        (result,) = await asyncio.wait_for(run, 1)
        assert result.status == "cut"
    finally:
        release.set()  # it ends later, in the background, and its answer is dropped
    await collection.leftovers.wait(1)


async def test_the_flow_waits_for_evidence_never_past_the_budget_even_if_the_collection_has_not_ended() -> (
    None
):
    from vllm_watchdog.actions.incidents.recorder import Incident, RecorderOptions

    clock = Sleeper()
    never = asyncio.ensure_future(asyncio.Event().wait())  # a collection whose wrap-up overran (a slow loop)
    written: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    options = RecorderOptions(sleep=clock.sleep, monotonic=clock.monotonic)
    incident = Incident("i", never, written, options, deadline=2.0)  # type: ignore[arg-type]
    waited = asyncio.ensure_future(incident.evidence())
    await clock.advance(1.9)
    assert not waited.done()
    await clock.advance(0.1)
    assert waited.done() and not never.done()
    await clock.advance(1)
    await asyncio.wait_for(incident.evidence(), 1)  # past the deadline it returns at once
    never.cancel()


async def test_the_stacks_start_first_and_only_the_budget_cuts_them() -> None:
    from vllm_watchdog.actions.config import MAX_INCIDENT_BUDGET
    from vllm_watchdog.actions.incidents import collectors
    from vllm_watchdog.config.model import parse_config
    from vllm_watchdog.redact import Redactor

    target = parse_config("targets: [{name: v, url: 'http://127.0.0.1:9'}]\n", "c.yml", env={}).targets[0]
    src = collectors.Sources(target, None, None, None, Redactor.of(()), None, 10, 60.0, False, 0.0)
    parts = collectors.parts(src)
    assert parts[0].name == "stacks" and parts[0].timeout > MAX_INCIDENT_BUDGET  # the whole budget
    assert all(p.timeout < 5.0 for p in parts[1:])
    results = await Collection(asyncio.sleep, lambda: 0.0).run(parts, 1)
    assert {r.name: r.status for r in results}["stacks"] == "absent"  # no runtime shows processes
