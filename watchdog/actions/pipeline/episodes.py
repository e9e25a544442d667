"""Holds are opened once per firing episode: a resend of the same firing alert does not open them again.

The rule manager resends a firing alert every resend interval (an Alertmanager webhook as often as it likes).
For actions that hold something while their alert fires (a session breaker, a throttle hold, a drain), acting
on every resend would re-open the hold and extend it past the episode: a breaker re-opened each minute never
lets its session back in. An episode is one alert (its labels) from one start: the same labels with a new
startsAt are a new episode. What was done is read from the audit log (real runs that started or succeeded for
those labels with that start as their need), so the answer survives a restart of the daemon; the newest
episode per action, target and labels is remembered in memory to spare the log the resends. A dry run follows
the same rule with its own rows (would_do), so it reports one would_do per episode, as the real run would act
once; its rows never count for a real run (switching dry_run off acts in the episode under way).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from ..config import ActionConfig
from ..store.actionstore import ActionStore

DONE = ("running", "succeeded")
WOULD_DO = ("would_do",)  # a dry run's "done"
MAX_REMEMBERED = 10_000  # episodes kept in memory; older ones are found in the audit log again


def _key(action: ActionConfig, target: str, labels: Mapping[str, str], dry: bool) -> tuple[str, str, str]:
    return (
        ("dry:" if dry else "") + action.name,
        target,
        "\0".join(f"{k}={v}" for k, v in sorted(labels.items())),
    )


class Episodes:
    """Which firing episodes a hold action already ran for."""

    def __init__(self, store: ActionStore) -> None:
        self.store = store
        self._done: OrderedDict[tuple[str, str, str], float] = OrderedDict()  # -> the episode's start

    def done(
        self, action: ActionConfig, target: str, labels: Mapping[str, str], started: float, dry: bool = False
    ) -> bool:
        """Whether `action` already ran on `target` for the episode of `labels` that began at `started` (for a
        dry run: already reported what it would do)."""
        if not action.traits.once_per_episode or not started:
            return False
        key = _key(action, target, labels, dry)
        if self._done.get(key) == started:
            return True
        rows = self.store.history(
            None,
            target,
            action.name,
            dry_run=dry,
            outcomes=WOULD_DO if dry else DONE,
            started_after=started - 1.0,  # its runs started after the alert did
            steps=False,
        )
        if any(r.needed_at == started and dict(r.labels) == dict(labels) for r in rows):
            self._remember(key, started)
            return True
        return False

    def ran(
        self, action: ActionConfig, target: str, labels: Mapping[str, str], started: float | None
    ) -> None:
        """A hold action succeeded for the episode that began at `started`."""
        if action.traits.once_per_episode and started:
            self._remember(_key(action, target, labels, False), started)

    def ended(self, action: ActionConfig, target: str, labels: Mapping[str, str]) -> None:
        """The alert resolved: its next firing is a new episode."""
        self._done.pop(_key(action, target, labels, False), None)
        self._done.pop(_key(action, target, labels, True), None)

    def _remember(self, key: tuple[str, str, str], started: float) -> None:
        self._done.pop(key, None)
        self._done[key] = started
        while len(self._done) > MAX_REMEMBERED:
            self._done.popitem(last=False)
