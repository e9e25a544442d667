"""Failpoints: a chaos-test hook that freezes an action's flow at a named step.

With `VLLM_WATCHDOG_FAILPOINT=<step>` in the watchdog's environment (a step name as the audit log records
it: `drain`, `stop`, `start`, `wait_ready`, `replace`, `rollback`, `reconcile`), a flow that reaches that
step records it as usual, logs `failpoint reached` and then waits forever, so that a test can `kill -9` the
watchdog at exactly that point and check what the next watchdog reconciles. Several steps may be given,
comma-separated. Unset (always, in production) it does nothing. The variable is read when a flow reaches a
step, never at import.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping

log = logging.getLogger(__name__)
ENV = "VLLM_WATCHDOG_FAILPOINT"


def armed(step: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the failpoint variable names `step`."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    return step in {s.strip() for s in value.split(",") if s.strip()}


async def reach(step: str, environ: Mapping[str, str] | None = None) -> None:
    """Return at once unless `step` is armed; if it is, log it and never return (the caller's task hangs
    until it is cancelled or the process is killed)."""
    if not armed(step, environ):
        return
    log.warning(
        "failpoint reached: the flow waits here until the watchdog is killed", extra={"failpoint": step}
    )
    await asyncio.Event().wait()
