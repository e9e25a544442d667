"""The daemon: builds every stage from one config, runs their jobs, reloads on SIGHUP, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import signal
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from .. import logs
from ..actions.runtimes.targetruntimes import docker_from_env
from ..api.app import ApiOptions, build_app
from ..api.server import API_LIMITS, api_error_body, api_server
from ..config.httpauth import ClientSettings
from ..config.model import Config
from ..config.targets import TargetConfig
from ..discovery.providers import DiscoveryOptions, TargetDiscovery
from ..errors import ConfigError
from ..fdlimits import AcceptErrors, FdReserve, reserving_listener
from ..gateway.control.feed import GatewayFeed
from ..gateway.control.metrics import exposition
from ..gateway.control.process import process_link
from ..integrity.verdict import Verdict, unknown
from ..listener import Listener, ListenerLimits
from ..redact import config_secrets
from ..ruler.evaluation import RuleEvaluation, RuleEvaluationOptions
from ..ruler.files import RuleGroup, store_needs
from ..sdnotify import Notifier
from ..sources.monitor import Monitor, MonitorOptions, client_for
from .actionplane import ActionPlane
from .actionwiring import ActionPlaneOptions
from .clockwatch import ClockWatch
from .integritywiring import IntegrityWiring, audit_event
from .loading import load_all
from .schedule import Job, Schedule
from .sdstatus import daemon_status
from .selfmetrics import DaemonCounters
from .wiring import attach_only, nvml_module, own_metrics, scrape_log

log = logging.getLogger(__name__)
GC_INTERVAL = 15.0
SHUTDOWN_GRACE = 3.0
GATEWAY_JOB = "vllm-watchdog-gateway"  # the job label of the gateway's series in a scrape log (run --record)


@dataclass(frozen=True)
class DaemonOptions:
    """How a Daemon runs: its config file and environment, the clocks, and what tests and the command line
    replace (HTTP transport, NVML, Docker, systemctl, the own API's limits, a scrape log, a gateway run
    by systemd or compose)."""

    config_path: str | None = None  # None: the embedded defaults
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    transport: httpx.AsyncBaseTransport | None = None
    nvml: Any | None = None  # None: pynvml, if installed
    keep_all: bool = False
    record: str | None = None  # `run --record`: every scrape and probe to a scrape log, for `replay`
    record_max_bytes: int = 64 << 20
    record_keep: int = 8
    docker_client: Callable[[], Any] = docker_from_env
    systemctl: tuple[str, ...] = ("systemctl",)
    api_limits: ListenerLimits = API_LIMITS
    external_gateway: bool = False  # systemd or compose runs the gateway process: attach only


class Daemon:
    """Runs one Monitor on a schedule until SIGTERM; SIGHUP reloads config and rules. Built whole from a
    loaded config (see `load`), it runs once."""

    def __init__(self, config: Config, rules: tuple[RuleGroup, ...], options: DaemonOptions) -> None:
        logs.use_secrets(config_secrets(config))  # before anything logs a value from the config
        # Discovered targets join the config's before any stage is built: start-up reconcile must see them.
        self.discovery = TargetDiscovery(config, DiscoveryOptions(options.docker_client, options.clock))
        self.discovery.first_look()
        config = self.discovery.effective()
        if not config.listens_on_loopback:
            log.warning("own API listens beyond loopback", extra={"listen": config.listen_host})
        self.options = options
        self.clock, self.monotonic = options.clock, options.monotonic
        self.counters = DaemonCounters()
        self.notifier = Notifier(options.env)
        self.api_listener = Listener(options.api_limits, api_error_body)
        self.fd_guard = FdReserve()  # descriptors that API clients cannot take from scrapes and state writes
        # One CA bundle in memory for every target's client, not one each (~0.6 MiB).
        self._tls = ssl.create_default_context()
        self.scrapelog = scrape_log(options.record, options.record_max_bytes, options.record_keep, self.clock)
        self.rules = rules
        needs = store_needs(rules, config.global_.lookback_delta)
        self.monitor = mon = Monitor(config, self._monitor_options(), needs)
        self.actions = actions = ActionPlane(config, self._action_options(mon))
        self.integrity = IntegrityWiring(
            config, mon, self._answers_checked, audit_event(actions.store, self.clock)
        )
        self.evaluation = RuleEvaluation(config, rules, mon.store, self._evaluation_options())
        self.gateway_feed = GatewayFeed(mon.store)
        registry, self.self_feed = own_metrics(
            mon,
            self.counters,
            self.evaluation,
            actions,
            lambda: self.api_listener,
            self.fd_guard,
            self.discovery,
        )
        registry.register(self.integrity.collector())
        app = build_app(self._api_options(registry))
        self.server = api_server(app, config.listen_host, config.listen_port, self.api_listener)
        self.schedule = Schedule(self.counters, self.clock, self.monotonic)
        self._stop = asyncio.Event()

    @classmethod
    def load(cls, options: DaemonOptions) -> Daemon:
        """Load the config and its rule files, then build the daemon; ConfigError carries every problem."""
        config, rules = load_all(options.config_path, options.env)
        return cls(config, rules, options)

    def _monitor_options(self) -> MonitorOptions:
        return MonitorOptions(
            client_factory=self._new_client,
            nvml=self.options.nvml,
            keep_all=self.options.keep_all,
            monotonic=self.monotonic,
            recorder=self.scrapelog,
        )

    def _evaluation_options(self) -> RuleEvaluationOptions:
        mon = self.monitor
        return RuleEvaluationOptions(
            monotonic=self.monotonic,
            ready=lambda: all(rt.scrape.status.scrapes > 0 for rt in mon.targets.values()),
            on_alerts=self.actions.on_alerts,
        )

    def _api_options(self, registry: CollectorRegistry) -> ApiOptions:
        return ApiOptions(
            self.monitor,
            self.evaluation,
            self.actions.remediator,
            registry,
            self.reload,
            self.healthy,
            gateway=self.actions.gateway,
            clock=self.clock,
            monotonic=self.monotonic,
            ready=lambda: self.schedule.running,  # as Prometheus: ready once started, not after a scrape
        )

    def _action_options(self, mon: Monitor) -> ActionPlaneOptions:
        return ActionPlaneOptions(
            engine=lambda: self.evaluation.engine,  # the evaluation is built next, and feeds this plane
            client_factory=self._new_client,
            nvml=nvml_module(self.options.nvml),
            docker_client=self.options.docker_client,
            systemctl=self.options.systemctl,
            clock=self.clock,
            monotonic=self.monotonic,
            gateway_link=attach_only if self.options.external_gateway else process_link,
            engine_state=mon.engine_state,
            ready_since=mon.ready_since,
            verify_answers=self._verify_answers,
            firing=lambda: self.evaluation.manager.alerts_json()["data"]["alerts"],
        )

    # -- jobs -------------------------------------------------------------------------------
    def _schedule(self, config: Config) -> None:
        """(Re)build the job list from the config: scrapes, probes, rule groups, actions and own upkeep."""
        g, mon, ev, actions = config.global_, self.monitor, self.evaluation, self.actions
        jobs: list[Job] = []
        for name, rt in mon.targets.items():
            jobs.append((f"scrape:{name}", functools.partial(self._scrape, name), g.scrape_interval))
            if rt.config.health_probe:
                jobs.append((f"health:{name}", functools.partial(mon.probe_health, name), g.scrape_interval))
                jobs.append((f"state:{name}", functools.partial(mon.probe_state, name), g.scrape_interval))
            if rt.canary is not None:
                interval = rt.config.canary.interval
                jobs.append((f"canary:{name}", functools.partial(mon.probe_canary, name), interval))
        for key in ev.group_keys():
            jobs.append((f"eval:{key[0]};{key[1]}", functools.partial(ev.evaluate, key), ev.interval(key)))
        jobs += self.integrity.jobs()
        jobs += [("notify", actions.deliver, 1.0), ("actions", actions.tick, 1.0)]
        jobs.append(("api", self.server.tick, 1.0))  # the Date header
        for name, interval in self.discovery.jobs():
            jobs.append((f"discovery:{name}", functools.partial(self._discover, name), interval))
        if actions.gateway is not None:
            jobs.append(("gateway", self._gateway_tick, 1.0))
        jobs.append(("self", self._feed_self, g.evaluation_interval))
        for name in mon.exporters:
            jobs.append((f"scrape:{name}", functools.partial(mon.scrape_exporter, name), g.scrape_interval))
        if mon.gpu is not None:
            jobs.append(("nvml", mon.collect_gpus, g.scrape_interval))
        jobs.append(("gc", self._gc, GC_INTERVAL))
        if self.scrapelog is not None:
            jobs.append(("scrapelog", self._flush_log, 1.0))
        if self.notifier.watchdog_interval is not None:
            jobs.append(("systemd-watchdog", self._ping, self.notifier.watchdog_interval))
        if self.notifier.enabled:
            jobs.append(("systemd-status", self._status, 1.0))
        self.schedule.replace(jobs)

    async def _scrape(self, name: str, now: float) -> None:
        """Scrape one target, then evaluate the rule groups that are due on the fresh samples."""
        await self.monitor.scrape(name, now)
        self.evaluation.after_scrape(self.clock(), scraped_at=now)

    async def _discover(self, name: str, now: float) -> None:
        """Look through one discovery; changed targets apply as a reload of the targets would."""
        if await self.discovery.refresh(name):
            self._adopt(self.discovery.effective(), self.rules)
            await self.monitor.close_retired()

    async def _gateway_tick(self, now: float) -> None:
        """The gateway's signals go straight into the sample store: no scrape, no lag."""
        snap = await self.actions.gateway_tick()
        self.gateway_feed.commit(snap, int(now * 1000))
        if self.scrapelog is not None and snap is not None:  # recorded as a scrape, so `replay` sees it
            body = exposition(snap)
            self.scrapelog.record_scrape(t=now, job=GATEWAY_JOB, instance=snap.target, labels={}, body=body)

    def _answers_checked(self, target: str, verdict: Verdict, now: float) -> None:
        """Each periodic known-answer verdict: where the remediator's quarantine book hears it."""
        self.actions.remediator.answers_checked(target, verdict, now)

    async def _verify_answers(self, target: TargetConfig, now: float) -> Verdict:
        """A restart's or relaunch's check of the known answers before it undrains; a target the known-answer
        check does not watch (integrity off, canary off) cannot tell."""
        if target.name not in self.integrity.checked():
            return unknown("no known-answer check on this target")
        return await self.integrity.answers.verify(target, now)

    async def _feed_self(self, now: float) -> None:
        """The own metrics that rules read go into the store (job="vllm-watchdog"), as a scrape would."""
        self.self_feed.commit(int(now * 1000))

    async def _gc(self, now: float) -> None:
        self.monitor.gc(now)

    async def _flush_log(self, now: float) -> None:
        if self.scrapelog is not None:
            self.scrapelog.flush()

    async def _ping(self, now: float) -> None:
        if self.healthy():
            self.notifier.ping()

    async def _status(self, now: float) -> None:
        """`systemctl status` shows targets up, alerts firing and actions running; sent when it changes."""
        self.notifier.status(daemon_status(self.monitor, self.evaluation, self.actions))

    def healthy(self) -> bool:
        """The scheduler runs and some job finished recently."""
        if not self.schedule.running:
            return False
        slack = 3 * max(self.monitor.config.global_.scrape_interval, GC_INTERVAL)
        return self.monotonic() - self.schedule.last_progress < slack

    # -- config -----------------------------------------------------------------------------
    async def reload(self) -> tuple[bool, list[str]]:
        """Load config and rules again; on any error keep the old ones and report every problem. systemd
        hears RELOADING=1 before and READY=1 after, whatever the outcome (`vllm-watchdog reload` reports it).
        """
        self.notifier.reloading()
        try:
            return await self._reload()
        finally:
            self.notifier.ready()

    async def _reload(self) -> tuple[bool, list[str]]:
        try:
            config, rules = load_all(self.options.config_path, self.options.env)
        except ConfigError as exc:
            self.counters.reloads_failed += 1
            self.counters.last_reload_ok = False
            self.counters.config_errors = len(exc.problems)
            for problem in exc.problems:
                log.error("reload rejected; keeping the old config", extra={"problem": str(problem)})
            return False, [str(p) for p in exc.problems]
        logs.use_secrets(config_secrets(config))
        old = self.monitor.config
        if (config.listen_host, config.listen_port) != (old.listen_host, old.listen_port):
            log.warning("listen address changes take effect only after a restart")
        await self.discovery.apply(config)  # new discoveries look now; the others keep what they found
        self._adopt(self.discovery.effective(), rules)
        await self.monitor.close_retired()
        self.counters.reloads_ok += 1
        self.counters.last_reload_ok = True
        self.counters.config_errors = 0
        log.info("config reloaded", extra={"targets": len(config.targets), "groups": len(rules)})
        return True, []

    def _adopt(self, config: Config, rules: tuple[RuleGroup, ...]) -> None:
        """Apply a config to every stage: a reload, or the targets the discoveries found."""
        self.rules = rules
        self.monitor.apply(config, store_needs(rules, config.global_.lookback_delta), now=self.clock())
        self.evaluation.apply(config, rules)
        self.actions.apply(config)
        self.integrity.apply(config)
        self._schedule(config)

    # -- lifecycle --------------------------------------------------------------------------
    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Run until SIGTERM/SIGINT (or stop()); raises OSError if the API's address cannot be bound."""
        config = self.monitor.config
        loop = asyncio.get_running_loop()
        AcceptErrors().install(loop)  # out of descriptors at accept: a line a minute, not a traceback each
        self._schedule(config)
        sock = reserving_listener(
            config.listen_host, config.listen_port, self.fd_guard
        )  # fails loudly if in use
        server_task = asyncio.create_task(self.server.serve(sockets=[sock]))
        while not self.server.started:
            if server_task.done():
                server_task.result()
                raise OSError("API server exited during start-up")
            await asyncio.sleep(0.01)
        await self.actions.start()
        self.schedule.start()
        clock_task = asyncio.create_task(self._watch_clock(), name="clockwatch")
        self._install_signals(loop)
        self.notifier.ready()
        log.info(
            "watchdog started",
            extra={
                "targets": [t.name for t in config.targets],
                "listen": f"{config.listen_host}:{config.listen_port}",
            },
        )
        if ready is not None:
            ready.set()
        await self._stop.wait()
        log.info("shutting down")
        self.notifier.stopping()
        self.schedule.shutdown()
        clock_task.cancel()
        self.server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(server_task, SHUTDOWN_GRACE)
        await self.schedule.cancel_running(SHUTDOWN_GRACE)
        await self.actions.aclose()
        await self.integrity.aclose()
        self.discovery.close()
        await self.monitor.aclose()
        if self.scrapelog is not None:
            self.scrapelog.close()

    async def _watch_clock(self) -> None:
        """Every second, on the loop's monotonic timers: after a wall-clock jump, start the schedule again
        from the new time; after a jump back, also drop the samples now in the future and let groups evaluate.
        """
        watch = ClockWatch(self.clock, self.monotonic)
        self.counters.clock_jumps = watch.jumps
        while True:
            await asyncio.sleep(1.0)
            skew = watch.check()
            if not skew:
                continue
            dropped = 0
            if skew < 0:
                dropped = self.monitor.store.drop_after(math.floor(self.clock() * 1000))
                self.evaluation.last_eval.clear()
            self._schedule(self.monitor.config)
            log.warning(
                "wall clock jumped: jobs rescheduled from the new time",
                extra={"seconds": round(skew, 3), "samples_dropped": dropped},
            )

    def _new_client(
        self, settings: ClientSettings | None = None, tls: ssl.SSLContext | None = None
    ) -> httpx.AsyncClient:
        """An HTTP client for one target or notifier, with its TLS context and credentials where it has them;
        trust_env=False keeps proxies from redirecting traffic."""
        limits = httpx.Limits(max_connections=8, max_keepalive_connections=4)
        return client_for(settings, tls, transport=self.options.transport, limits=limits, verify=self._tls)

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGTERM, self.stop)
            loop.add_signal_handler(signal.SIGINT, self.stop)
            loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))

    def stop(self) -> None:
        """Ask the daemon to shut down."""
        self._stop.set()
