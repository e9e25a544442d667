"""recover: vLLM's own recovery first, a restart only where it cannot help.

Where the target runs with `--enable-fault-tolerance` and an engine reports itself `unhealthy` on
`GET /fault_tolerance/status` (its busy loop raised and it waits for an orchestrator:
runtimes/faulttolerance.py), the flow collects the incident's evidence, sends
`POST /fault_tolerance/apply {"instruction": "retry"}`, waits up to `retry_timeout` for every engine to
report healthy and for a canary token, and ends there: the weights stay loaded, which on a GPU saves the
minutes of a start. It restarts (the restart flow) when the server has no fault tolerance (404), no engine
is unhealthy (a hang the engine does not know of), one is `dead`, the retry fails or times out, or the
last successful retry of this action on the target ended less than `retry_window` ago (a fault that
repeats is not cured in place). Its traits are a restart's.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...config.durations import parse_duration
from ...config.yamlnodes import Node
from ...errors import ActionError
from ..config import Budget, KindSpec
from ..pipeline.flows import FlowContext, Outcome
from ..pipeline.plans import Plan, execute_plan, plan_restart
from ..runtimes.faulttolerance import FaultStatus, apply_retry, read_status
from .base import Act, Kind, register
from .server import STOPS_SERVER

ASK_TIMEOUT = 5.0  # the status is the API server's own cache: it answers at once unless the server hangs
POLL = 1.0
RETRIED = "retried"  # the step of a successful retry in place (what retry_window looks for)


def _durations(m: Mapping[str, Node], node: Node, values: dict[str, object]) -> None:
    """`retry_timeout` and `retry_window`, durations."""
    for key in ("retry_timeout", "retry_window"):
        if key in m:
            parsed = m[key].parsed(parse_duration)
            if parsed is not None:
                values[key] = parsed


async def _plan(act: Act) -> Plan:
    assert act.runtime is not None  # preflight: a restart kind needs one
    made = plan_restart(act.target, act.runtime)
    return Plan(made.kind, "retry unhealthy engines in place (vLLM fault tolerance), else " + made.describe)


def _retried_recently(act: Act, now: float) -> float | None:
    """When the last successful retry in place of this action on the target ended, if within retry_window."""
    a = act.action
    for run in act.store.history(8, act.target.name, a.name, dry_run=False, outcomes=("succeeded",)):
        ended = run.finished_at
        if any(s.step == RETRIED for s in run.steps) and ended is not None and now - ended < a.retry_window:
            return ended
    return None


async def _retry(act: Act, ctx: FlowContext, action_id: int, status: FaultStatus) -> str:
    """Retry in place; "" once every engine is healthy again and a canary generated, else why not."""
    client, url = ctx.ready.client, act.target.url
    await ctx.evidence()  # the bundle first: the engine's state before the retry changes it
    await ctx.enter(action_id, "retry", engines=list(status.with_status("unhealthy")))
    deadline = ctx.monotonic() + act.action.retry_timeout
    try:
        ctx.step(action_id, "retry_accepted", request_id=await apply_retry(client, url, ASK_TIMEOUT))
        while not status.healthy:
            if status.with_status("dead") or ctx.monotonic() + POLL > deadline:
                return f"the retry did not heal the engines: {status.describe()}"
            await ctx.sleep(POLL)
            status = await read_status(client, url, ASK_TIMEOUT) or FaultStatus(())
    except ActionError as exc:
        return f"the retry failed: {exc}"
    ok, why = await ctx.wait_ready(max(1.0, deadline - ctx.monotonic()))
    return "" if ok else f"healthy again, but not ready: {why}"


async def _execute(act: Act, plan: Plan, ctx: FlowContext, action_id: int) -> Outcome:
    try:
        status = await read_status(ctx.ready.client, act.target.url, ASK_TIMEOUT)
        found = "no fault tolerance (404)" if status is None else status.describe()
    except ActionError as exc:
        status, found = None, str(exc)
    ctx.step(action_id, "fault_status", found=found)
    unhealthy = status.with_status("unhealthy") if status is not None else ()
    why = "no engine reports itself unhealthy"
    if status is not None and unhealthy and not status.with_status("dead"):
        recent = _retried_recently(act, ctx.clock())
        why = "the fault repeats within retry_window of the last retry" if recent else ""
        why = why or await _retry(act, ctx, action_id, status)
        if not why:
            ctx.step(action_id, RETRIED, engines=list(unhealthy))
            return Outcome("succeeded", f"retried engine(s) {list(unhealthy)} in place: healthy and ready")
    ctx.step(action_id, "restart_instead", reason=why)
    return await execute_plan(plan, act.action, ctx, action_id, act.store, act.power)


RECOVER = register(
    Kind(
        KindSpec(
            "recover",
            STOPS_SERVER,
            # a cooldown shorter than retry_window, so that a fault that repeats is seen repeating
            {"cooldown": 60.0, "max_per_window": Budget(3, 6 * 3600.0)},
            ("retry_timeout", "retry_window"),
            _durations,
        ),
        _plan,
        _execute,
    )
)
