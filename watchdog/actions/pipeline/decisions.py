"""The record of every decision: audit-log rows, counters, log lines and action events for webhooks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...config.targets import TargetConfig
from ...notifiers.hub import ActionEvent, NotificationHub
from ..config import ActionConfig
from ..store.actionstore import ActionStore

log = logging.getLogger("vllm_watchdog.actions.remediator")
SKIP_REPEAT = 600.0  # a skip for the same rail is written to the audit log at most this often


@dataclass
class Job:
    """One action to run on one target."""

    action: ActionConfig
    target: TargetConfig
    labels: Mapping[str, str]
    trigger: str  # "alert" | "inbound" | "manual" | "supervisor" | "restore" | "retry"
    restore: bool = False
    needed_at: float | None = None  # when the need began (the alert's start): a crash loop is a *new* need
    until: float | None = None  # the alert's endsAt: a failed run is retried until then (None: resolved)
    done: asyncio.Future[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def key(self) -> tuple[str, bool, str]:
        """Jobs with the same key merge while one waits or runs; a session breaker is per session."""
        session = self.labels.get("session", "") if self.action.traits.acts_on_session else ""
        return (self.action.name, self.restore, session)


class Audit:
    """Writes decisions to the audit log, counts them, logs them and tells the webhooks."""

    def __init__(
        self, store: ActionStore, hub: NotificationHub | None, dry: Callable[[ActionConfig], bool]
    ) -> None:
        self.store = store
        self.hub = hub
        self.dry = dry
        self.counts: dict[tuple[str, str, str], int] = {}  # (action, target, outcome) -> n
        self._last_skip: dict[tuple[str, str], tuple[str, float]] = {}
        self._last_refusal: dict[tuple[str, str], tuple[str, float]] = {}

    def count(self, action: str, target: str, outcome: str) -> None:
        """One more decision of this outcome."""
        key = (action, target, outcome)
        self.counts[key] = self.counts.get(key, 0) + 1

    def forget(self, target: str) -> None:
        """A target removed: its counts go (a discovery that comes and goes must not grow them forever)."""
        for counted in [k for k in self.counts if k[1] == target]:
            del self.counts[counted]
        for last in (self._last_skip, self._last_refusal):
            for key in [k for k in last if k[1] == target]:
                del last[key]

    def _record(self, job: Job, outcome: str, reason: str, dry: bool, now: float) -> None:
        a = job.action
        self.store.record(
            a.name,
            a.type,
            job.target.name,
            job.trigger,
            job.labels,
            outcome,
            reason,
            dry,
            now,
            needed_at=job.needed_at,
        )

    def started(self, job: Job, action_id: int, plan: str, now: float, incident: str = "") -> None:
        """A real action began (its row was written by ActionStore.begin); `incident`: its bundle's id."""
        self._event(job, "started", plan, now, action_id, incident)
        extra = {"action": job.action.name, "target": job.target.name, "plan": plan}
        log.warning("action started", extra=extra | ({"incident": incident} if incident else {}))

    def finish(
        self,
        job: Job,
        action_id: int,
        outcome: str,
        reason: str,
        details: Mapping[str, object],
        now: float,
        incident: str = "",
    ) -> dict[str, Any]:
        """A real action ended."""
        self.store.finish(action_id, outcome, now, reason, dict(details) or None)
        self.count(job.action.name, job.target.name, outcome)
        self._event(job, outcome, reason, now, action_id, incident)
        level = logging.WARNING if outcome == "succeeded" else logging.ERROR
        extra = {"action": job.action.name, "target": job.target.name, "reason": reason}
        log.log(level, "action " + outcome, extra=extra)
        return {"outcome": outcome, "reason": reason, "action_id": action_id}

    def skip(self, job: Job, rail: str, reason: str, now: float) -> dict[str, Any]:
        """A rail (or nothing to do) stopped an action; repeats of the same rail are logged sparingly."""
        self.count(job.action.name, job.target.name, "skipped")
        if _fresh(self._last_skip, (job.action.name, job.target.name), rail, now, job.trigger):
            self._record(job, "skipped", reason, self.dry(job.action), now)
            self._event(job, "skipped", reason, now, None)
            extra = {"action": job.action.name, "target": job.target.name, "rail": rail, "reason": reason}
            log.warning("action skipped", extra=extra)
        return {"outcome": "skipped", "reason": reason}

    def would_do(self, job: Job, plan: str, now: float) -> dict[str, Any]:
        """A dry run decided the action and touched nothing."""
        reason = f"dry run: would {plan}"
        self._record(job, "would_do", reason, True, now)
        self.count(job.action.name, job.target.name, "would_do")
        self._event(job, "would_do", reason, now, None)
        log.warning(
            "dry run: action not taken",
            extra={"action": job.action.name, "target": job.target.name, "would": plan},
        )
        return {"outcome": "would_do", "reason": reason}

    def refuse(
        self,
        action: ActionConfig,
        labels: Mapping[str, str],
        trigger: str,
        reason: str,
        now: float,
        target: str = "",
    ) -> dict[str, Any]:
        """An action the config does not allow on this target (or no target at all); a firing alert asks again
        each resend, so the same refusal is written and logged at most every SKIP_REPEAT seconds."""
        self.count(action.name, target, "refused")
        if _fresh(self._last_refusal, (action.name, target), reason, now, trigger):
            self.store.record(
                action.name, action.type, target, trigger, labels, "refused", reason, self.dry(action), now
            )
            log.error("action refused", extra={"action": action.name, "target": target, "reason": reason})
        return {"outcome": "refused", "reason": reason}

    def _event(
        self, job: Job, outcome: str, reason: str, now: float, action_id: int | None, incident: str = ""
    ) -> None:
        if self.hub is None:
            return
        a = job.action
        event = ActionEvent(
            action=a.name,
            type=a.type,
            target=job.target.name,
            outcome=outcome,
            reason=reason,
            at=now,
            labels=dict(job.labels),
            dry_run=self.dry(a),
            action_id=action_id,
            annotations={"incident": incident} if incident else {},
        )
        self.hub.event(event, now)


def _fresh(
    last: dict[tuple[str, str], tuple[str, float]], key: tuple[str, str], why: str, now: float, trigger: str
) -> bool:
    """Whether a repeated decision is worth a row and a log line: a new reason, SKIP_REPEAT seconds since the
    last one written, or asked for by hand. Notes the time when it is."""
    seen = last.get(key)
    if seen is None or seen[0] != why or now - seen[1] >= SKIP_REPEAT or trigger == "manual":
        last[key] = (why, now)
        return True
    return False
