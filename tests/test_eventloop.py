"""The long-running processes' loop: uvloop where it is installed (it is a dependency), asyncio's otherwise."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from vllm_watchdog import eventloop


def test_new_loops_are_uvloop_where_it_is_installed() -> None:
    loop = eventloop.new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_run_runs_the_coroutine_on_uvloop_and_returns_its_value() -> None:
    async def main() -> str:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__

    assert eventloop.run(main()).startswith("uvloop")


def test_without_uvloop_both_fall_back_to_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eventloop, "uvloop", None)
    loop = eventloop.new_event_loop()
    try:
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()

    async def main() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert eventloop.run(main()).startswith("asyncio")
