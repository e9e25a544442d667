"""The remediator's state as GET /api/v1/actions shows it."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ...config.model import Config
    from ...fleet.budget import DisruptionBudget
    from ...statehealth import StateHealth
    from ..store.actionstore import ActionStore
    from .decisions import Job
    from .rails import Rails
    from .retries import Retries
    from .selfalerts import WatchdogAlerts


class Remediation(Protocol):
    """What the status reads of the remediator (its parts, read-only)."""

    @property
    def config(self) -> Config: ...

    @property
    def store(self) -> ActionStore: ...

    @property
    def state(self) -> StateHealth | None: ...

    @property
    def rails(self) -> Rails: ...

    @property
    def alerts(self) -> WatchdogAlerts: ...

    @property
    def budget(self) -> DisruptionBudget: ...

    @property
    def retries(self) -> Retries: ...

    @property
    def current(self) -> dict[str, Job]: ...

    @property
    def queues(self) -> dict[str, deque[Job]]: ...


def actions_status(r: Remediation, now: float, limit: int) -> dict[str, Any]:
    """History, queues, drains, quarantines, pause, silences, budgets, own alerts, retries, the fleet."""
    paused, reason, since = r.store.paused()
    budgets = {
        f"{a.name}/{t.name}": r.rails.budget_left(a, t.name, now)
        for a in r.config.actions.values()
        for t in r.config.targets
        if a.max_per_window is not None
    }
    return {
        "status": "success",
        "data": {
            "dry_run": r.config.dry_run,
            "state": {
                "writable": r.state is None or r.state.writable,
                "problem": "" if r.state is None else r.state.problem,
            },
            "paused": {"paused": paused, "reason": reason, "since": since},
            "running": {t: j.action.name for t, j in r.current.items()},
            "queued": {t: [j.action.name for j in q] for t, q in r.queues.items() if q},
            "drained": r.store.drains(),
            "quarantined": {t: q.to_json() for t, q in r.store.quarantines().items()},
            "budgets_left": budgets,
            "silences": [s.to_json() for s in r.store.silences(now)],
            "watchdog_alerts": r.alerts.json(),
            "fleet": r.budget.json(),
            "retries": r.retries.json(r.config.targets, r.config.actions.values(), r.rails, now),
            "history": [r.to_json() for r in r.store.history(limit=limit)],
        },
    }
