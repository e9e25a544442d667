"""Restores: an action with `restore_after` is undone that long after its alert resolved. What is due is kept
in the action store, so a restarted watchdog still restores."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from ...config.targets import TargetConfig
from ..config import ActionConfig
from ..store.actionstore import ActionStore
from .decisions import Job

RESTORE_RECHECK = 60.0  # a restore refused while the engine is paused or asleep is due again this much later


def _key(action: str, target: str) -> str:
    return f"restore/{action}/{target}"


class Restores:
    """The restores due, by action and target: scheduled at resolution, cancelled when the alert fires again,
    queued once due."""

    def __init__(self, store: ActionStore) -> None:
        self.store = store

    def resolved(
        self, action: ActionConfig, target: str, labels: Mapping[str, str], resolved_at: float
    ) -> None:
        """Schedule the restore of an action with `restore_after` (a resent resolution changes nothing)."""
        if action.restore_after is None:
            return
        key = _key(action.name, target)
        held = self.store.get(key)
        if not (isinstance(held, dict) and held.get("resolved_at") == resolved_at):
            due = resolved_at + action.restore_after
            doc = {"due": due, "resolved_at": resolved_at, "labels": dict(labels)}
            self.store.put(key, doc)

    def firing(self, action: ActionConfig, target: str) -> None:
        """The alert fires again: the hold restarts at its next resolution."""
        key = _key(action.name, target)
        if self.store.get(key) is not None:
            self.store.put(key, None)  # (only then: every write is an fsync)

    def cancel(self, action: ActionConfig, target: str) -> None:
        """The target is gone: its restore will not run (nor when a target of that name comes back)."""
        self.firing(action, target)

    def later(self, job: Job, now: float) -> None:
        """A restore refused for now (the engine is paused or asleep on purpose): due again RESTORE_RECHECK
        later, not lost."""
        key = _key(job.action.name, job.target.name)
        pending = self.store.get(key)
        if isinstance(pending, dict):
            self.store.put(key, {**pending, "due": now + RESTORE_RECHECK, "queued": False})

    def due(self, target: TargetConfig, actions: Iterable[ActionConfig], now: float) -> Iterator[Job]:
        """The restore jobs of `target` due at `now`, each marked queued as it is yielded."""
        for action in actions:
            key = _key(action.name, target.name)
            pending = self.store.get(key)
            if isinstance(pending, dict) and not pending.get("queued") and float(pending["due"]) <= now:
                self.store.put(key, {**pending, "queued": True})  # resends of the resolution find it done
                yield Job(action, target, dict(pending.get("labels") or {}), "restore", restore=True)
