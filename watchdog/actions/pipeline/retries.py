"""Retrying a failed action while the alert that asked for it still fires.

An alert reaches the routes when it starts firing and then only when it is re-sent: the rules re-send every
minute, an Alertmanager at its `repeat_interval` (often hours). So an action that failed, say because the
Docker engine was down, is remembered here (in the action state database, so a restart keeps it) and queued
again by the periodic tick once the rails let it run: the backoff rail spaces the attempts
(`backoff_initial * 2**(n-1)`, at most `backoff_max`), the budget rail bounds them. A pending retry is
forgotten when the action succeeds, when the alert resolves, and when the alert's own end passes (`endsAt`:
rule alerts renew it on every re-send; an Alertmanager's firing alerts carry none, so theirs hold until
they resolve).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...config.targets import TargetConfig
from ..config import ActionConfig
from ..store.actionstore import ActionStore
from .decisions import Job
from .rails import Rails

log = logging.getLogger("vllm_watchdog.actions.remediator")
RETRIED = (
    "alert",
    "inbound",
    "retry",
)  # triggers whose failures are retried (not manual, restore, supervisor)
WAIT_RAILS = ("backoff", "cooldown", "busy")  # rails that clear by themselves: nothing is queued meanwhile
RECHECK = 60.0  # a retry blocked by another rail (paused, silenced, budget...) is queued again this often


@dataclass(frozen=True)
class PendingRetry:
    """A failed action to run again while its alert fires."""

    labels: Mapping[str, str]
    needed_at: float | None  # the alert's start: a retry is the same need, not a new one (crash loops)
    until: float | None  # the alert's endsAt; None: until it resolves


def _key(action: str, target: str) -> str:
    return f"retry/{action}/{target}"


class Retries:
    """The pending retries, kept under `retry/<action>/<target>` in the action store."""

    def __init__(self, store: ActionStore) -> None:
        self.store = store
        self._next: dict[tuple[str, str], float] = {}  # when a retry blocked by a rail is queued again

    def failed(self, job: Job) -> None:
        """An action failed: if an alert triggered it, retry it while the alert fires."""
        if job.trigger in RETRIED:
            doc = {"labels": dict(job.labels), "needed_at": job.needed_at, "until": job.until}
            self.store.put(_key(job.action.name, job.target.name), doc)

    def fired(self, action: str, target: str, until: float | None) -> None:
        """The alert was (re-)sent firing: a pending retry holds until its new end."""
        pending = self.get(action, target)
        if pending is not None and pending.until != until:
            doc = {"labels": dict(pending.labels), "needed_at": pending.needed_at, "until": until}
            self.store.put(_key(action, target), doc)

    def forget(self, action: str, target: str) -> None:
        """The action succeeded or its alert resolved: no more retries."""
        self._next.pop((action, target), None)
        if self.store.get(_key(action, target)) is not None:  # only then: every write is an fsync
            self.store.put(_key(action, target), None)

    def get(self, action: str, target: str) -> PendingRetry | None:
        """The pending retry of an action on a target, if any."""
        doc: Any = self.store.get(_key(action, target))
        if not isinstance(doc, dict):
            return None
        labels = doc.get("labels")
        if not isinstance(labels, dict):
            labels = {}
        return PendingRetry(
            {str(k): str(v) for k, v in labels.items()},
            _number(doc.get("needed_at")),
            _number(doc.get("until")),
        )

    def due(
        self, target: TargetConfig, actions: Iterable[ActionConfig], rails: Rails, now: float
    ) -> list[Job]:
        """The retries of an idle target to queue now: those the rails allow, or that a rail blocks which
        does not clear by itself (queued anyway, at most every RECHECK seconds, so the skip is recorded)."""
        jobs = []
        for action in actions:
            pending = self.get(action.name, target.name)
            if pending is None:
                continue
            key = (action.name, target.name)
            if pending.until is not None and pending.until <= now:
                log.info(
                    "the alert stopped firing: no more retries", extra={"action": key[0], "target": key[1]}
                )
                self.forget(*key)
                continue
            verdict = rails.check(
                action, target.name, pending.labels, now, server_started_at=None, needed_at=pending.needed_at
            )
            if verdict.rail in WAIT_RAILS or now < self._next.get(key, 0.0):
                continue
            if not verdict.allowed:
                after = verdict.retry_at
                self._next[key] = after if after is not None and after > now else now + RECHECK
            log.warning(
                "retrying a failed action while its alert fires", extra={"action": key[0], "target": key[1]}
            )
            labels = dict(pending.labels)
            jobs.append(
                Job(action, target, labels, "retry", needed_at=pending.needed_at, until=pending.until)
            )
        return jobs

    def json(
        self, targets: Iterable[TargetConfig], actions: Iterable[ActionConfig], rails: Rails, now: float
    ) -> list[dict[str, Any]]:
        """The pending retries, for /api/v1/actions: action, target, until and the earliest retry_at."""
        out: list[dict[str, Any]] = []
        for target in targets:
            for action in actions:
                pending = self.get(action.name, target.name)
                if pending is None:
                    continue
                verdict = rails.check(action, target.name, pending.labels, now, server_started_at=None)
                retry_at = now if verdict.allowed else verdict.retry_at
                out.append(
                    {
                        "action": action.name,
                        "target": target.name,
                        "until": pending.until,
                        "retry_at": retry_at,
                    }
                )
        return out


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value else None
