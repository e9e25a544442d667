"""gpu_power_limit: set each of the target's GPUs to a power limit through NVML (a restore puts back the
saved ones). It slows the server without stopping it, so it takes a fleet slot and collects evidence."""

from __future__ import annotations

from collections.abc import Mapping

from ...config.yamlnodes import Node
from ..config import KindSpec, Traits
from ..pipeline.flows import FlowContext, Outcome
from ..pipeline.plans import Plan, execute_plan, guarded, plan_power
from .base import Act, Kind, register


def _watts(m: Mapping[str, Node], node: Node, values: dict[str, object]) -> None:
    """Exactly one of `watts` (absolute) or `ratio` (of the card's default limit)."""
    watts = m["watts"].number() if "watts" in m else None
    ratio = m["ratio"].number() if "ratio" in m else None
    if (watts is None) == (ratio is None):
        node.error("set exactly one of `watts` or `ratio`")
    if watts is not None and watts <= 0:
        m["watts"].error("must be greater than 0")
    if ratio is not None and not 0 < ratio <= 1:
        m["ratio"].error("must be in (0, 1]")
    values["power_limit_watts"], values["power_limit_ratio"] = watts, ratio


async def _plan(act: Act) -> Plan:
    async def made() -> Plan:
        return plan_power(act.action, act.target, act.store, act.power, act.restore)

    return await guarded(act.action, made())


async def _execute(act: Act, plan: Plan, ctx: FlowContext, action_id: int) -> Outcome:
    return await execute_plan(plan, act.action, ctx, action_id, act.store, act.power)


GPU_POWER_LIMIT = register(
    Kind(
        KindSpec(
            "gpu_power_limit",
            Traits(takes_fleet_slot=True, collects_evidence=True, needs_nvml=True),
            {"cooldown": 300.0},
            ("watts", "ratio"),
            _watts,
        ),
        _plan,
        _execute,
    )
)
