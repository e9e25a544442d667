"""The kinds that steer the admission gateway in front of a target: throttle, throttle_session, drain,
undrain and quarantine. They are cheap and reversible and the gateway answers at once, so they never wait for
vLLM. A quarantine is a drain that stays (the quarantined rail then refuses restarts) until the target's
known answers pass again or an operator lifts it (pipeline/quarantines.py): drain-and-page for a watch-only
target."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ...config.durations import format_duration, parse_duration
from ...config.yamlnodes import Node
from ...gateway.config import ADAPTIVE_SIGNALS, ThrottleSpec
from ..config import ActionConfig, KindSpec, Traits
from ..pipeline.flows import FlowContext, Outcome
from ..pipeline.gatewayactions import Gateway, hold_key
from ..pipeline.plans import Plan
from .base import Act, Executor, Kind, register

DEFAULT_THROTTLE = ThrottleSpec(factor=0.5)  # a throttle action that says nothing else halves the cap
AGGREGATE_SESSIONS = frozenset({"other", "anonymous"})  # rows that stand for many sessions
GATEWAY = Traits(steers_gateway=True)
# A throttle is skipped when the gateway carried no request from this long before its alert began until now:
# the load that fired it does not go through the gateway, so a lower cap cannot relieve vLLM.
QUIET_BEFORE = 30.0
# A throttle may tighten again each minute the alert is resent; a re-firing alert is no crash loop (window 0).
QUICK = {"crash_loop_window": 0.0, "startup_grace": 0.0}
THROTTLE_KEYS = ("factor", "limit", "floor", "step", "step_interval", "adaptive", "target")


def _throttling(m: Mapping[str, Node], node: Node, values: dict[str, object]) -> None:
    """throttle: how the gateway's cap moves (`factor` or `limit`, `floor`, `step`, `adaptive`...)."""
    d = DEFAULT_THROTTLE
    factor = m["factor"].number() if "factor" in m else None
    limit = m["limit"].integer(minimum=1) if "limit" in m else None
    if factor is not None and limit is not None:
        node.error("set `factor` or `limit`, not both")
    if factor is not None and not 0 < factor < 1:
        m["factor"].error(f"must be between 0 and 1 (exclusive), got {factor}")
        factor = None
    floor = (m["floor"].integer(minimum=1) if "floor" in m else None) or d.floor
    step = (m["step"].integer(minimum=1) if "step" in m else None) or d.step
    interval = m["step_interval"].parsed(parse_duration) if "step_interval" in m else None
    if interval == 0:
        m["step_interval"].error("must be greater than 0")
    adaptive = m["adaptive"].string() if "adaptive" in m else None
    if adaptive is not None and adaptive not in ADAPTIVE_SIGNALS:
        m["adaptive"].error(f"must be one of {', '.join(ADAPTIVE_SIGNALS)}, got {adaptive!r}")
        adaptive = None
    target = m["target"].parsed(parse_duration) if "target" in m else None
    if target == 0:
        m["target"].error("must be greater than 0")
    if "target" in m and adaptive is None and "adaptive" not in m:
        m["target"].error("only applies with `adaptive`")
    if limit is not None and limit < floor:
        m["limit"].error(f"must not be below floor ({floor})")
    values["throttle"] = ThrottleSpec(
        factor=None if limit is not None else (factor or d.factor),
        limit=limit,
        floor=floor,
        step=step,
        step_interval=interval or d.step_interval,
        adaptive=adaptive,
        target=target or d.target,
    )


def _breaker(m: Mapping[str, Node], node: Node, values: dict[str, object]) -> None:
    """throttle_session: `duration`, `max_duration` (repeat offences double up to it), `reset_after`."""
    duration = m["duration"].parsed(parse_duration) if "duration" in m else None
    if duration == 0:
        m["duration"].error("must be greater than 0")
    values["breaker_duration"] = duration or None
    if "max_duration" in m:
        cap = m["max_duration"].parsed(parse_duration)
        if cap is not None and (cap == 0 or (duration and cap < duration)):
            m["max_duration"].error("must be greater than 0 and at least `duration`")
        elif cap is not None:
            values["breaker_max_duration"] = cap
    if "reset_after" in m:
        reset = m["reset_after"].parsed(parse_duration)
        if reset is not None:
            values["breaker_reset_after"] = reset


def _plan_throttle(action: ActionConfig, labels: Mapping[str, str], gateway: Gateway) -> Plan:
    t = action.throttle or DEFAULT_THROTTLE
    how = f"to {t.limit}" if t.limit is not None else f"by x{t.factor}"
    mode = f", following {t.adaptive} toward {format_duration(t.target)}" if t.adaptive else ""
    cap = gateway.cap()
    change = ""
    if cap is not None:  # what a dry run reports: the cap it would set
        after = t.lowered(cap)
        change = f": max_in_flight {cap} -> {after}" if after < cap else f": max_in_flight stays {cap}"
    return Plan(
        "gateway", f"lower the in-flight cap of {gateway.target} {how} (floor {t.floor}){mode}{change}"
    )


async def _plan_throttle_of(act: Act) -> Plan:
    """The throttle's plan, or a skip when no request went through the gateway during its alert."""
    gateway = act.gateway
    assert gateway is not None  # preflight: a gateway kind needs one
    since = None if act.needed_at is None else act.needed_at - QUIET_BEFORE
    if since is not None and gateway.traffic.carried_since(since) is False:
        return Plan(
            "none",
            "",
            skip=f"the gateway of {gateway.target} carried no request since {format_duration(QUIET_BEFORE)} "
            "before the alert began: its load bypasses the gateway, so lowering the cap cannot help",
        )
    return _plan_throttle(act.action, act.labels, gateway)


def _plan_breaker(action: ActionConfig, labels: Mapping[str, str], gateway: Gateway) -> Plan:
    session = labels.get("session", "")
    if not session:
        return Plan("none", "", skip="the alert has no `session` label")
    if session in AGGREGATE_SESSIONS:
        return Plan("none", "", skip=f"session {session!r} stands for many sessions; no breaker for it")
    duration = action.breaker_duration or gateway.breaker_default
    cap = max(duration, action.breaker_max_duration)
    doubled = f", doubled per repeat offence up to {format_duration(cap)}" if cap > duration else ""
    return Plan("gateway", f"open the breaker of session {session} for {format_duration(duration)}{doubled}")


def _plan_drain(action: ActionConfig, labels: Mapping[str, str], gateway: Gateway) -> Plan:
    verb = "hold new requests at" if action.type == DRAIN.name else "admit requests again at"
    return Plan("gateway", f"{verb} the gateway of {gateway.target}")


async def _throttle(act: Act, plan: Plan, ctx: FlowContext, action_id: int) -> Outcome:
    assert act.gateway is not None
    spec = act.action.throttle or DEFAULT_THROTTLE
    before, after = await act.gateway.throttle(hold_key(act.action, act.labels), spec)
    ctx.step(action_id, act.action.type, limit_before=before, limit=after)
    return Outcome("succeeded", f"in-flight cap {before} -> {after}", {"before": before, "limit": after})


async def _open_breaker(act: Act, plan: Plan, ctx: FlowContext, action_id: int) -> Outcome:
    action, gateway = act.action, act.gateway
    assert gateway is not None
    session = act.labels["session"]
    base = action.breaker_duration or gateway.breaker_default
    alert = act.labels.get("alertname", action.name)
    duration, offence = await gateway.open_breaker(
        session,
        base,
        f"alert {alert} fired for this session",
        max_duration=max(base, action.breaker_max_duration),
        reset_after=action.breaker_reset_after,
    )
    ctx.step(action_id, "breaker_open", session=session, seconds=duration, offence=offence)
    repeat = f" (repeat offence {offence})" if offence > 1 else ""
    return Outcome(
        "succeeded",
        f"breaker of session {session} open for {format_duration(duration)}{repeat}",
        {"seconds": duration, "offence": offence},
    )


async def _set_drain(act: Act, plan: Plan, ctx: FlowContext, action_id: int) -> Outcome:
    assert act.gateway is not None
    drained = act.action.type == DRAIN.name
    ctx.store.set_drain(ctx.target.name, drained, ctx.clock(), action_id)  # its hook tells the gateway
    ctx.step(action_id, act.action.type, in_flight=act.gateway.in_flight())
    return Outcome("succeeded", "drained" if drained else "undrained", {"in_flight": act.gateway.in_flight()})


GatewayPlanner = Callable[[ActionConfig, Mapping[str, str], Gateway], Plan]


def _kind(spec: KindSpec, planner: GatewayPlanner, execute: Executor) -> Kind:
    async def plan(act: Act) -> Plan:
        assert act.gateway is not None  # preflight: a gateway kind needs one
        return planner(act.action, act.labels, act.gateway)

    _PLANNERS[spec.name] = planner
    return register(Kind(spec, plan, execute))


_PLANNERS: dict[str, GatewayPlanner] = {}
THROTTLE = register(
    Kind(
        KindSpec(
            "throttle",
            Traits(steers_gateway=True, once_per_episode=True, holds_gateway_cap=True),
            {"cooldown": 60.0, **QUICK},
            THROTTLE_KEYS,
            _throttling,
        ),
        _plan_throttle_of,
        _throttle,
    )
)
_PLANNERS[THROTTLE.name] = _plan_throttle
THROTTLE_SESSION = _kind(
    KindSpec(
        "throttle_session",
        Traits(steers_gateway=True, once_per_episode=True, acts_on_session=True),
        {"cooldown": 0.0, **QUICK},
        ("duration", "max_duration", "reset_after"),
        _breaker,
    ),
    _plan_breaker,
    _open_breaker,
)
DRAIN = _kind(
    KindSpec("drain", Traits(steers_gateway=True, once_per_episode=True), {"cooldown": 0.0, **QUICK}),
    _plan_drain,
    _set_drain,
)


async def _plan_undrain(act: Act) -> Plan:
    assert act.gateway is not None  # preflight: a gateway kind needs one
    q = act.store.quarantines().get(act.target.name)
    if q is not None:  # a quarantine keeps the target drained until it is lifted
        return Plan("none", "", skip=f"{act.target.name} is quarantined ({q.reason}): lift the quarantine")
    return _plan_drain(act.action, act.labels, act.gateway)


UNDRAIN = register(Kind(KindSpec("undrain", GATEWAY, {"cooldown": 0.0, **QUICK}), _plan_undrain, _set_drain))
_PLANNERS[UNDRAIN.name] = _plan_drain


def _plan_quarantine(action: ActionConfig, labels: Mapping[str, str], gateway: Gateway) -> Plan:
    return Plan("gateway", f"quarantine {gateway.target}: hold its requests at the gateway until lifted")


async def _plan_quarantine_of(act: Act) -> Plan:
    assert act.gateway is not None  # preflight: a gateway kind needs one
    q = act.store.quarantines().get(act.target.name)
    if q is not None:
        return Plan("none", "", skip=f"{act.target.name} is quarantined already: {q.reason}")
    return _plan_quarantine(act.action, act.labels, act.gateway)


async def _quarantine(act: Act, plan: Plan, ctx: FlowContext, action_id: int) -> Outcome:
    assert act.gateway is not None
    why = f"alert {act.labels.get('alertname', act.action.name)} fired"
    # the quarantine sets the drain flag too, which the gateway follows
    ctx.store.quarantine(ctx.target.name, why, ctx.clock(), action_id)
    ctx.step(action_id, "quarantine", reason=why, in_flight=act.gateway.in_flight())
    return Outcome("succeeded", f"quarantined: {why}", {"in_flight": act.gateway.in_flight()})


QUARANTINE = register(
    Kind(
        KindSpec(
            "quarantine",
            Traits(steers_gateway=True, once_per_episode=True),
            {"cooldown": 0.0, **QUICK},
        ),
        _plan_quarantine_of,
        _quarantine,
    )
)
_PLANNERS[QUARANTINE.name] = _plan_quarantine


def plan_gateway(action: ActionConfig, labels: Mapping[str, str], gateway: Gateway) -> Plan:
    """Decide what a gateway action does; a skip says why it cannot."""
    return _PLANNERS[action.type](action, labels, gateway)
