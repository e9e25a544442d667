"""Alerts become actions: routes pick them, rails allow them, one worker per target runs them in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...config.model import Config
from ...config.targets import TargetConfig
from ...fleet.budget import NO_BUDGET, DisruptionBudget, note_routed
from ...gateway.protocol.channel import ChannelError
from ...integrity.verdict import Verdict as AnswersVerdict
from ...notifiers.alert import OutgoingAlert
from ...notifiers.hub import NotificationHub
from ...statehealth import StateHealth
from ..config import ActionConfig
from ..incidents.recorder import Incident, IncidentRecorder, RecorderOptions
from ..kinds import Act, kind_of
from ..runtimes.readiness import ReadyCheck
from ..runtimes.runtime import Runtime
from ..runtimes.targetruntimes import UnavailableRuntime
from ..store.actionstore import ActionStore
from .control import OperatorControls
from .decisions import Audit, Job
from .episodes import Episodes
from .flows import FlowContext, Outcome, reconcile
from .gates import PIPELINE, Decision, Stop, unrecordable
from .gatewayactions import Gateway, hold_key
from .jobqueues import JobQueues
from .plans import Plan
from .progress import EngineSteps, progress_reader, unknown_engine
from .quarantines import LIFT_AFTER, QuarantineBook, no_answer_check
from .rails import Rails, Verdict
from .removal import forget_target
from .restores import Restores
from .retries import Retries
from .router import route, target_of
from .selfalerts import WatchdogAlerts
from .status import actions_status
from .supervisor import RESPAWN, respawn

log = logging.getLogger("vllm_watchdog.actions.remediator")  # the name logs have always carried
PRUNE_EVERY = 3600.0
KEEP_NOISE = 7 * 86400.0  # skipped, dry-run and refused rows are kept a week; real actions forever


def _unknown_requests(target: str) -> float | None:
    return None


def _not_paused(target: str, now: float) -> str:
    return ""


def _never_ready(target: str, started: float) -> bool:
    return False


@dataclass(frozen=True)
class RemediatorOptions:
    """What a Remediator is wired to: the action store, readiness checks, notifiers, NVML power, the gateway
    that fronts a target (if any), the monitor's view of each engine, clocks, and the state_dir's health."""

    store: ActionStore
    ready: ReadyCheck
    hub: NotificationHub | None = None
    power: Any | None = None
    gateway: Gateway | None = None
    running_requests: Callable[[str], float | None] = _unknown_requests
    engine_steps: Callable[[str], EngineSteps] = unknown_engine  # the drain's progress.py
    engine_state: Callable[[str, float], str] = _not_paused  # why an engine is paused or asleep on purpose
    ready_since: Callable[[str, float], bool] = _never_ready  # a server was ready since it (re)started
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    state: StateHealth | None = None  # a disruptive action that cannot be recorded is refused
    budget: DisruptionBudget = NO_BUDGET  # the fleet's slots: a disruptive action waits for one (fleet rail)
    # What the evidence collected before a disruptive action reads (the store, the firing alerts, NVML).
    incidents: RecorderOptions = field(default_factory=RecorderOptions)
    # Known answers checked before an undrain (KnownAnswers.verify); `lift_after` passes end a quarantine.
    verify_answers: Callable[[TargetConfig, float], Awaitable[AnswersVerdict]] = no_answer_check
    lift_after: int = LIFT_AFTER


class Remediator(OperatorControls):
    """Owns the action queues, the rails and the audit log for the targets of the current config."""

    def __init__(self, config: Config, runtimes: Mapping[str, Runtime], options: RemediatorOptions) -> None:
        self.config = config
        self.store = store = options.store
        self.state = options.state
        self.budget = options.budget
        self.rails = Rails(store, monotonic=options.monotonic)
        self.runtimes = dict(runtimes)
        self.ready = options.ready
        self.hub = options.hub
        self.power = options.power
        self.gateway = options.gateway
        self.running_requests, self.engine_steps = options.running_requests, options.engine_steps
        self.engine_state = options.engine_state
        self.ready_since = options.ready_since
        self.clock, self.monotonic, self.sleep = options.clock, options.monotonic, options.sleep
        self.alerts = WatchdogAlerts(self.rails, lambda: self.config.web_runbook_base_url)
        self.retries = Retries(store)
        self.episodes = Episodes(store)  # hold actions run once per firing episode, not per resend
        self.restores = Restores(store)
        self.audit = Audit(store, self.hub, self.dry)
        self.incidents = IncidentRecorder(config, options.incidents)
        self.verify_answers = options.verify_answers
        self.quarantine_book = QuarantineBook(store, options.lift_after)
        self._pruned = 0.0
        self.reconciled = asyncio.Event()  # workers wait until actions left in flight by a crash are settled
        self.jobs = JobQueues(
            self._execute, lambda job, verdict: self._skip(job, verdict, self.clock()), self.reconciled
        )

    @property
    def queues(self) -> dict[str, deque[Job]]:
        """The jobs waiting, by target."""
        return self.jobs.queues

    @property
    def current(self) -> dict[str, Job]:
        """The job running, by target."""
        return self.jobs.current

    def apply(self, config: Config, runtimes: Mapping[str, Runtime]) -> None:
        """Adopt a reloaded config; queued jobs keep the action settings they were queued with. What a target
        that left the config left pending is undone (removal.py); its running job ends its flow."""
        old, self.config, self.runtimes = self.config, config, dict(runtimes)
        self.incidents.apply(config)
        actions = {**old.actions, **config.actions}.values()
        for name in {t.name for t in old.targets} - {t.name for t in config.targets}:
            pending = (self.jobs, self.audit, self.retries, self.restores)
            forget_target(name, actions, *pending, self.clock(), self.configured)
            self.budget.retired(name, self.clock())

    def configured(self, name: str) -> bool:
        """Whether a target of that name is in the current config."""
        return any(t.name == name for t in self.config.targets)

    # -- intake ------------------------------------------------------------------------------
    def handle(self, alerts: Sequence[OutgoingAlert], now: float, trigger: str = "alert") -> int:
        """Route alerts: firing ones queue actions, resolved ones schedule restores; returns jobs queued."""
        queued = 0
        for alert in alerts:
            target = target_of(alert.labels, self.config.targets)
            names = route(self.config.routes, alert.labels)
            if target is not None:  # what the fleet counts for correlated faults
                routed = [a for a in map(self.config.actions.get, names) if a is not None]
                note_routed(
                    self.budget, alert, target.name, any(a.traits.takes_fleet_slot for a in routed), now
                )
            for name in names:
                action = self.config.actions.get(name)
                if action is None:
                    continue
                if target is None:  # a resolved one asks for nothing (its target may have just been removed)
                    if alert.state != "resolved":
                        reason = "the alert names no configured target"
                        self.audit.refuse(action, alert.labels, trigger, reason, now)
                    continue
                if alert.state == "resolved":
                    self.retries.forget(action.name, target.name)
                    self.episodes.ended(action, target.name, alert.labels)
                    gateway = self._gateway_of(target.name)
                    if action.traits.holds_gateway_cap and gateway is not None:
                        gateway.release(hold_key(action, alert.labels))
                    resolved_at = alert.ends_at or now  # the same on every resend of this resolution
                    self.restores.resolved(action, target.name, alert.labels, resolved_at)
                    continue
                self.restores.firing(action, target.name)
                if self.episodes.done(action, target.name, alert.labels, alert.starts_at, self.dry(action)):
                    gateway = None if self.dry(action) else self._gateway_of(target.name)  # dry: none held
                    if (
                        not action.traits.holds_gateway_cap
                        or gateway is None
                        or gateway.keep(hold_key(action, alert.labels))
                    ):
                        continue  # a resend: the hold of this episode stands (a throttle's is kept alive)
                until = alert.ends_at or None  # an Alertmanager's firing alerts carry no end
                self.retries.fired(action.name, target.name, until)
                needed_at = alert.starts_at or None
                job = Job(action, target, dict(alert.labels), trigger, needed_at=needed_at, until=until)
                queued += self.enqueue(job)
        return queued

    def run_manual(self, name: str, target_name: str | None) -> Job:
        """Queue an action by hand (the control API); ValueError if action or target is unknown."""
        action = self.config.actions.get(name)
        if action is None:
            raise ValueError(
                f"unknown action {name!r} (configured: {', '.join(sorted(self.config.actions)) or 'none'})"
            )
        targets = {t.name: t for t in self.config.targets}
        if target_name is None and len(targets) == 1:
            target_name = next(iter(targets))
        if target_name not in targets:
            raise ValueError(f"unknown target {target_name!r} (configured: {', '.join(sorted(targets))})")
        job = Job(action, targets[target_name], {"target": target_name, "action": name}, "manual")
        job.done = asyncio.get_running_loop().create_future()
        self.enqueue(job)
        return job

    def enqueue(self, job: Job) -> int:
        """Queue a job on its target's worker (see JobQueues); 1 if it was queued, 0 if merged or skipped."""
        return self.jobs.enqueue(job)

    # -- execution ---------------------------------------------------------------------------
    def dry(self, action: ActionConfig) -> bool:
        """Whether the action only reports what it would do."""
        return self.config.dry_run or bool(action.dry_run)

    async def _execute(self, job: Job) -> dict[str, Any]:
        """Pass the job through the gates (gates.PIPELINE), then run it; a fleet slot is given back after."""
        runtime = self.runtimes.get(job.target.name)
        gateway = self._gateway_of(job.target.name)
        d = Decision(job, runtime, gateway, self.clock())
        try:
            stop = await PIPELINE.check(d, self)
            if stop is not None:
                return self._stopped(d, stop)
            assert d.plan is not None
            return await self._run(job, d.plan, runtime, gateway, d.now)
        finally:
            if d.grant is not None:
                await self.budget.release(d.grant)

    def _stopped(self, d: Decision, stop: Stop) -> dict[str, Any]:
        """What a gate's stop writes: a refusal, a dry run's would_do, or a skip on its rail."""
        job, verdict = d.job, stop.verdict
        if stop.how == "refuse":
            return self.audit.refuse(
                job.action, job.labels, job.trigger, verdict.reason, d.now, job.target.name
            )
        if stop.how == "would_do":
            return self.audit.would_do(job, verdict.reason, d.now)
        if stop.later and job.restore:  # due again later, not lost
            self.restores.later(job, d.now)
        return self._skip(job, verdict, d.now)

    async def _run(
        self, job: Job, plan: Plan, runtime: Runtime | None, gateway: Gateway | None, now: float
    ) -> dict[str, Any]:
        """Write the audit row, carry out the plan, record how it ended."""
        action, target = job.action, job.target
        action_id = self.store.begin(
            action.name,
            action.type,
            target.name,
            job.trigger,
            job.labels,
            False,
            now,
            needed_at=job.needed_at,
        )
        if action.traits.needs_writable_state and self.store.degraded:  # the row went to memory just now
            problem = unrecordable(job, self) or "state_unwritable: the audit log could not be written"
            return self._finish(job, action_id, Outcome("skipped", problem))
        incident = self._incident(job, plan.describe, action_id, runtime)
        self.audit.started(job, action_id, plan.describe, now, incident.id if incident else "")
        ctx = self._context(target, runtime, incident)
        try:
            act = Act(action, target, job.labels, runtime, gateway, self.store, self.power, job.restore)
            outcome = await kind_of(action.type).execute(act, plan, ctx, action_id)
        except Exception as exc:  # a bug in a flow: the row must not stay "running" (the busy rail reads it)
            log.exception("action crashed", extra={"action": action.name, "target": target.name})
            outcome = Outcome("failed", f"internal error: {exc}")
        if incident is not None:  # the bundle is written by now, or why not is known
            outcome = Outcome(outcome.outcome, outcome.reason, {**outcome.details, **await incident.close()})
        return self._finish(job, action_id, outcome, incident.id if incident else "")

    def _incident(self, job: Job, plan: str, action_id: int, runtime: Runtime | None) -> Incident | None:
        """Start collecting the evidence of an action that collects_evidence, its id in the audit row."""
        if not self.incidents.wanted(job):
            return None
        incident = self.incidents.open(job, plan, action_id, runtime)
        self.store.annotate(action_id, {"incident": incident.id})
        return incident

    def _gateway_of(self, target: str) -> Gateway | None:
        gw = self.gateway
        return gw if gw is not None and gw.target == target else None

    async def _gateway_in_flight(self, target: str) -> int | None:
        """Drain the gateway in front of `target` now and return its live in-flight count (the count of its
        last answer when it does not answer now); None without one."""
        gw = self._gateway_of(target)
        if gw is None:
            return None
        with contextlib.suppress(ChannelError):
            await gw.set_drain(True)
        return gw.in_flight()

    def _context(
        self, target: TargetConfig, runtime: Runtime | None, incident: Incident | None = None
    ) -> FlowContext:
        return FlowContext(
            store=self.store,
            target=target,
            runtime=runtime or UnavailableRuntime("none", target.name, "no container, command or unit"),
            ready=self.ready,
            running_requests=lambda: self.running_requests(target.name),
            progress=progress_reader(self._gateway_of(target.name), lambda: self.engine_steps(target.name)),
            gateway_in_flight=lambda: self._gateway_in_flight(target.name),
            clock=self.clock,
            monotonic=self.monotonic,
            sleep=self.sleep,
            verify_answers=lambda: self.verify_answers(target, self.clock()),
            **({"evidence": incident.evidence} if incident is not None else {}),
        )

    def _finish(self, job: Job, action_id: int, outcome: Outcome, incident: str = "") -> dict[str, Any]:
        now = self.clock()
        result = self.audit.finish(
            job, action_id, outcome.outcome, outcome.reason, outcome.details, now, incident
        )
        if outcome.outcome in ("failed", "rolled_back"):
            self.retries.failed(job)
        elif outcome.outcome == "succeeded":
            self.episodes.ran(job.action, job.target.name, job.labels, job.needed_at)
            self.retries.forget(job.action.name, job.target.name)
        self._send(
            self.alerts.after_outcome(job.action, job.target, outcome.outcome, outcome.reason, now), now
        )
        return result

    def _skip(self, job: Job, verdict: Verdict, now: float) -> dict[str, Any]:
        result = self.audit.skip(job, verdict.rail, verdict.reason, now)
        self._send(self.alerts.after_skip(job.action, job.target, verdict, now), now)
        return result | {"rail": verdict.rail, "retry_at": verdict.retry_at}

    def _send(self, alerts: list[OutgoingAlert], now: float) -> None:
        if alerts and self.hub is not None:
            self.hub.alerts(alerts, now)

    # -- periodic ----------------------------------------------------------------------------
    async def tick(self, now: float) -> None:
        """Queue due restores, respawn dead servers (supervisor.respawn), resend or resolve own alerts."""
        for target in self.config.targets:
            for job in self.restores.due(target, self.config.actions.values(), now):
                self.enqueue(job)
            if self.jobs.idle(target.name):
                respawned = await respawn(target, self.runtimes.get(target.name))
                if respawned is not None:
                    self.enqueue(respawned)
            if self.jobs.idle(target.name):
                for job in self.retries.due(target, self.config.actions.values(), self.rails, now):
                    self.enqueue(job)
        self.rails.observe(now)  # new rows' ages from now on follow the monotonic clock
        self._send(self.alerts.tick(self.config.actions, now), now)
        self._send(self.budget.alerts(now), now)
        if now - self._pruned >= PRUNE_EVERY:
            self._pruned = now
            self.store.prune(now - KEEP_NOISE)

    async def reconcile(self) -> None:
        """After a crash: finish or roll back every action left running, and undrain its target."""
        targets = {t.name: t for t in self.config.targets}
        for record in self.store.unfinished():
            target, runtime = targets.get(record.target), self.runtimes.get(record.target)
            action = self.config.actions.get(record.action, RESPAWN)
            if target is None or runtime is None:
                self.store.finish(
                    record.id, "failed", self.clock(), "watchdog restarted; target no longer configured"
                )
                self.store.set_drain(record.target, False, self.clock(), record.id)
                continue
            log.warning(
                "reconciling an action left in flight",
                extra={"action": record.action, "target": record.target},
            )
            outcome = await reconcile(
                self._context(target, runtime),
                record.id,
                stop_timeout=action.stop_timeout,
                ready_timeout=action.ready_timeout,
            )
            self.store.finish(record.id, outcome.outcome, self.clock(), outcome.reason)
            self.audit.count(record.action, record.target, outcome.outcome)
        quarantined = self.store.quarantines()  # kept drained until lifted
        for name in list(self.store.drains()):
            if name not in self.current and name not in quarantined:
                self.store.set_drain(name, False, self.clock())
        self.reconciled.set()

    def status_json(self, now: float, limit: int = 100) -> dict[str, Any]:
        """GET /api/v1/actions: history, queues, drains, pause, silences, budgets and the fleet."""
        return actions_status(self, now, limit)

    async def aclose(self) -> None:
        """Cancel workers; an action cut short stays "running" in the log and is reconciled at next start."""
        await self.jobs.aclose()
