"""The collection: every part at once, each within its own timeout, all within one budget.

A part returns what it found (files for the bundle and a few facts for the manifest) or raises; a part that
raises, runs out of its time or is still running when the budget ends is recorded as such, and the rest are
kept. Nothing waits past the budget: parts still running are cancelled and left to finish in the background
(a thread blocked in a sick GPU's NVML call cannot be interrupted; its answer is then ignored).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...background import Background

Sleep = Callable[[float], Awaitable[None]]


class Absent(Exception):
    """What a part looks for is not there (no GPU, no log file, no journalctl): recorded as `absent`."""


@dataclass(frozen=True)
class Found:
    """What a part found: files for the bundle (name -> bytes) and facts for the manifest; `later`, files
    whose bytes are made when the bundle is written (in a worker thread, after the action went on): what the
    watchdog itself holds (its own samples, copied at once) need not hold up the stop."""

    files: Mapping[str, bytes] = field(default_factory=dict)
    facts: Mapping[str, Any] = field(default_factory=dict)
    later: Mapping[str, Callable[[], bytes]] = field(default_factory=dict)


@dataclass(frozen=True)
class Part:
    """One collector: `run` within `timeout` seconds (also cut at the collection's budget)."""

    name: str
    run: Callable[[], Awaitable[Found]]
    timeout: float


@dataclass(frozen=True)
class PartResult:
    """How a part ended, and in how long: "ok", "failed", "absent", "timeout" (its own) or "cut" (the
    collection's budget ran out)."""

    name: str
    status: str
    seconds: float
    error: str = ""
    found: Found = field(default_factory=Found)

    def json(self) -> dict[str, Any]:
        """The manifest's entry."""
        out: dict[str, Any] = {"name": self.name, "status": self.status, "seconds": round(self.seconds, 3)}
        if self.error:
            out["error"] = self.error
        if self.found.files or self.found.later:
            out["files"] = sorted({*self.found.files, *self.found.later})
        return out


class Collection:
    """Runs parts concurrently within a budget; `sleep` and `monotonic` are the clock (injected in tests)."""

    def __init__(self, sleep: Sleep, monotonic: Callable[[], float]) -> None:
        self.sleep = sleep
        self.monotonic = monotonic
        self.leftovers = Background()  # parts cut at the budget, until their cancellation completes

    async def run(self, parts: Sequence[Part], budget: float) -> list[PartResult]:
        """Every part's result, in the order given, after at most `budget` seconds."""
        began = self.monotonic()
        tasks = {p.name: asyncio.ensure_future(self._one(p, p.timeout)) for p in parts}
        timer = asyncio.ensure_future(self.sleep(budget))
        try:
            pending: set[asyncio.Future[Any]] = set(tasks.values())
            while pending and not timer.done():
                _, pending = await asyncio.wait(pending | {timer}, return_when=asyncio.FIRST_COMPLETED)
                pending.discard(timer)
        except asyncio.CancelledError:
            for task in tasks.values():
                task.cancel()
            raise
        finally:
            timer.cancel()
        results = []
        for part in parts:
            task = tasks[part.name]
            if task.done():
                results.append(task.result())
                continue
            task.cancel()
            self.leftovers.spawn(_settle(task), f"incident:cut:{part.name}")
            results.append(
                PartResult(part.name, "cut", self.monotonic() - began, f"cut at the {budget:g}s budget")
            )
        return results

    async def _one(self, part: Part, timeout: float) -> PartResult:
        began = self.monotonic()
        work = asyncio.ensure_future(part.run())
        timer = asyncio.ensure_future(self.sleep(timeout))
        try:
            await asyncio.wait({work, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            if not work.done():
                work.cancel()
                self.leftovers.spawn(_settle(work), f"incident:timeout:{part.name}")
        took = self.monotonic() - began
        if not work.done() or work.cancelled():
            return PartResult(part.name, "timeout", took, f"no answer within {timeout:g}s")
        exc = work.exception()
        if isinstance(exc, Absent):
            return PartResult(part.name, "absent", took, str(exc))
        if exc is not None:
            return PartResult(part.name, "failed", took, f"{type(exc).__name__}: {exc}"[:500])
        return PartResult(part.name, "ok", took, found=work.result())


async def _settle(task: asyncio.Future[Any]) -> None:
    """Wait for a cancelled part to finish, and retrieve whatever it ended with."""
    await asyncio.gather(task, return_exceptions=True)
