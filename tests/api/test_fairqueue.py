"""The fair queue: a client's waiting queries are capped, and clients take turns at the slot."""

from __future__ import annotations

import asyncio

import pytest

from vllm_watchdog.api.fairqueue import Busy, FairQueue


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.anyio
async def test_one_client_cannot_fill_the_queue_and_others_are_served_in_turn() -> None:
    queue = FairQueue(slots=1, per_client=8, waiting=64)
    order: list[str] = []
    release = asyncio.Event()

    async def ask(client: str, name: str) -> str:
        try:
            async with queue.turn(client):
                order.append(name)
                await release.wait()
                release.clear()
            return "ok"
        except Busy as exc:
            return str(exc)

    first = [asyncio.ensure_future(ask("a", f"a{i}")) for i in range(40)]
    await _settle()
    refused = [t.result() for t in first if t.done()]
    assert len(refused) == 31 and refused[0] == "this client has 8 queries waiting; try again later"
    others = [asyncio.ensure_future(ask("b", "b0")), asyncio.ensure_future(ask("c", "c0"))]
    await _settle()
    for _ in range(11):
        release.set()
        await _settle()
    assert order == ["a0", "a1", "b0", "c0", "a2", "a3", "a4", "a5", "a6", "a7", "a8"]
    await asyncio.gather(*first, *others)


@pytest.mark.anyio
async def test_all_clients_together_are_capped_and_a_cancelled_waiter_leaves_its_place() -> None:
    queue = FairQueue(slots=1, per_client=2, waiting=3)
    hold = asyncio.Event()

    async def ask(client: str) -> None:
        async with queue.turn(client):
            await hold.wait()

    tasks = [asyncio.ensure_future(ask(c)) for c in ("a", "a", "b", "c")]
    await _settle()
    with pytest.raises(Busy, match=r"too many queries waiting \(3\)"):
        await ask("d")
    tasks[2].cancel()  # b's, waiting
    await _settle()
    assert queue.count == 2 and queue.waiting_for("b") == 0
    hold.set()
    await asyncio.gather(tasks[0], tasks[1], tasks[3])
    assert (queue.running, queue.count, dict(queue.waiting)) == (0, 0, {})
