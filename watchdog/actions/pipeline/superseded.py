"""The superseded gate: a job that would stop the server for a need another action has already cured.

An alert raised while an action had the server down (VLLMDown during a restart's stop, say) queues its own
restart behind the running action; when that action succeeds, the server it restarted is the cure, and the
queued job would only drain and restart a healthy, verified server again. A job whose need began before a
server-stopping action on the same target finished successfully is skipped on the `superseded` rail; a
fault that remains fires its alert anew, with a later start, and that job passes. Manual runs, restores and
a dead child's respawn are never superseded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...formats.rfc3339 import format_rfc3339, millis
from ..config import traits_of
from .rails import Verdict

if TYPE_CHECKING:
    from ..store.actionstore import ActionStore
    from .decisions import Job

SUPERSEDED_RAIL = "superseded"
_NEVER = frozenset({"manual", "restore", "supervisor"})
_LOOK_BACK = 10  # the newest successful actions on the target looked at


def superseded(job: Job, store: ActionStore) -> Verdict | None:
    """The skip verdict when a later-finished action that stopped the server already answered this need."""
    if not job.action.traits.stops_server or job.trigger in _NEVER or job.needed_at is None:
        return None
    need = job.needed_at
    done = store.history(_LOOK_BACK, job.target.name, dry_run=False, outcomes=("succeeded",), steps=False)
    for rec in done:
        if rec.finished_at is not None and rec.finished_at > need and _stops_server(rec.type):
            why = (
                f"superseded: {rec.action} (id {rec.id}) restarted {job.target.name} and finished at "
                f"{_at(rec.finished_at)}, after this need began at {_at(need)}; a fault that remains raises "
                "the alert again"
            )
            return Verdict(False, why, SUPERSEDED_RAIL)
    return None


def _stops_server(kind: str) -> bool:
    try:
        return traits_of(kind).stops_server
    except KeyError:  # a row of a kind this version no longer has
        return False


def _at(seconds: float, fmt: Callable[[int], str] = format_rfc3339) -> str:
    return fmt(millis(seconds))
