"""The supervision: a vLLM child that died on its own is started again, under the same rails as any restart
(in Docker and systemd mode only an engine death that exited 0, which their own restart policies miss); the
child of a target that left the config is stopped."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ...config.targets import TargetConfig
from ...errors import ActionError
from ..config import ActionConfig, Budget
from ..kinds.server import RESTART
from ..runtimes.exits import ExitStatus
from ..runtimes.process import ProcessRuntime
from ..runtimes.runtime import Runtime
from ..store.actionstore import ActionStore
from .decisions import Job

log = logging.getLogger("vllm_watchdog.actions.remediator")
RESPAWN = ActionConfig(
    name="respawn",
    type=RESTART.name,
    cooldown=0.0,
    max_per_window=Budget(5, 3600.0),
    startup_grace=0.0,
    backoff_initial=10.0,
    backoff_max=600.0,
    drain_timeout=0.0,
    stop_timeout=30.0,
)


async def respawn(target: TargetConfig, runtime: Runtime | None) -> Job | None:
    """The job that starts the target's server again if it exited on its own and nothing else will (the
    runtime's exit_status says: a process-mode child always; in Docker and systemd mode the crash that reads
    as a clean stop, see runtimes/exits.py); None while it runs, or for a runtime that cannot say.

    A crash counts as one whatever its status (vLLM's engine can die and the server exit 0): its respawn
    runs under RESPAWN's budget, backoff and crash-loop rails, and a respawn whose server is not ready
    within its ready_timeout is a failed start (the backoff rail spaces the next)."""
    exit_status = getattr(runtime, "exit_status", None)
    if not callable(exit_status):
        return None
    status: ExitStatus | None = await exit_status()
    if status is None or not status.respawn:
        return None
    code = "unknown" if status.code is None else str(status.code)
    how = status.describe()
    log.error("vLLM exited on its own", extra={"target": target.name, "exit_code": code, "exit": how})
    labels = {"target": target.name, "exit_code": code, "crash": str(status.crashed).lower(), "exit": how}
    return Job(RESPAWN, target, labels, "supervisor")


RETIRE_STOP_TIMEOUT = 90.0  # SIGTERM, then SIGKILL after this long (a restart's default stop_timeout)


async def retire_child(
    name: str,
    runtime: ProcessRuntime,
    store: ActionStore,
    clock: Callable[[], float],
    *,
    dry_run: bool,
    unrecordable: bool,
) -> None:
    """The target of a child the watchdog started left the config: stop the child (an audit row "retire"
    says so) rather than leave it running with nothing watching it. Where actions may not touch a server
    (dry run, paused, state_dir unwritable) it is left running, and the log says that nothing supervises
    it any more."""
    if not await runtime.is_running():
        await runtime.retire(0.0)  # no child: only its state file goes
        return
    why = (
        "dry_run is on"
        if dry_run
        else "actions are paused"
        if store.paused()[0]
        else "state_dir is not writable"
        if unrecordable
        else ""
    )
    if why:
        log.error(
            "the vLLM of a removed process-mode target is left running and nothing supervises it any more "
            "(stop it by hand, or add the target back)",
            extra={"target": name, "why": why},
        )
        return
    action_id = store.begin("retire", "stop", name, "reload", {"target": name}, False, clock())
    try:
        pid = await runtime.retire(RETIRE_STOP_TIMEOUT)
    except ActionError as exc:
        store.finish(action_id, "failed", clock(), str(exc))
        log.error("stopping the vLLM of a removed process-mode target failed", extra={"target": name})
        return
    reason = f"target {name} was removed from the config: its vLLM process {pid} was stopped"
    store.finish(action_id, "succeeded", clock(), reason)
    log.warning("stopped the vLLM of a removed process-mode target", extra={"target": name, "pid": pid})
