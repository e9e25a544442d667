"""The decision pipeline: the gates a job passes, in one order, before its action runs.

Each gate is a small stage with one interface (like Alertmanager's notify Stage): it looks at the Decision
and passes (None) or stops it with a Stop that says how (refused, a dry run's would_do, or skipped on a rail).
The order, defined once in PIPELINE:

- preflight: the action can act on the target at all (a runtime of the right kind, NVML, a gateway);
- superseded: a kind that stops_server for a need that began before such an action on the target finished
  successfully (superseded.py: the alert was raised while that action had the server down);
- rails: the safety rails (rails.py), with the server's start read once for a kind that needs_startup_grace,
  and whether the monitor saw it ready since (which ends the grace);
- quarantined: a kind that stops_server is refused on a quarantined target (quarantines.py: its answers
  stayed wrong after a restart; a person must look), but a dead child's respawn is not;
- nothing_to_do: the kind's plan, which may find nothing to do;
- dry_run: a dry run reports the plan and stops;
- state_unwritable: a kind that needs_writable_state is refused while its audit row could not be kept;
- fleet: a kind that takes_fleet_slot waits for a slot of the fleet's budget; minutes may pass, so after the
  wait the gates of AFTER_WAIT run: target_removed (reload, discovery), superseded, then the rails and
  the plan again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ...fleet.budget import DisruptionBudget, Grant
from ...statehealth import StateHealth
from ..config import ActionConfig
from ..kinds import Act, kind_of
from ..runtimes.runtime import Runtime
from ..store.actionstore import ActionStore
from .decisions import Job
from .gatewayactions import Gateway
from .plans import Plan
from .preflight import server_started_at, unsupported
from .quarantines import quarantined_reason
from .rails import Rails, Verdict
from .removal import REMOVED_RAIL, removed
from .superseded import superseded

STATE_RAIL = "state_unwritable"  # the rail that refuses an action while state_dir cannot be written
QUARANTINE_RAIL = "quarantined"  # the rail that refuses a restart of a target whose answers stayed wrong
ENGINE_PAUSED = "engine_paused"


class Deciding(Protocol):
    """What the gates read of the remediator."""

    store: ActionStore
    state: StateHealth | None
    budget: DisruptionBudget
    rails: Rails
    power: Any | None
    clock: Callable[[], float]
    monotonic: Callable[[], float]

    def engine_state(self, target: str, now: float) -> str: ...

    def ready_since(self, target: str, started: float) -> bool: ...

    def configured(self, name: str) -> bool: ...

    def dry(self, action: ActionConfig) -> bool: ...


@dataclass
class Decision:
    """One job on its way through the gates: what they learnt so far."""

    job: Job
    runtime: Runtime | None
    gateway: Gateway | None
    now: float
    started: float | None = None  # when the target's server started (read once, for the startup grace)
    started_read: bool = False
    plan: Plan | None = None
    grant: Grant | None = None  # the fleet slot taken: given back once the action ended


@dataclass(frozen=True)
class Stop:
    """Why a job goes no further: refused (cannot act at all), a dry run, or skipped with `verdict`; a due
    restore stopped with `later` is scheduled again."""

    verdict: Verdict
    how: str = "skip"  # "skip" | "refuse" | "would_do"
    later: bool = False


class Gate(Protocol):
    """One stage of the pipeline."""

    async def check(self, d: Decision, r: Deciding) -> Stop | None:
        """None to pass the job on, or why it stops."""
        ...


def unrecordable(job: Job, r: Deciding) -> str:
    """Why an action that needs_writable_state cannot run now because its audit row could not be kept ("" if
    it can): the state_dir must pass a fresh write probe and the store must be on its file."""
    if not job.action.traits.needs_writable_state or r.state is None:
        return ""
    problem = r.state.refusal(r.monotonic())
    if not problem and r.store.degraded:
        problem = "state_unwritable: the action database is kept in memory until its file can be written"
    return problem


class Preflight:
    """The action can act on the target at all."""

    async def check(self, d: Decision, r: Deciding) -> Stop | None:
        """Refused when it cannot."""
        problem = unsupported(d.job.action, d.job.target, d.runtime, r.power, d.gateway)
        return Stop(Verdict(False, problem), "refuse") if problem else None


class Superseded:
    """No restart for a need that a server-stopping action on the target has cured since (superseded.py)."""

    async def check(self, d: Decision, r: Deciding) -> Stop | None:
        """Skipped on the superseded rail."""
        verdict = superseded(d.job, r.store)
        return None if verdict is None else Stop(verdict)


class RailsGate:
    """The safety rails (rails.py)."""

    async def check(self, d: Decision, r: Deciding) -> Stop | None:
        """The verdict of the first rail that blocks."""
        job = d.job
        if not d.started_read:
            d.started_read = True
            if d.runtime is not None and job.action.traits.needs_startup_grace:
                d.started = await server_started_at(d.runtime)
        verdict = r.rails.check(
            job.action,
            job.target.name,
            job.labels,
            d.now,
            server_started_at=d.started,
            manual=job.trigger == "manual",
            needed_at=job.needed_at,
            # A child that exited (the supervisor's respawn) is not paused, whatever its last answer said.
            engine_state="" if job.trigger == "supervisor" else r.engine_state(job.target.name, d.now),
            server_ready=d.started is not None and r.ready_since(job.target.name, d.started),
        )
        if verdict.allowed:
            return None
        return Stop(verdict, later=verdict.rail == ENGINE_PAUSED)  # a restore is due again later, not lost


class Quarantined:
    """No action that stops the server of a quarantined target."""

    async def check(self, d: Decision, r: Deciding) -> Stop | None:
        """Skipped on the quarantined rail, with the quarantine's reason."""
        job = d.job
        if not job.action.traits.stops_server or job.trigger == "supervisor":  # a dead child is respawned
            return None
        q = r.store.quarantines().get(job.target.name)
        return None if q is None else Stop(Verdict(False, quarantined_reason(q), QUARANTINE_RAIL))


class NothingToDo:
    """The kind's plan; it may find nothing to do."""

    async def check(self, d: Decision, r: Deciding) -> Stop | None:
        """Skipped on the nothing_to_do rail with the plan's reason."""
        job = d.job
        act = Act(
            job.action,
            job.target,
            job.labels,
            d.runtime,
            d.gateway,
            r.store,
            r.power,
            job.restore,
            job.needed_at,
        )
        d.plan = await kind_of(job.action.type).plan(act)
        return Stop(Verdict(False, d.plan.skip, "nothing_to_do")) if d.plan.skip else None


class DryRun:
    """A dry run reports what it would do and stops."""

    async def check(self, d: Decision, r: Deciding) -> Stop | None:
        """would_do with the plan."""
        assert d.plan is not None
        return Stop(Verdict(False, d.plan.describe), "would_do") if r.dry(d.job.action) else None


class StateWritable:
    """No action that needs_writable_state while its audit row could not be kept."""

    async def check(self, d: Decision, r: Deciding) -> Stop | None:
        """Skipped on the state_unwritable rail."""
        problem = unrecordable(d.job, r)
        return Stop(Verdict(False, problem, STATE_RAIL)) if problem else None


class TargetPresent:
    """The target is still configured (a reload or discovery may have removed it during a wait)."""

    async def check(self, d: Decision, r: Deciding) -> Stop | None:
        """Skipped on the target_removed rail."""
        name = d.job.target.name
        return None if r.configured(name) else Stop(Verdict(False, removed(name), REMOVED_RAIL))


@dataclass(frozen=True)
class Gates:
    """Gates in order (Alertmanager's MultiStage): the first that stops the job decides."""

    gates: Sequence[Gate]

    async def check(self, d: Decision, r: Deciding) -> Stop | None:
        """The first stop, or None when every gate passed."""
        for gate in self.gates:
            stop = await gate.check(d, r)
            if stop is not None:
                return stop
        return None


@dataclass(frozen=True)
class FleetSlot:
    """A kind that takes_fleet_slot waits for a slot (a dead child's respawn is no disruption); then what
    the wait may have changed is checked again (`after`)."""

    after: Gate

    async def check(self, d: Decision, r: Deciding) -> Stop | None:
        """Refused by the fleet, or the gates after the wait."""
        job = d.job
        if not job.action.traits.takes_fleet_slot or job.trigger == "supervisor":
            return None
        d.grant = await r.budget.acquire(job.target.name, job.action.name)  # given back by the caller
        d.now = r.clock()
        if d.grant.refusal:
            return Stop(Verdict(False, d.grant.refusal, d.grant.rail), later=True)
        return await self.after.check(d, r)


RAILS, QUARANTINED, PLAN, SUPERSEDED = RailsGate(), Quarantined(), NothingToDo(), Superseded()
AFTER_WAIT = Gates((TargetPresent(), SUPERSEDED, RAILS, QUARANTINED, PLAN))
PIPELINE = Gates(
    (Preflight(), SUPERSEDED, RAILS, QUARANTINED, PLAN, DryRun(), StateWritable(), FleetSlot(AFTER_WAIT))
)
