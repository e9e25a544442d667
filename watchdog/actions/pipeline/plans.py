"""What an action will do to a target, decided before anything is touched (and all a dry run reports)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from ...config.targets import TargetConfig
from ...errors import ActionError
from ..config import ActionConfig
from ..runtimes import args as vllm_args
from ..runtimes import speculative
from ..runtimes.runtime import Launch, Runtime
from ..store.actionstore import ActionStore
from .flows import FlowContext, Outcome, relaunch, restart

DRAFT_KEY = "draft"


@dataclass(frozen=True)
class Plan:
    """A decided action: `kind` the flow that carries it out ("restart" | "relaunch" | "power" | "gateway");
    `skip` set when there is nothing to do."""

    kind: str
    describe: str
    new: Launch | None = None
    spec_key: str = ""
    save: Launch | None = None  # the original launch, saved before the first change
    drop_spec: bool = False  # a restore: the saved launch is no longer needed once it succeeds
    power: dict[int, float] = field(default_factory=dict)  # gpu index -> watts to set
    power_restore: bool = False
    skip: str = ""


def _apply(action: ActionConfig, args: list[str]) -> list[str]:
    out = vllm_args.remove_args(args, action.remove_args)
    return vllm_args.set_args(out, dict(action.set_args)) if action.set_args else out


async def guarded(action: ActionConfig, plan: Awaitable[Plan]) -> Plan:
    """A kind's plan; raises nothing for target faults (an ActionError becomes a skip reason)."""
    try:
        return await plan
    except (ActionError, ValueError) as exc:
        return Plan("none", "", skip=f"cannot plan {action.name}: {exc}")


async def plan_relaunch(
    action: ActionConfig,
    target: TargetConfig,
    runtime: Runtime,
    store: ActionStore,
    *,
    restore: bool,
    key: str,
    touched: tuple[str, ...],
) -> Plan:
    """Relaunch with the action's changes applied, saving the original launch under `key`; or, to restore,
    put back the flags `touched` as the saved launch had them."""
    current = await runtime.launch()
    saved_text = store.load_spec(target.name, key)
    if restore:
        if saved_text is None:
            return Plan("none", "", skip=f"nothing saved under {key!r} to restore")
        original = Launch.from_json(saved_text)
        new_args = vllm_args.restore_args(list(current.args), list(original.args), touched)
        speculative.refuse_removed(new_args)  # a launch vLLM would refuse: a skip with the reason (guarded)
        if new_args == list(current.args):
            return Plan("none", "", spec_key=key, skip="already as originally launched")
        return Plan(
            "relaunch",
            f"relaunch {target.name} with {_diff(current.args, new_args)}",
            current.with_args(new_args),
            key,
            drop_spec=True,
        )
    new_args = _apply(action, list(current.args))
    speculative.refuse_removed(new_args)
    if new_args == list(current.args):
        return Plan(
            "none", "", skip=f"already applied: {target.name} runs without the changes of {action.name}"
        )
    return Plan(
        "relaunch",
        f"relaunch {target.name} with {_diff(current.args, new_args)}",
        current.with_args(new_args),
        key,
        save=None if saved_text is not None else current,
    )


def _diff(old: tuple[str, ...] | list[str], new: list[str]) -> str:
    removed = [a for a in old if a not in new]
    added = [a for a in new if a not in old]
    parts = []
    if removed:
        parts.append("without " + " ".join(removed))
    if added:
        parts.append("with " + " ".join(added))
    return "; ".join(parts) or "the same arguments"


def plan_power(
    action: ActionConfig, target: TargetConfig, store: ActionStore, power: Any, restore: bool
) -> Plan:
    """Set each GPU's power limit (watts, or a ratio of its default); restore: put back the saved ones."""
    watts: dict[int, float] = {}
    for index in target.gpus:
        key = f"power/{target.name}/{index}"
        saved = store.get(key)
        if restore:
            if isinstance(saved, (int, float)):
                watts[index] = float(saved)
            continue
        if action.power_limit_watts is not None:
            watts[index] = action.power_limit_watts
        else:
            watts[index] = float(power.default(index)) * float(action.power_limit_ratio or 1.0)
    if not watts:
        return Plan("none", "", skip="no saved power limits to restore" if restore else "no gpus")
    verb = "restore" if restore else "set"
    text = ", ".join(f"GPU {i} to {w:.0f} W" for i, w in sorted(watts.items()))
    return Plan("power", f"{verb} the power limit of {text}", power=watts, power_restore=restore)


def plan_restart(target: TargetConfig, runtime: Runtime) -> Plan:
    """A graceful restart of the server."""
    return Plan("restart", f"restart {target.name} ({runtime.kind})")


async def execute_plan(
    plan: Plan, action: ActionConfig, ctx: FlowContext, action_id: int, store: ActionStore, power: Any
) -> Outcome:
    """Carry out a plan, saving what a later restore needs before the first change."""
    timeouts = {
        "drain_timeout": action.drain_timeout,
        "stop_timeout": action.stop_timeout,
        "ready_timeout": action.ready_timeout,
        "stall_after": action.stall_after,
    }
    if plan.kind == "restart":
        return await restart(ctx, action_id, **timeouts)
    if plan.kind == "power":
        return await _set_power(plan, ctx, action_id, store, power)
    assert plan.new is not None
    if plan.save is not None:
        store.save_spec(ctx.target.name, plan.spec_key, plan.save.to_json(), ctx.clock())
    outcome = await relaunch(ctx, action_id, plan.new, **timeouts)
    if outcome.outcome == "succeeded" and plan.drop_spec:
        store.drop_spec(ctx.target.name, plan.spec_key)
    return outcome


async def _set_power(plan: Plan, ctx: FlowContext, action_id: int, store: ActionStore, power: Any) -> Outcome:
    """Set (or restore) each GPU's limit; NVML calls can block on a sick GPU, so they run in a thread."""
    applied: dict[str, object] = {}
    await ctx.evidence()
    try:
        for index, watts in sorted(plan.power.items()):
            key = f"power/{ctx.target.name}/{index}"
            if not plan.power_restore and store.get(key) is None:
                store.put(
                    key, float(await asyncio.to_thread(power.current, index))
                )  # the original, for the restore
            applied[str(index)] = await asyncio.to_thread(power.set_limit, index, watts)
            ctx.step(action_id, "power_limit", gpu=index, watts=applied[str(index)])
            if plan.power_restore:
                store.put(key, None)
    except ActionError as exc:
        return Outcome("failed", str(exc), {"applied": applied})
    return Outcome("succeeded", plan.describe, {"applied": applied})
