"""The query child: whatever its work does (answers, crashes, hangs, writes too much, allocates too much,
signals itself), the parent gets an answer or a ChildFailed, reaps the child, and its own loop hears nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import pytest

from vllm_watchdog.api.querychild import Answer, ChildFailed, ChildLimits, frame, spawn, unframe

LIMITS = ChildLimits(seconds=0.5, max_bytes=4096, memory=256 << 20, cpu_seconds=2)


def _children() -> list[str]:
    """This process's children that still exist (zombies included), from /proc."""
    me = str(os.getpid())
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    if stat.read().rsplit(")", 1)[1].split()[1] == me:
                        found.append(pid)
            except OSError:
                pass
    return found


async def _failure(work: Callable[[], Answer], limits: ChildLimits = LIMITS) -> ChildFailed:
    with pytest.raises(ChildFailed) as failed:
        await spawn(work, limits).answer()
    return failed.value


def _abort() -> Answer:
    os.abort()


def _hang() -> Answer:
    time.sleep(60)
    return Answer(200, b"late")


def _allocate() -> Answer:
    return Answer(200, bytes(1 << 30))


def _fail() -> Answer:
    raise RuntimeError("a bug")


def test_a_frame_is_whole_or_nothing() -> None:
    raw = frame(Answer(422, b'{"a": 1}'))
    assert unframe(raw) == Answer(422, b'{"a": 1}')
    assert all(unframe(raw[:n]) is None for n in range(len(raw)))
    assert unframe(b"x" * 40) is None


async def _reaped(before: set[str]) -> set[str]:
    """The children started since `before` that are still there, once the loop has had time to reap them
    (a killed one exits a moment after its SIGKILL)."""
    for _ in range(100):
        if not set(_children()) - before:
            break
        await asyncio.sleep(0.01)
    return set(_children()) - before


@pytest.mark.anyio
async def test_the_answer_comes_back_and_every_failure_is_named_and_reaped() -> None:
    before = set(_children())  # other tests' children, whose loops closed before they were reaped
    assert await spawn(lambda: Answer(200, b"[1]"), LIMITS).answer() == Answer(200, b"[1]")
    crashed = await _failure(_abort)
    assert (crashed.kind, crashed.message) == ("crashed", "the query's process died (killed by SIGABRT)")
    assert (await _failure(_fail)).message == "the query's process died (exit status 70)"
    assert (await _failure(_hang)).kind == "timeout"
    assert (await _failure(lambda: Answer(200, b"x" * 5000))).kind == "too_large"
    assert (await _failure(_allocate)).kind == "memory"
    assert await spawn(lambda: Answer(200, b"[2]"), LIMITS).answer() == Answer(200, b"[2]")
    assert await _reaped(before) == set()


@pytest.mark.anyio
async def test_a_signal_to_the_child_never_reaches_the_parents_loop() -> None:
    loop = asyncio.get_running_loop()
    heard: list[int] = []
    loop.add_signal_handler(signal.SIGUSR1, heard.append, 1)
    try:

        def signal_self() -> Answer:
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(1)
            return Answer(200, b"survived")

        failed = await _failure(signal_self)
        assert failed.message == "the query's process died (killed by SIGUSR1)"
        await asyncio.sleep(0.1)  # a byte on the loop's wakeup socket would be read by now
        assert heard == []
        os.kill(os.getpid(), signal.SIGUSR1)  # the parent's own handler still works
        await asyncio.sleep(0.1)
        assert heard == [1]
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)


@pytest.mark.anyio
async def test_a_cancelled_wait_kills_and_reaps_the_child() -> None:
    before = set(_children())
    task = asyncio.ensure_future(spawn(_hang, ChildLimits(seconds=30)).answer())
    await asyncio.sleep(0.05)
    assert len(set(_children()) - before) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _reaped(before) == set()
