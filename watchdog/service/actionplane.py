"""Everything after rule evaluation, wired for the daemon: notifiers, runtimes, rails and the remediator."""

from __future__ import annotations

import logging
import math

from ..actions.incidents.recorder import RecorderOptions
from ..actions.pipeline.progress import RUNNING, STEPS, EngineSteps, engine_steps
from ..actions.pipeline.remediator import Remediator, RemediatorOptions
from ..actions.pipeline.supervisor import retire_child
from ..actions.runtimes.process import ProcessRuntime
from ..actions.runtimes.readiness import ReadyCheck
from ..actions.runtimes.runtime import Runtime
from ..actions.runtimes.targetruntimes import build_runtimes
from ..background import Background
from ..config.model import Config
from ..config.targets import TargetConfig
from ..fleet.budget import NO_BUDGET
from ..fleet.correlated import FIRING_HOLD
from ..gateway.protocol.snapshot import GatewaySnapshot
from ..notifiers.alert import OutgoingAlert
from ..promql.values import Matrix, QueryError, Vector
from .actionwiring import (
    ActionPlaneOptions,
    action_store,
    fleet_budget,
    gateway_control,
    notification_hub,
    power_limiter,
    state_health,
)

log = logging.getLogger("vllm_watchdog.actions.plane")  # the name logs have always carried
MAX_FIRING = 1024  # firing alerts kept for the fleet view


class ActionPlane:
    """Owns the action state database, the notification hub, one runtime per target and the remediator;
    each part is built in actionwiring.py from the config and the plane's options."""

    def __init__(self, config: Config, options: ActionPlaneOptions) -> None:
        self.config = config
        self.engine = options.engine
        self.clock, self.monotonic = options.clock, options.monotonic
        self.docker_client, self.systemctl = options.docker_client, options.systemctl
        self.health = state_health(config, self.monotonic)
        self.store = action_store(config, self.health, self._drain_changed)
        self._deferred = False  # start-up reconcile and process starts wait for a writable state_dir
        self.client = options.client_factory()
        self.hub = notification_hub(config, self.client, self.health, options)
        self.power = power_limiter(config, options.nvml)
        self.runtimes: dict[str, tuple[TargetConfig, Runtime]] = self._runtimes(config, None)
        self._background = Background()
        self._firing: dict[tuple[str, str], float] = {}  # (alertname, target) -> shown until
        self.gateway = gateway_control(config, self.store, options, self.query_value)
        self.fleet = fleet_budget(config, options)
        self.remediator = Remediator(
            config, {k: v[1] for k, v in self.runtimes.items()}, self._parts(options)
        )

    def _parts(self, options: ActionPlaneOptions) -> RemediatorOptions:
        """What the remediator works with: the plane's store, hub, power, gateway, budget and clocks."""
        return RemediatorOptions(
            self.store,
            ReadyCheck(self.client, client_factory=options.client_factory),
            hub=self.hub,
            power=self.power,
            gateway=self.gateway,
            running_requests=self.running_requests,
            engine_steps=self.engine_steps,
            engine_state=options.engine_state,
            ready_since=options.ready_since,
            verify_answers=options.verify_answers,
            lift_after=self.config.integrity.learn_probes,  # passing checks in a row end a quarantine
            clock=self.clock,
            monotonic=self.monotonic,
            state=self.health,
            budget=self.fleet if self.fleet is not None else NO_BUDGET,
            incidents=RecorderOptions(
                store=lambda: self.engine().store,
                firing=options.firing,
                nvml=options.nvml,
                clock=self.clock,
                monotonic=self.monotonic,
            ),
        )

    def _drain_changed(self, target: str, drained: bool) -> None:
        """The action store's drain hook: the gateway follows the flag of the target it fronts."""
        if self.gateway is not None:
            self.gateway.on_drain(target, drained)

    def _runtimes(
        self, config: Config, previous: dict[str, tuple[TargetConfig, Runtime]] | None
    ) -> dict[str, tuple[TargetConfig, Runtime]]:
        return build_runtimes(
            config.targets,
            docker_client=self.docker_client,
            state_dir=config.state_dir,
            systemctl=self.systemctl,
            previous=previous,
        )

    def query_value(self, expr: str) -> float | None:
        """The first value of an instant query on the sample store; None if empty, NaN or failing."""
        try:
            result = self.engine().query(expr, self.clock())
        except QueryError:
            return None
        if not isinstance(result, Vector) or not result or math.isnan(result[0].value):
            return None
        return result[0].value

    def running_requests(self, target: str) -> float | None:
        """Requests a target is serving as vLLM reports them: vllm:num_requests_running from the sample
        store, None if unknown (the drain adds the gateway's own count: flows._running)."""
        return self.query_value(f'sum(vllm:num_requests_running{{target="{target}"}})')

    def engine_steps(self, target: str) -> EngineSteps:
        """How long a target's engine-step counter stood still and vLLM ran requests, from the last 5 minutes
        of the sample store (the drain's progress, actions/pipeline/progress.py)."""
        now, selector = self.clock(), f'{{target="{target}"}}[5m]'
        try:
            steps = self.engine().query(STEPS + selector, now)
            running = self.engine().query(RUNNING + selector, now)
        except QueryError:
            return EngineSteps()
        if not isinstance(steps, Matrix) or not isinstance(running, Matrix):
            return EngineSteps()
        fresh = 2 * self.config.global_.scrape_interval + 2.0  # an older newest sample tells nothing of now
        return engine_steps(((s.ts, s.vals) for s in steps), ((s.ts, s.vals) for s in running), now, fresh)

    async def start(self) -> None:
        """Start the gateway (if any); reconcile actions a killed watchdog left in flight, then make sure
        process-mode children run. Raises OSError if the gateway cannot listen."""
        if self.gateway is not None:
            await self.gateway.start()
            log.info("gateway started", extra={"listen": self.gateway.listen, "target": self.gateway.target})
        if self.fleet is not None:
            self._background.spawn(self.fleet.run(), "fleet:lease")
        self._background.spawn(self._start(), "actions:start")

    async def _start(self) -> None:
        if self._unrecordable() and (self.store.unfinished() or self._starts_processes()):
            # Reconciling or starting vLLM stops or starts servers, which must be recorded to be safe.
            log.error(
                "state_dir is not writable: actions left in flight are reconciled, and process-mode vLLM "
                "started, once it is",
                extra={"state_dir": self.config.state_dir},
            )
            self._deferred = True
            if not self.store.unfinished():
                self.remediator.reconciled.set()  # nothing to reconcile: non-disruptive actions may run
            return
        try:
            if not self.remediator.reconciled.is_set():  # a deferred start finds it done if nothing was left
                await self.remediator.reconcile()
            await self._ensure_children(list(self.runtimes))
        except Exception:
            log.exception("reconciling actions at start-up failed")
        finally:
            self.remediator.reconciled.set()

    async def _ensure_children(self, names: list[str]) -> None:
        """Adopt or start the child of each process-mode target named (not while actions are paused)."""
        for name in names:
            runtime = self.runtimes.get(name, (None, None))[1]
            ensure = getattr(runtime, "ensure_running", None)
            if ensure is not None and not self.store.paused()[0] and await ensure():
                log.warning("started vLLM (process mode)", extra={"target": name})

    def _unrecordable(self) -> bool:
        return self.health is not None and not self.health.check(self.monotonic())

    def _starts_processes(self) -> bool:
        return any(hasattr(runtime, "ensure_running") for _, runtime in self.runtimes.values())

    def apply(self, config: Config) -> None:
        """A reloaded config (or discovered targets): new notifiers, routes and actions; runtimes of unchanged
        targets are kept, the others retired once their running flow ended, and process-mode targets new to
        the config get their child started."""
        old = self.runtimes
        self.runtimes = self._runtimes(config, old)
        for name, (_, runtime) in old.items():
            if self.runtimes.get(name, (None, None))[1] is not runtime:
                self._background.spawn(self._retire(name, runtime), f"actions:retire:{name}")
        if config.fleet != self.config.fleet and not (
            self.fleet is not None and config.fleet is not None and self.fleet.apply(config.fleet)
        ):
            log.warning(
                "fleet changes other than max_disrupted, slot_wait and correlated_share take effect only "
                "after a restart"
            )
        self.config = config
        self._apply_gateway(config)
        self.hub.update(config.notifiers)
        self.hub.external_labels = config.global_.external_labels
        self.remediator.apply(config, {k: v[1] for k, v in self.runtimes.items()})
        added = [n for n, (_, rt) in self.runtimes.items() if old.get(n, (None, None))[1] is not rt]
        children = [n for n in added if hasattr(self.runtimes[n][1], "ensure_running")]
        if children:
            self._background.spawn(self._start_added(children), "actions:start-added")

    async def _start_added(self, names: list[str]) -> None:
        """Start the children of process-mode targets a reload added, after any flow still running on a
        target of that name (its old runtime may be starting a child itself) and after start-up reconcile."""
        await self.remediator.reconciled.wait()
        for name in names:
            await self.remediator.jobs.finished(name)
        if self._unrecordable():
            log.error(
                "state_dir is not writable: process-mode vLLM added by a reload starts once it is",
                extra={"state_dir": self.config.state_dir, "targets": names},
            )
            self._deferred = True
            return
        try:
            await self._ensure_children(names)
        except Exception:
            log.exception("starting process-mode vLLM added by a reload failed")

    async def _retire(self, name: str, runtime: Runtime) -> None:
        """A runtime a reload replaced or dropped: closed once the flow running on its target ended (the
        flow holds it). The child of a process-mode target that left the config is stopped first: the
        watchdog started it, and nothing would supervise it any more (docs/configuration.md#reloading)."""
        await self.remediator.jobs.finished(name)
        if isinstance(runtime, ProcessRuntime) and name not in self.runtimes:
            unrecordable = self._unrecordable()
            await retire_child(
                name, runtime, self.store, self.clock, dry_run=self.config.dry_run, unrecordable=unrecordable
            )
        await runtime.close()

    def _apply_gateway(self, config: Config) -> None:
        gw, new = self.gateway, config.gateway
        if gw is None or new is None:
            if (gw is None) != (new is None):
                log.warning("adding or removing the gateway takes effect only after a restart")
            return
        old = gw.config
        if (new.listen_host, new.listen_port, new.target, new.upstream) != (
            old.listen_host,
            old.listen_port,
            old.target,
            old.upstream,
        ):
            log.warning("gateway listen, target and upstream changes take effect only after a restart")
            return
        self._background.spawn(gw.apply(new), "gateway:apply")

    async def gateway_tick(self) -> GatewaySnapshot | None:
        """Move the throttle one step and take the gateway's snapshot (None without a gateway)."""
        if self.gateway is None:
            return None
        return await self.gateway.tick()

    def on_alerts(self, alerts: list[OutgoingAlert], now: float) -> None:
        """Alerts the rule manager decided to send: to the notifiers, and through the routes to actions."""
        if not alerts:
            return
        self.hub.alerts(alerts, now)
        self.remediator.handle(alerts, now)
        for alert in alerts:  # what the fleet's members show each other
            key = (
                alert.labels.get("alertname", ""),
                alert.labels.get("target", alert.labels.get("instance", "")),
            )
            if alert.state == "firing":
                self._firing[key] = alert.ends_at or now + FIRING_HOLD
            elif alert.state != "firing":
                self._firing.pop(key, None)

    async def deliver(self, now: float) -> None:
        """One delivery pass of the notification queues."""
        await self.hub.deliver(now)

    async def tick(self, now: float) -> None:
        """The state_dir probe, restores, process supervision and own alerts."""
        if self.health is not None and self.health.tick(self.monotonic()) and self._deferred:
            self._deferred = False
            self._background.spawn(self._start(), "actions:start")
        if self.remediator.reconciled.is_set():
            await self.remediator.tick(now)
        if self.fleet is not None:
            self.fleet.publish(self._membership(now), now)

    def _membership(self, now: float) -> dict[str, object]:
        """What this member shows the fleet: its targets, firing alerts, running and waiting actions."""
        for key, until in list(self._firing.items()):
            if until < now:
                del self._firing[key]
        return {
            "targets": [t.name for t in self.config.targets],
            "alerts": sorted(f"{name} ({target})" if target else name for name, target in self._firing),
            "running": {t: j.action.name for t, j in self.remediator.current.items()},
            "waiting": {t: a for t, (a, _) in self.fleet.waiting.items()} if self.fleet else {},
        }

    async def aclose(self) -> None:
        """Stop workers and close clients; never stops a vLLM server."""
        if self.gateway is not None:
            await self.gateway.aclose(grace=3.0)
        await self.remediator.aclose()
        self._background.cancel()
        if self.fleet is not None:
            await self.fleet.aclose()
        for _, runtime in self.runtimes.values():
            await runtime.close()
        await self.hub.aclose()
        await self.client.aclose()
        self.store.close()
