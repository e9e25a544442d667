"""The disruptive flows: graceful restart, and relaunch with changed arguments (with rollback)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..config import TargetConfig
from ..errors import ActionError
from .readiness import ReadyCheck
from .runtime import Launch, Runtime
from .state import ActionStore

log = logging.getLogger(__name__)
DRAIN_POLL = 0.5


@dataclass(frozen=True)
class Outcome:
    """How a flow ended: "succeeded", "failed" or "rolled_back", and why."""

    outcome: str
    reason: str = ""
    details: dict[str, object] = field(default_factory=dict)


@dataclass
class FlowContext:
    """What a flow needs about one target."""

    store: ActionStore
    target: TargetConfig
    runtime: Runtime
    ready: ReadyCheck
    running_requests: Callable[[], float | None]  # the latest vllm:num_requests_running, None if unknown
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def wait_ready(self, timeout: float) -> tuple[bool, str]:
        """Wait for /health and a canary; give up at once if the server process or container exited."""
        return await self.ready.wait(self.target, timeout, self.runtime.is_running)

    def step(self, action_id: int, name: str, **details: object) -> None:
        """Record a step in the audit log and the log."""
        self.store.step(action_id, name, self.clock(), details or None)
        log.info(
            "action step", extra={"action_id": action_id, "target": self.target.name, "step": name, **details}
        )


async def drain(ctx: FlowContext, action_id: int, timeout: float) -> None:
    """Stop admitting new requests, then wait up to `timeout` for running ones to finish.

    Admission is the gateway's job; the drain flag lives in the state database so that the gateway, and a
    watchdog restarted mid-action, both see it. Without a gateway in front, vLLM keeps admitting; its own
    SIGTERM handling (`--shutdown-timeout`) then finishes what it holds.
    """
    ctx.store.set_drain(ctx.target.name, True, ctx.clock(), action_id)
    ctx.step(action_id, "drain")
    deadline = ctx.monotonic() + timeout
    running = ctx.running_requests()
    while running is not None and running > 0 and ctx.monotonic() < deadline:
        await ctx.sleep(DRAIN_POLL)
        running = ctx.running_requests()
    ctx.step(action_id, "drained", running=running)


def undrain(ctx: FlowContext, action_id: int) -> None:
    """Admit requests again."""
    ctx.store.set_drain(ctx.target.name, False, ctx.clock(), action_id)
    ctx.step(action_id, "undrain")


async def restart(
    ctx: FlowContext, action_id: int, *, drain_timeout: float, stop_timeout: float, ready_timeout: float
) -> Outcome:
    """Drain, stop, start, wait for /health and a canary, undrain."""
    try:
        await drain(ctx, action_id, drain_timeout)
        ctx.step(action_id, "stop", timeout=stop_timeout)
        await ctx.runtime.stop(stop_timeout)
        ctx.step(action_id, "start")
        await ctx.runtime.start()
        ctx.step(action_id, "wait_ready", timeout=ready_timeout)
        ok, why = await ctx.wait_ready(ready_timeout)
        if not ok:
            return Outcome("failed", why)
        return Outcome("succeeded", "restarted and ready")
    except ActionError as exc:
        return Outcome("failed", str(exc))
    finally:
        undrain(ctx, action_id)


async def relaunch(
    ctx: FlowContext,
    action_id: int,
    new: Launch,
    *,
    drain_timeout: float,
    stop_timeout: float,
    ready_timeout: float,
) -> Outcome:
    """Replace the server with `new`; if it is not ready in time, roll back to the old one exactly."""
    try:
        await drain(ctx, action_id, drain_timeout)
        ctx.step(action_id, "replace", argv=list(new.args))  # not `args`: LogRecord's own attribute
        try:
            await ctx.runtime.replace(new, stop_timeout)
        except ActionError as exc:
            return await _roll_back(ctx, action_id, f"replace failed: {exc}", stop_timeout, ready_timeout)
        ctx.step(action_id, "wait_ready", timeout=ready_timeout)
        ok, why = await ctx.wait_ready(ready_timeout)
        if not ok:
            return await _roll_back(ctx, action_id, why, stop_timeout, ready_timeout)
        await ctx.runtime.commit()
        ctx.step(action_id, "commit")
        return Outcome("succeeded", "relaunched and ready")
    except ActionError as exc:
        return Outcome("failed", str(exc))
    finally:
        undrain(ctx, action_id)


async def _roll_back(
    ctx: FlowContext, action_id: int, why: str, stop_timeout: float, ready_timeout: float
) -> Outcome:
    ctx.step(action_id, "rollback", reason=why)
    if not await ctx.runtime.has_previous():
        return Outcome("failed", f"{why}; nothing to roll back to")
    await ctx.runtime.rollback(stop_timeout)
    ok, ready_why = await ctx.wait_ready(ready_timeout)
    if not ok:
        return Outcome("failed", f"{why}; rolled back, but the old server is not ready either: {ready_why}")
    return Outcome("rolled_back", f"{why}; the old server is back and ready")


async def reconcile(
    ctx: FlowContext, action_id: int, *, stop_timeout: float, ready_timeout: float
) -> Outcome:
    """Finish or roll back an action a killed watchdog left in flight, then undrain."""
    try:
        if await ctx.runtime.has_previous():
            ctx.step(action_id, "reconcile", found="an uncommitted replacement")
            ok, why = await ctx.wait_ready(ready_timeout)
            if ok:
                await ctx.runtime.commit()
                return Outcome("succeeded", "finished after a watchdog restart: the replacement is ready")
            return await _roll_back(
                ctx, action_id, f"after a watchdog restart: {why}", stop_timeout, ready_timeout
            )
        if not await ctx.runtime.is_running():
            ctx.step(action_id, "reconcile", found="the server stopped")
            await ctx.runtime.start()
        else:
            ctx.step(action_id, "reconcile", found="the server running")
        ok, why = await ctx.wait_ready(ready_timeout)
        if ok:
            return Outcome("succeeded", "finished after a watchdog restart: the server is ready")
        return Outcome("failed", f"after a watchdog restart: {why}")
    except ActionError as exc:
        return Outcome("failed", f"after a watchdog restart: {exc}")
    finally:
        undrain(ctx, action_id)
