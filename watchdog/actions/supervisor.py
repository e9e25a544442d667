"""Process mode's supervision: a vLLM child that died on its own is started again, under the same rails as
any restart."""

from __future__ import annotations

import logging

from ..config.targets import TargetConfig
from .audit import Job
from .config import ActionConfig, Budget
from .runtime import Runtime

log = logging.getLogger("vllm_watchdog.actions.remediator")
RESPAWN = ActionConfig(
    name="respawn",
    type="restart",
    cooldown=0.0,
    max_per_window=Budget(5, 3600.0),
    startup_grace=0.0,
    backoff_initial=10.0,
    backoff_max=600.0,
    drain_timeout=0.0,
    stop_timeout=30.0,
)


def respawn(target: TargetConfig, runtime: Runtime | None) -> Job | None:
    """The job that starts the target's child again if it exited on its own; None while it runs, or for a
    runtime that supervises no child."""
    exit_code = getattr(runtime, "exit_code", None)
    if not callable(exit_code):
        return None
    code = exit_code()
    if code is None:
        return None
    log.error("vLLM exited on its own", extra={"target": target.name, "exit_code": code})
    return Job(RESPAWN, target, {"target": target.name, "exit_code": str(code)}, "supervisor")
