"""The actions that steer the admission gateway: throttle, throttle_session, drain and undrain."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Protocol

from ..config.durations import format_duration
from ..gateway.config import ThrottleSpec
from .config import DEFAULT_THROTTLE, ActionConfig
from .flows import FlowContext, Outcome
from .plans import Plan

AGGREGATE_SESSIONS = frozenset({"other", "anonymous"})  # rows that stand for many sessions


class Gateway(Protocol):
    """What these actions need from the gateway in front of a target."""

    target: str
    breaker_default: float

    async def throttle(self, key: str, spec: ThrottleSpec) -> tuple[int, int]: ...

    def release(self, key: str) -> None: ...

    def keep(self, key: str) -> bool: ...

    async def open_breaker(
        self,
        session: str,
        duration: float,
        reason: str,
        *,
        max_duration: float | None = None,
        reset_after: float = 0.0,
    ) -> tuple[float, int]: ...

    def in_flight(self) -> int: ...

    async def set_drain(self, drained: bool) -> None: ...


def hold_key(action: ActionConfig, labels: Mapping[str, str]) -> str:
    """One throttle hold per action and alert: a second alert resolving does not lift the first one's hold."""
    text = "\0".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("action", "trigger"))
    return f"{action.name}/{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def plan_gateway(action: ActionConfig, labels: Mapping[str, str], gateway: Gateway) -> Plan:
    """Decide what a gateway action does; a skip says why it cannot."""
    if action.type == "throttle":
        t = action.throttle or DEFAULT_THROTTLE
        how = f"to {t.limit}" if t.limit is not None else f"by x{t.factor}"
        mode = f", following {t.adaptive} toward {format_duration(t.target)}" if t.adaptive else ""
        return Plan("gateway", f"lower the in-flight cap of {gateway.target} {how} (floor {t.floor}){mode}")
    if action.type == "throttle_session":
        session = labels.get("session", "")
        if not session:
            return Plan("none", "", skip="the alert has no `session` label")
        if session in AGGREGATE_SESSIONS:
            return Plan("none", "", skip=f"session {session!r} stands for many sessions; no breaker for it")
        duration = action.breaker_duration or gateway.breaker_default
        cap = max(duration, action.breaker_max_duration)
        doubled = f", doubled per repeat offence up to {format_duration(cap)}" if cap > duration else ""
        return Plan(
            "gateway", f"open the breaker of session {session} for {format_duration(duration)}{doubled}"
        )
    verb = "hold new requests at" if action.type == "drain" else "admit requests again at"
    return Plan("gateway", f"{verb} the gateway of {gateway.target}")


async def execute_gateway(
    action: ActionConfig, labels: Mapping[str, str], gateway: Gateway, ctx: FlowContext, action_id: int
) -> Outcome:
    """Carry out a gateway action; the gateway answers at once, so these never wait for vLLM."""
    if action.type == "throttle":
        before, after = await gateway.throttle(hold_key(action, labels), action.throttle or DEFAULT_THROTTLE)
        ctx.step(action_id, "throttle", limit_before=before, limit=after)
        return Outcome("succeeded", f"in-flight cap {before} -> {after}", {"before": before, "limit": after})
    if action.type == "throttle_session":
        session = labels["session"]
        base = action.breaker_duration or gateway.breaker_default
        alert = labels.get("alertname", action.name)
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
    drained = action.type == "drain"
    ctx.store.set_drain(
        ctx.target.name, drained, ctx.clock(), action_id
    )  # the store's hook tells the gateway
    ctx.step(action_id, action.type, in_flight=gateway.in_flight())
    return Outcome("succeeded", "drained" if drained else "undrained", {"in_flight": gateway.in_flight()})
