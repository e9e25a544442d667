"""The disruptive flows: graceful restart, and relaunch with changed arguments (with rollback)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ... import failpoints
from ...config.targets import TargetConfig
from ...errors import ActionError
from ...integrity.verdict import Verdict, unknown
from ..config import traits_of
from ..runtimes.runtime import Launch, Runtime
from ..store.actionstore import ActionStore
from ..store.records import ActionRecord
from .progress import STALL_AFTER, Progress, no_progress, stalled_for

if TYPE_CHECKING:  # the readiness checks import the HTTP stack, which `check config` must not load
    from ..runtimes.readiness import ReadyCheck

log = logging.getLogger("vllm_watchdog.actions.flows")  # the name logs have always carried
DRAIN_POLL = 0.5
STALLED = "stalled"  # how the `drained` step's reason begins when nothing in flight could progress
STALLED_STOP_TIMEOUT = 5.0  # seconds from SIGTERM to SIGKILL for a server whose drain found it stalled


@dataclass(frozen=True)
class Outcome:
    """How a flow ended: "succeeded", "failed" or "rolled_back", and why."""

    outcome: str
    reason: str = ""
    details: dict[str, object] = field(default_factory=dict)


async def _no_gateway() -> int | None:
    return None


async def _no_evidence() -> None:
    return None


async def _no_answer_check() -> Verdict:
    return unknown("no known-answer check")


@dataclass
class FlowContext:
    """What a flow needs about one target."""

    store: ActionStore
    target: TargetConfig
    runtime: Runtime
    ready: ReadyCheck
    running_requests: Callable[[], float | None]  # the latest vllm:num_requests_running, None if unknown
    # Tells the gateway in front (if any) to hold new requests now, and returns what it still has in flight:
    # the drain flag reaches the gateway in the background, and its cached count can be a tick old.
    gateway_in_flight: Callable[[], Awaitable[int | None]] = _no_gateway
    # Whether what is in flight still moves (the engine's steps, the gateway's last answer): progress.py.
    progress: Callable[[], Progress] = no_progress
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    # Waits for the incident's evidence (within its budget) before the first step that stops or changes vLLM.
    evidence: Callable[[], Awaitable[None]] = _no_evidence
    # Checks the known answers now (after a restart or relaunch is ready, before traffic comes back): ok None
    # when it cannot tell (no baseline), which lets the flow go on.
    verify_answers: Callable[[], Awaitable[Verdict]] = _no_answer_check

    async def wait_ready(self, timeout: float) -> tuple[bool, str]:
        """Wait for /health and a canary; give up at once if the server process or container exited."""
        return await self.ready.wait(self.target, timeout, self.runtime.is_running)

    def step(self, action_id: int, name: str, **details: object) -> None:
        """Record a step in the audit log and the log."""
        self.store.step(action_id, name, self.clock(), details or None)
        log.info(
            "action step", extra={"action_id": action_id, "target": self.target.name, "step": name, **details}
        )

    async def enter(self, action_id: int, name: str, **details: object) -> None:
        """Record a step that begins a phase, then pass its failpoint (a chaos-test hook; see failpoints)."""
        self.step(action_id, name, **details)
        await failpoints.reach(name)


async def drain(ctx: FlowContext, action_id: int, timeout: float, stall_after: float = STALL_AFTER) -> str:
    """Stop admitting new requests, then wait up to `timeout` for running ones to finish, or until none of
    them can: no upstream byte and no engine step for `stall_after` seconds (progress.py; 0: never judged).

    Admission is the gateway's job; the drain flag lives in the state database so that the gateway, and a
    watchdog restarted mid-action, both see it. Without a gateway in front, vLLM keeps admitting; its own
    SIGTERM handling (`--shutdown-timeout`) then finishes what it holds.
    """
    ctx.store.set_drain(ctx.target.name, True, ctx.clock(), action_id)
    await ctx.enter(action_id, "drain")
    deadline = ctx.monotonic() + timeout
    running = await _running(ctx)
    ended = _drain_ended(ctx, running, stall_after)
    while not ended and ctx.monotonic() < deadline:
        await ctx.sleep(DRAIN_POLL)
        running = await _running(ctx)
        ended = _drain_ended(ctx, running, stall_after)
    ended = ended or f"timeout: still running after {timeout:g}s"
    ctx.step(action_id, "drained", running=running, ended=ended)
    return ended


def stop_timeout_after(ended: str, stop_timeout: float) -> float:
    """How long the stop waits after SIGTERM: a drain that ended stalled found an engine that moves nothing (a
    frozen EngineCore never handles SIGTERM, and its API server waits on it), so STALLED_STOP_TIMEOUT, then
    SIGKILL; a graceful stop has nothing left to finish there."""
    return min(stop_timeout, STALLED_STOP_TIMEOUT) if ended.startswith(STALLED) else stop_timeout


def _drain_ended(ctx: FlowContext, running: float | None, stall_after: float) -> str:
    """Why the drain may end now: nothing is known to run, all finished, or none can; "" to wait on."""
    if running is None:
        return "nothing known in flight (no gateway, no vllm:num_requests_running)"
    if running <= 0:
        return "all finished"
    idle = stalled_for(ctx.progress(), running) if stall_after > 0 else None
    if idle is not None and idle >= stall_after:
        return f"{STALLED}: no progress for {idle:.0f}s"
    return ""


async def _running(ctx: FlowContext) -> float | None:
    """What the target still serves: the larger of vLLM's gauge (it lags by a scrape) and the gateway's own
    count, asked of the gateway itself (a request it admitted a moment ago is in neither cached value)."""
    gauge = ctx.running_requests()
    in_flight = await ctx.gateway_in_flight()
    if in_flight is None:
        return gauge
    return float(in_flight) if gauge is None else max(gauge, float(in_flight))


def undrain(ctx: FlowContext, action_id: int) -> None:
    """Admit requests again, unless the target is quarantined (it stays drained until the quarantine ends)."""
    if ctx.target.name in ctx.store.quarantines():
        ctx.step(action_id, "kept_drained", reason="the target is quarantined")
        return
    ctx.store.set_drain(ctx.target.name, False, ctx.clock(), action_id)
    ctx.step(action_id, "undrain")


async def answers_wrong(ctx: FlowContext, action_id: int) -> str:
    """Check the known answers before traffic comes back (a `verify` step); why they are wrong, "" if they
    are right or nothing can tell (no baseline yet)."""
    verdict = await ctx.verify_answers()
    divergence = None if verdict.divergence != verdict.divergence else verdict.divergence  # nan: unknown
    ctx.step(action_id, "verify", ok=verdict.ok, divergence=divergence, reason=verdict.reason)
    if verdict.ok is not False:
        return ""
    return verdict.reason or "the known answers diverge"


def quarantine(ctx: FlowContext, action_id: int, why: str) -> None:
    """Keep the target drained and refuse every further action that stops its server, until its answers
    pass again or an operator lifts the quarantine."""
    ctx.store.quarantine(ctx.target.name, why, ctx.clock(), action_id)
    ctx.step(action_id, "quarantine", reason=why)
    log.error("target quarantined", extra={"target": ctx.target.name, "action_id": action_id, "reason": why})


async def restart(
    ctx: FlowContext,
    action_id: int,
    *,
    drain_timeout: float,
    stop_timeout: float,
    ready_timeout: float,
    stall_after: float = STALL_AFTER,
) -> Outcome:
    """Drain, stop, start, wait for /health and a canary, undrain."""
    try:
        ended = await drain(ctx, action_id, drain_timeout, stall_after)
        await ctx.evidence()
        stop_timeout = stop_timeout_after(ended, stop_timeout)
        await ctx.enter(action_id, "stop", timeout=stop_timeout)
        await ctx.runtime.stop(stop_timeout)
        await ctx.enter(action_id, "start")
        await ctx.runtime.start()
        await ctx.enter(action_id, "wait_ready", timeout=ready_timeout)
        ok, why = await ctx.wait_ready(ready_timeout)
        if not ok:
            return Outcome("failed", why)
        wrong = await answers_wrong(ctx, action_id)
        if wrong:
            quarantine(ctx, action_id, f"answers still wrong after a restart: {wrong}")
            return Outcome("failed", "answers still wrong after the restart: quarantined", {"answers": wrong})
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
    stall_after: float = STALL_AFTER,
) -> Outcome:
    """Replace the server with `new`; if it is not ready in time or its answers are wrong, roll back to the
    old one exactly."""
    try:
        ended = await drain(ctx, action_id, drain_timeout, stall_after)
        await ctx.evidence()
        # `argv`, not `args` (LogRecord's own attribute); reconcile reads it back to tell new from old
        await ctx.enter(action_id, "replace", argv=list(new.args))
        try:
            await ctx.runtime.replace(new, stop_timeout_after(ended, stop_timeout))
        except ActionError as exc:
            return await _roll_back(ctx, action_id, f"replace failed: {exc}", stop_timeout, ready_timeout)
        await ctx.enter(action_id, "wait_ready", timeout=ready_timeout)
        ok, why = await ctx.wait_ready(ready_timeout)
        if not ok:
            return await _roll_back(ctx, action_id, why, stop_timeout, ready_timeout)
        wrong = await answers_wrong(ctx, action_id)
        if wrong:
            why = f"answers wrong after the relaunch: {wrong}"
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
    await ctx.enter(action_id, "rollback", reason=why)
    if not await ctx.runtime.has_previous():
        return Outcome("failed", f"{why}; nothing to roll back to")
    await ctx.runtime.rollback(stop_timeout)
    ok, ready_why = await ctx.wait_ready(ready_timeout)
    if not ok:
        return Outcome("failed", f"{why}; rolled back, but the old server is not ready either: {ready_why}")
    wrong = await answers_wrong(ctx, action_id)
    if wrong:
        quarantine(ctx, action_id, f"answers wrong after a relaunch and after its rollback: {wrong}")
        wrong_too = "rolled back, but the old server's answers are wrong too: quarantined"
        return Outcome("failed", f"{why}; {wrong_too}")
    return Outcome("rolled_back", f"{why}; the old server is back and ready")


async def reconcile(
    ctx: FlowContext, action_id: int, *, stop_timeout: float, ready_timeout: float
) -> Outcome:
    """Finish or roll back an action a killed watchdog left in flight, then undrain.

    A relaunch ends `succeeded` only when the server runs the new command line (from its `replace` step)
    and is ready; one killed before its replacement ran is rolled back (`rolled_back`) or, if nothing was
    replaced yet, ends `failed` with the old server ready. A restart ends `succeeded` once its server is
    ready. A server found stopped, or that exits while it is checked (the killed watchdog had already asked
    it to stop), is started again. A server found ready has its known answers checked before it is
    undrained: wrong ones quarantine the target (the outcome is then `failed`).
    """
    try:
        outcome, ready = await _reconciled(ctx, action_id, stop_timeout, ready_timeout)
        wrong = await answers_wrong(ctx, action_id) if ready else ""
        if wrong:
            quarantine(ctx, action_id, f"answers wrong after a watchdog restart: {wrong}")
            return Outcome("failed", f"{outcome.reason}; but its answers are wrong: quarantined")
        return outcome
    except ActionError as exc:
        return Outcome("failed", f"after a watchdog restart: {exc}")
    finally:
        undrain(ctx, action_id)


async def _reconciled(
    ctx: FlowContext, action_id: int, stop_timeout: float, ready_timeout: float
) -> tuple[Outcome, bool]:
    """How the action left in flight ends, and whether the server is ready now."""
    record = next((r for r in ctx.store.unfinished() if r.id == action_id), None)
    argv = _replaced_argv(record)
    if await ctx.runtime.has_previous():
        settled = await _settle_replacement(ctx, action_id, argv, stop_timeout, ready_timeout)
        return settled, settled.outcome != "failed"
    if not await ctx.runtime.is_running():
        await ctx.enter(action_id, "reconcile", found="the server stopped")
        await ctx.runtime.start()
    else:
        await ctx.enter(action_id, "reconcile", found="the server running")
    ok, why = await _ready_or_start(ctx, action_id, ready_timeout)
    if not ok:
        return Outcome("failed", f"after a watchdog restart: {why}"), False
    if record is None or not traits_of(record.type).relaunches:
        return Outcome("succeeded", "finished after a watchdog restart: the server is ready"), True
    if argv is not None and await _current_args(ctx) == argv:
        return Outcome("succeeded", "finished after a watchdog restart: the replacement is ready"), True
    if any(s.step == "rollback" for s in record.steps):
        return Outcome("rolled_back", "after a watchdog restart: rolled back; the old server is ready"), True
    killed = (
        "after a watchdog restart: killed before the relaunch replaced anything; "
        "the server runs its old command line and is ready"
    )
    return Outcome("failed", killed), True


async def _settle_replacement(
    ctx: FlowContext, action_id: int, argv: tuple[str, ...] | None, stop_timeout: float, ready_timeout: float
) -> Outcome:
    """A replacement is pending: commit it if it is the new server and ready, else bring the old one back.

    The new server must be running under the name itself: with host networking the old one, stopping but
    not yet gone, still answers on the port, so readiness alone could commit a replacement that was never
    started (and remove the only server)."""
    running = await ctx.runtime.is_running()
    current = await _current_args(ctx)
    if running and (argv is None or current == argv):
        await ctx.enter(action_id, "reconcile", found="an uncommitted replacement, running")
        ok, why = await ctx.wait_ready(ready_timeout)
        if ok:
            await ctx.runtime.commit()
            ctx.step(action_id, "commit")
            return Outcome("succeeded", "finished after a watchdog restart: the replacement is ready")
        why = f"after a watchdog restart: {why}"
    else:
        found = "the old server running" if running else "the replacement not running"
        await ctx.enter(action_id, "reconcile", found=f"{found}, a replacement pending")
        why = "after a watchdog restart: the replacement was never started"
    await ctx.enter(action_id, "rollback", reason=why)
    await ctx.runtime.rollback(stop_timeout)
    ok, ready_why = await _ready_or_start(ctx, action_id, ready_timeout)
    if not ok:
        return Outcome("failed", f"{why}; rolled back, but the old server is not ready either: {ready_why}")
    return Outcome("rolled_back", f"{why}; the old server is back and ready")


async def _ready_or_start(ctx: FlowContext, action_id: int, ready_timeout: float) -> tuple[bool, str]:
    """Wait until ready; a server that exits meanwhile, as one the killed watchdog had already sent SIGTERM
    (or `docker stop`) does, is started once more and waited for again."""
    ok, why = await ctx.wait_ready(ready_timeout)
    if ok or await ctx.runtime.is_running():
        return ok, why
    await ctx.enter(action_id, "reconcile", found="the server exited while it was checked")
    await ctx.runtime.start()
    return await ctx.wait_ready(ready_timeout)


async def _current_args(ctx: FlowContext) -> tuple[str, ...] | None:
    """The command line the runtime now launches; None where it cannot tell (no container by the name)."""
    try:
        return (await ctx.runtime.launch()).args
    except ActionError:
        return None


def _replaced_argv(record: ActionRecord | None) -> tuple[str, ...] | None:
    """The new command line a relaunch recorded in its `replace` step; None if it never got there."""
    for step in reversed(record.steps if record is not None else ()):
        if step.step == "replace" and step.details and isinstance(step.details.get("argv"), list):
            return tuple(str(a) for a in step.details["argv"])
    return None
