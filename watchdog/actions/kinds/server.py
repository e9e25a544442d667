"""The kinds that stop the server: restart, and the relaunches with changed arguments (disable_draft,
enable_draft, reconfigure). They run one at a time per target, take a fleet slot and collect evidence."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ...config.yamlnodes import Node
from ..config import DRAFT_FLAGS, Budget, KindSpec, Traits, long_flag
from ..pipeline.flows import FlowContext, Outcome
from ..pipeline.plans import DRAFT_KEY, Plan, execute_plan, guarded, plan_relaunch, plan_restart
from .base import Act, Kind, Planner, register

STOPS_SERVER = Traits(
    stops_server=True,
    one_at_a_time_per_target=True,
    needs_startup_grace=True,
    allowed_while_paused_or_asleep=False,  # a quiet engine paused on purpose is not a hung one
    needs_writable_state=True,
    takes_fleet_slot=True,
    collects_evidence=True,
    needs_runtime=True,
)
RELAUNCHES = replace(STOPS_SERVER, relaunches=True)


def _reconfigure(m: Mapping[str, Node], node: Node, values: dict[str, object]) -> None:
    """reconfigure: `set` (flag -> value, null: bare) and `remove` (flags), at least one of them."""
    sets: dict[str, str | None] = {}
    if "set" in m:
        for flag, child in (m["set"].mapping() or {}).items():
            if long_flag(child, flag) is not None:
                sets[flag] = None if child.is_null() else child.scalar()
    removes = (
        tuple(f for f in (m["remove"].string_list() or []) if long_flag(m["remove"], f))
        if "remove" in m
        else ()
    )
    if not sets and not removes:
        node.error("a reconfigure action needs `set` or `remove`")
    values["set_args"], values["remove_args"] = sets, removes


async def _plan_restart(act: Act) -> Plan:
    assert act.runtime is not None  # preflight: these kinds need one
    return plan_restart(act.target, act.runtime)


def _relaunch(key: str | None, touched: tuple[str, ...] | None, *, always_restores: bool = False) -> Planner:
    """A relaunch's planner: its spec key (None: one per action) and the flags a restore puts back (None:
    the action's own); it restores on every run (enable_draft) or only after its alert resolved."""

    async def plan(act: Act) -> Plan:
        assert act.runtime is not None  # preflight: these kinds need one
        a = act.action
        spec_key = key if key is not None else f"reconfigure:{a.name}"
        flags = touched if touched is not None else (*a.remove_args, *a.set_args)
        made = plan_relaunch(
            a,
            act.target,
            act.runtime,
            act.store,
            restore=always_restores or act.restore,
            key=spec_key,
            touched=flags,
        )
        return await guarded(a, made)

    return plan


async def _execute(act: Act, plan: Plan, ctx: FlowContext, action_id: int) -> Outcome:
    return await execute_plan(plan, act.action, ctx, action_id, act.store, act.power)


RESTART = register(
    Kind(
        KindSpec("restart", STOPS_SERVER, {"cooldown": 900.0, "max_per_window": Budget(3, 6 * 3600.0)}),
        _plan_restart,
        _execute,
    )
)
DISABLE_DRAFT = register(
    Kind(
        KindSpec("disable_draft", RELAUNCHES, {"cooldown": 3600.0, "remove_args": DRAFT_FLAGS}),
        _relaunch(DRAFT_KEY, DRAFT_FLAGS),
        _execute,
    )
)
ENABLE_DRAFT = register(
    Kind(
        KindSpec("enable_draft", RELAUNCHES, {"cooldown": 0.0}),
        _relaunch(DRAFT_KEY, DRAFT_FLAGS, always_restores=True),
        _execute,
    )
)
RECONFIGURE = register(
    Kind(
        KindSpec("reconfigure", RELAUNCHES, {"cooldown": 900.0}, ("set", "remove"), _reconfigure),
        _relaunch(None, None),
        _execute,
    )
)
