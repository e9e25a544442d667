"""draft_schedule: relaunch vLLM with a draft length per batch size (`num_speculative_tokens_per_batch_size`)
where speculation pays at some batch sizes and costs at others. The schedule comes from the alert's `schedule`
label (VLLMSpecDecodeScheduleMistuned carries the one the goodput estimate calls for: sources/specgoodput.py);
the relaunch drains, collects evidence, checks the known answers and rolls back like every relaunch (the
traits of disable_draft). disable_draft stays for an acceptance collapse."""

from __future__ import annotations

from ...sources.specranges import schedule_from_text
from ..config import Budget, KindSpec
from ..pipeline.flows import FlowContext, Outcome
from ..pipeline.plans import Plan, execute_plan, guarded
from ..runtimes import speculative
from .base import Act, Kind, register
from .server import RELAUNCHES

SCHEDULE_LABEL = "schedule"
SPEC_KEY = "draft_schedule"


async def _plan(act: Act) -> Plan:
    return await guarded(act.action, plan_schedule(act))


async def plan_schedule(act: Act) -> Plan:
    """Relaunch with the alert's schedule; a skip where the label is missing or bad, the server runs without
    speculation, or it runs that schedule already (the same alert again does nothing: no flap)."""
    assert act.runtime is not None  # preflight: this kind needs one
    text = act.labels.get(SCHEDULE_LABEL, "")
    if not text:
        return Plan("none", "", skip=f"the alert has no `{SCHEDULE_LABEL}` label to relaunch with")
    schedule = schedule_from_text(text)  # ValueError: guarded makes it the skip reason
    current = await act.runtime.launch()
    config = speculative.read_config(current.args)
    if config is None:
        return Plan(
            "none", "", skip=f"{act.target.name} runs without speculative decoding: nothing to schedule"
        )
    if speculative.schedule_of(config) == schedule:
        return Plan("none", "", skip=f"{act.target.name} already runs the draft schedule {text}")
    new_args, dropped = speculative.with_schedule(current.args, schedule)
    describe = f"relaunch {act.target.name} with the draft schedule {text} (batch sizes:draft tokens)"
    if dropped:
        describe += f", without {', '.join(dropped)} (removed from vLLM)"
    return Plan("relaunch", describe, current.with_args(new_args), SPEC_KEY)


async def _execute(act: Act, plan: Plan, ctx: FlowContext, action_id: int) -> Outcome:
    return await execute_plan(plan, act.action, ctx, action_id, act.store, act.power)


DRAFT_SCHEDULE = register(
    Kind(
        KindSpec(
            "draft_schedule",
            RELAUNCHES,
            # a relaunch costs minutes of a GPU: at most one an hour and 4 a day, whatever the estimate says
            {"cooldown": 3600.0, "max_per_window": Budget(4, 24 * 3600.0), "startup_grace": 600.0},
        ),
        _plan,
        _execute,
    )
)
