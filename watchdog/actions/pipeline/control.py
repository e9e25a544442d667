"""What an operator may ask of the remediation (the API's side of it): its state and the fleet's, pause and
resume, a manual run, alerts sent in, silences and quarantines. The API goes through this interface, never
round it to the action store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ...fleet.budget import DisruptionBudget
from ...notifiers.alert import OutgoingAlert
from ..store.actionstore import ActionStore
from ..store.records import Quarantine, Silence
from .decisions import Job
from .quarantines import AnswerVerdict, QuarantineBook


class RemediationControl(Protocol):
    """The remediation as the API drives it."""

    def status_json(self, now: float, limit: int = 100) -> dict[str, Any]:
        """History, queues, drains, pause, silences, budgets and the fleet."""
        ...

    async def fleet_group(self) -> dict[str, Any]:
        """The fleet group as etcd has it now; {"enabled": False} outside a fleet."""
        ...

    def set_paused(self, paused: bool, reason: str, now: float) -> None:
        """Pause or resume every action."""
        ...

    def run_manual(self, name: str, target_name: str | None) -> Job:
        """Queue a manual run of an action."""
        ...

    def handle(self, alerts: Sequence[OutgoingAlert], now: float, trigger: str = "alert") -> int:
        """Alerts through the routes; how many jobs were queued."""
        ...

    def add_silence(
        self,
        matchers: Sequence[Mapping[str, Any]],
        starts_at: float,
        ends_at: float,
        comment: str,
        created_by: str,
        now: float,
    ) -> str:
        """Keep a silence; its id."""
        ...

    def silences(self, now: float, active_only: bool = True) -> list[Silence]:
        """Silences, newest first."""
        ...

    def expire_silence(self, silence_id: str, now: float) -> bool:
        """End a silence now; False if it is not active."""
        ...

    def quarantines(self) -> dict[str, Quarantine]:
        """Quarantined targets."""
        ...

    def lift_quarantine(self, target: str, now: float, why: str) -> bool:
        """End a target's quarantine and undrain it; False if it was not quarantined."""
        ...


class OperatorControls:
    """The parts of RemediationControl the remediator answers from its store and budget (mixed into it)."""

    store: ActionStore
    budget: DisruptionBudget
    quarantine_book: QuarantineBook

    async def fleet_group(self) -> dict[str, Any]:
        """The fleet group as etcd has it now; {"enabled": False} outside a fleet."""
        return await self.budget.group()

    def set_paused(self, paused: bool, reason: str, now: float) -> None:
        """Pause or resume every action (resuming also ends crash-loop refusals)."""
        self.store.set_paused(paused, reason, now)

    def add_silence(
        self,
        matchers: Sequence[Mapping[str, Any]],
        starts_at: float,
        ends_at: float,
        comment: str,
        created_by: str,
        now: float,
    ) -> str:
        """Keep a silence; its id. ValueError if a matcher is malformed, there is none, or it ends first."""
        return self.store.add_silence(matchers, starts_at, ends_at, comment, created_by, now)

    def silences(self, now: float, active_only: bool = True) -> list[Silence]:
        """Silences, newest first: those in effect at `now`, or every one kept."""
        return self.store.silences(now, active_only=active_only)

    def expire_silence(self, silence_id: str, now: float) -> bool:
        """End a silence now; False if there is no such silence or it has ended already."""
        return self.store.expire_silence(silence_id, now)

    def quarantines(self) -> dict[str, Quarantine]:
        """Quarantined targets: since when, why, by which action, passing checks since."""
        return self.store.quarantines()

    def lift_quarantine(self, target: str, now: float, why: str) -> bool:
        """End a target's quarantine by hand and undrain it (an audit row); False if none."""
        return self.quarantine_book.lift(target, now, "manual", why)

    def answers_checked(self, target: str, verdict: AnswerVerdict, now: float) -> None:
        """A periodic known-answer check's verdict (integrity's on_verdict): `lift_after` passes in a row lift
        the target's quarantine."""
        self.quarantine_book.answers_checked(target, verdict, now)
