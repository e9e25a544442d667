"""What the remediator learns of a target before the rails decide: whether the action can act on it at all,
and when its server started (the start-up grace rail reads it)."""

from __future__ import annotations

import logging
from typing import Any

from ...config.targets import TargetConfig
from ...errors import ActionError
from ..config import ActionConfig
from ..runtimes.runtime import Runtime
from .gatewayactions import Gateway

log = logging.getLogger("vllm_watchdog.actions.remediator")


async def server_started_at(runtime: Runtime) -> float | None:
    """When the server started, for the start-up grace rail; unknown (None) if the runtime cannot tell."""
    try:
        return await runtime.started_at()
    except ActionError as exc:
        log.warning(
            "cannot tell when the server started", extra={"target": runtime.target, "error": str(exc)}
        )
        return None


def unsupported(
    action: ActionConfig,
    target: TargetConfig,
    runtime: Runtime | None,
    power: Any | None,
    gateway: Gateway | None,
) -> str:
    """Why the action cannot act on the target at all ("" if it can): no runtime, or one of the wrong kind,
    no NVML or no GPUs listed, no gateway in front (each as the kind's traits ask)."""
    traits = action.traits
    if traits.steers_gateway:
        return (
            "" if gateway is not None else f"no gateway in front of target {target.name} (config `gateway:`)"
        )
    if traits.needs_nvml:
        if power is None:
            return f"{action.type} needs NVML (gpus: {{nvml: true}})"
        return "" if target.gpus else f"target {target.name} lists no gpus"
    if not traits.needs_runtime:
        return ""
    if runtime is None:
        return f"target {target.name} names no container, command or unit to act on"
    if traits.relaunches and runtime.kind == "systemd":
        return f"{action.type} needs docker or process mode; systemd mode supports restart only"
    return ""
