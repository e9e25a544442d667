"""The daemon: scheduler, signals, reloads, systemd notification and the own API server."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import signal
import socket
import ssl
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import httpx
import uvicorn
from apscheduler.events import (
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
    JobEvent,
    JobSubmissionEvent,
)
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from prometheus_client import CollectorRegistry

from .. import logs
from ..actions.metrics import ActionCollector
from ..actions.plane import ActionPlane
from ..api.app import build_app
from ..config.model import Config, load_config
from ..errors import ConfigError
from ..fdlimits import AcceptErrors, FdCollector, FdReserve, reserving_listener
from ..gateway.feed import GatewayFeed
from ..gateway.metrics import GatewayCollector, exposition
from ..gateway.process import process_link
from ..listener import Listener, ListenerCollector, ListenerLimits
from ..redact import config_secrets
from ..ruler.evaluation import RuleEvaluation
from ..ruler.files import RuleGroup, load_rule_files
from ..scrapelog import ScrapeLog
from ..sdnotify import Notifier
from ..sources.gpu import GpuCollector
from ..sources.monitor import Monitor
from ..sources.nvml import NvmlSource
from ..sources.selffeed import SelfFeed
from .clockwatch import ClockWatch
from .selfmetrics import DaemonCounters, WatchdogCollector

log = logging.getLogger(__name__)
GC_INTERVAL = 15.0
SHUTDOWN_GRACE = 3.0
# The own API serves a few scrapers, probes and operators: a small cap, and headers within 10 s.
API_LIMITS = ListenerLimits(max_connections=512, header_timeout=10.0)
GATEWAY_JOB = "vllm-watchdog-gateway"  # the job label of the gateway's series in a scrape log (run --record)


def load_all(path: str | None, env: Mapping[str, str]) -> tuple[Config, tuple[RuleGroup, ...]]:
    """Load config and every rule file it names; one ConfigError carries all problems."""
    try:
        config = load_config(path, env)
    except ConfigError as exc:
        try:
            load_rule_files(exc.rule_files)
        except ConfigError as rules_exc:
            raise ConfigError(exc.problems + rules_exc.problems) from exc
        raise
    return config, load_rule_files(config.rule_files)


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the daemon owns SIGTERM/SIGHUP."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _offset(name: str, interval: float) -> float:
    """A stable per-job start offset that spreads targets across the interval, as Prometheus does."""
    return (zlib.crc32(name.encode()) % 1000) / 1000 * interval


class Daemon:
    """Runs one Monitor on a schedule until SIGTERM; SIGHUP reloads config and rules."""

    def __init__(
        self,
        config_path: str | None,
        *,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        transport: httpx.AsyncBaseTransport | None = None,
        nvml: Any | None = None,
        keep_all: bool = False,
        record: str | None = None,
        record_max_bytes: int = 64 << 20,
        record_keep: int = 8,
        docker_client: Callable[[], Any] | None = None,
        systemctl: tuple[str, ...] = ("systemctl",),
        api_limits: ListenerLimits = API_LIMITS,
        external_gateway: bool = False,
    ) -> None:
        self.config_path = config_path
        self.external_gateway = external_gateway  # systemd or compose runs the gateway process: attach only
        self.env = dict(os.environ if env is None else env)
        self.clock = clock
        self.monotonic = monotonic
        self.transport = transport
        self.nvml = nvml
        self.keep_all = keep_all
        self.counters = DaemonCounters()
        self.notifier = Notifier(self.env)
        self.scheduler: AsyncIOScheduler | None = None
        self.monitor: Monitor | None = None
        self.evaluation: RuleEvaluation | None = None
        self.actions: ActionPlane | None = None
        self.docker_client = docker_client
        self.systemctl = systemctl
        self.api_listener = Listener(api_limits, _api_error_body)
        self.record = (record, record_max_bytes, record_keep)
        self.scrapelog: ScrapeLog | None = None
        self.stop_event: asyncio.Event | None = None
        self.gateway_feed: GatewayFeed | None = None
        self.self_feed: SelfFeed | None = None
        self.last_progress = monotonic()
        self._running: set[asyncio.Task[Any]] = set()
        self._tls: ssl.SSLContext | None = None

    # -- jobs -------------------------------------------------------------------------------
    def _job(self, fn: Callable[[float], Any]) -> Callable[[], Any]:
        async def run() -> None:
            task = asyncio.current_task()
            if task is not None:
                self._running.add(task)
            try:
                await fn(self.clock())
            except Exception:  # a bug in one job must not stop the schedule
                log.exception("job failed")
            finally:
                if task is not None:
                    self._running.discard(task)
            self.last_progress = self.monotonic()

        return run

    def _schedule(self, config: Config) -> None:
        assert self.scheduler is not None and self.monitor is not None
        sched, mon = self.scheduler, self.monitor
        sched.remove_all_jobs()
        g = config.global_
        now = self.clock()

        def add(job_id: str, fn: Callable[[float], Any], interval: float) -> None:
            start = now + _offset(job_id, interval)
            sched.add_job(
                self._job(fn),
                "interval",
                seconds=interval,
                id=job_id,
                max_instances=1,
                coalesce=True,
                misfire_grace_time=max(round(interval), 1),
                # No APScheduler jitter: 3.x adds it to the previous, already jittered fire time, so periods
                # drift long and ~2.5% of 1 s scrapes silently vanish. A stable per-job offset spreads jobs
                # instead, as Prometheus spreads its targets.
                next_run_time=_datetime(start),
            )

        for name, rt in mon.targets.items():
            add(f"scrape:{name}", functools.partial(self._scrape, name), g.scrape_interval)
            if rt.config.health_probe:
                add(f"health:{name}", functools.partial(mon.probe_health, name), g.scrape_interval)
            if rt.canary is not None:
                add(
                    f"canary:{name}",
                    functools.partial(mon.probe_canary, name),
                    rt.config.canary.interval,
                )
        if self.evaluation is not None:
            ev = self.evaluation
            for key in ev.group_keys():
                add(f"eval:{key[0]};{key[1]}", functools.partial(ev.evaluate, key), ev.interval(key))
        if self.actions is not None:
            add("notify", self.actions.deliver, 1.0)
            add("actions", self.actions.tick, 1.0)
            if self.actions.gateway is not None:
                add("gateway", self._gateway_tick, 1.0)
        if self.self_feed is not None:
            add("self", self._feed_self, g.evaluation_interval)
        if mon.dcgm is not None:
            add("scrape:dcgm", mon.scrape_dcgm, g.scrape_interval)
        if mon.gpu is not None:
            add("nvml", mon.collect_gpus, g.scrape_interval)
        add("gc", self._gc, GC_INTERVAL)
        if self.scrapelog is not None:
            add("scrapelog", self._flush_log, 1.0)
        if self.notifier.watchdog_interval is not None:
            add("systemd-watchdog", self._ping, self.notifier.watchdog_interval)

    async def _scrape(self, name: str, now: float) -> None:
        """Scrape one target, then evaluate the rule groups that are due on the fresh samples."""
        assert self.monitor is not None
        await self.monitor.scrape(name, now)
        if self.evaluation is not None:
            self.evaluation.after_scrape(self.clock())

    async def _gateway_tick(self, now: float) -> None:
        """The gateway's signals go straight into the sample store: no scrape, no lag."""
        assert self.actions is not None and self.monitor is not None
        if self.gateway_feed is None:
            self.gateway_feed = GatewayFeed(self.monitor.store)
        snap = await self.actions.gateway_tick()
        self.gateway_feed.commit(snap, int(now * 1000))
        if self.scrapelog is not None and snap is not None:  # recorded as a scrape, so `replay` sees it
            body = exposition(snap)
            self.scrapelog.record_scrape(t=now, job=GATEWAY_JOB, instance=snap.target, labels={}, body=body)

    async def _feed_self(self, now: float) -> None:
        """The own metrics that rules read go into the store (job="vllm-watchdog"), as a scrape would."""
        assert self.self_feed is not None
        self.self_feed.commit(int(now * 1000))

    async def _gc(self, now: float) -> None:
        assert self.monitor is not None
        self.monitor.gc(now)

    async def _flush_log(self, now: float) -> None:
        if self.scrapelog is not None:
            self.scrapelog.flush()

    async def _ping(self, now: float) -> None:
        if self.healthy():
            self.notifier.ping()

    def healthy(self) -> bool:
        """The scheduler runs and some job finished recently."""
        if self.scheduler is None or not self.scheduler.running or self.monitor is None:
            return False
        slack = 3 * max(self.monitor.config.global_.scrape_interval, GC_INTERVAL)
        return self.monotonic() - self.last_progress < slack

    def _on_missed(self, event: JobEvent) -> None:
        self.counters.missed(_job_kind(event.job_id))

    def _on_submitted(self, event: JobSubmissionEvent) -> None:
        # A coalesced run stands for several due times; each extra one is a missed deadline.
        for _ in event.scheduled_run_times[1:]:
            self.counters.missed(_job_kind(event.job_id))

    # -- config -----------------------------------------------------------------------------
    async def reload(self) -> tuple[bool, list[str]]:
        """Load config and rules again; on any error keep the old ones and report every problem."""
        assert self.monitor is not None
        try:
            config, rules = load_all(self.config_path, self.env)
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
        self.monitor.apply(config, rules, now=self.clock())
        assert self.evaluation is not None
        self.evaluation.apply(config, rules)
        self._attach_gpu(config)
        assert self.actions is not None
        self.actions.apply(config)
        self._schedule(config)
        await self.monitor.close_retired()
        self.counters.reloads_ok += 1
        self.counters.last_reload_ok = True
        self.counters.config_errors = 0
        log.info("config reloaded", extra={"targets": len(config.targets), "groups": len(rules)})
        return True, []

    def _attach_gpu(self, config: Config) -> None:
        assert self.monitor is not None
        mon = self.monitor
        if config.gpus.nvml and mon.gpu is None:
            source = NvmlSource(nvml=self.nvml)
            mon.gpu = GpuCollector(source, mon.store, instance=socket.gethostname())
        elif not config.gpus.nvml and mon.gpu is not None:
            mon.gpu.close()
            mon.gpu = None

    # -- lifecycle --------------------------------------------------------------------------
    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Run until SIGTERM/SIGINT (or stop()); raises ConfigError if the first config is invalid."""
        config, rules = load_all(self.config_path, self.env)
        logs.use_secrets(config_secrets(config))  # before anything logs a value from the config
        if not config.listens_on_loopback:
            log.warning("own API listens beyond loopback", extra={"listen": config.listen_host})
        loop = asyncio.get_running_loop()
        AcceptErrors().install(loop)  # out of descriptors at accept: a line a minute, not a traceback each
        fd_guard = FdReserve()  # descriptors that API clients cannot take from scrapes and state writes
        self.stop_event = asyncio.Event()
        path, max_bytes, keep = self.record
        if path is not None:
            self.scrapelog = ScrapeLog(path, max_bytes=max_bytes, keep=keep, clock=self.clock)
        self.monitor = Monitor(
            config,
            rules,
            client_factory=self._new_client,
            keep_all=self.keep_all,
            monotonic=self.monotonic,
            recorder=self.scrapelog,
        )
        mon = self.monitor
        self.evaluation = RuleEvaluation(
            config,
            rules,
            mon.store,
            monotonic=self.monotonic,
            ready=lambda: all(rt.scrape.status.scrapes > 0 for rt in mon.targets.values()),
        )
        self._attach_gpu(config)
        kwargs: dict[str, Any] = {} if self.docker_client is None else {"docker_client": self.docker_client}
        if self.external_gateway:
            kwargs["gateway_link"] = lambda gw, state_dir: process_link(
                replace(gw, supervise=False), state_dir
            )
        self.actions = ActionPlane(
            config,
            lambda: self._evaluation().engine,
            self._new_client,
            nvml=self._nvml_module(),
            systemctl=self.systemctl,
            clock=self.clock,
            monotonic=self.monotonic,
            engine_state=mon.engine_state,
            **kwargs,
        )
        self.evaluation.on_alerts = self.actions.on_alerts
        registry = CollectorRegistry(auto_describe=False)
        watchdog = WatchdogCollector(mon, self.counters, self.evaluation, lambda: self._actions().health)
        own = (watchdog, ActionCollector(self._actions))
        for collector in own:
            registry.register(collector)
        host = f"[{config.listen_host}]" if ":" in config.listen_host else config.listen_host
        self.self_feed = SelfFeed(mon.store, own, f"{host}:{config.listen_port}", lambda: mon.keep_names)
        registry.register(GatewayCollector(lambda: g.snapshot if (g := self._actions().gateway) else None))
        registry.register(ListenerCollector("vllm_watchdog_api_", lambda: self.api_listener))
        registry.register(FdCollector(fd_guard))
        app = build_app(
            self._monitor,
            self._evaluation,
            registry,
            lambda: self._monitor().config.api_token,
            self.reload,
            self.healthy,
            lambda: self._actions().remediator,
            self.clock,
            lambda: self._actions().gateway,
        )
        server = _EmbeddedServer(
            uvicorn.Config(
                app,
                host=config.listen_host,
                port=config.listen_port,
                log_config=None,
                access_log=False,
                lifespan="off",
                http=self.api_listener.protocol(),  # connection cap, header deadline and size (431)
            )
        )
        self.scheduler = AsyncIOScheduler(event_loop=loop)
        self.scheduler.add_listener(self._on_missed, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
        self.scheduler.add_listener(self._on_submitted, EVENT_JOB_SUBMITTED)
        self._schedule(config)
        sock = reserving_listener(config.listen_host, config.listen_port, fd_guard)  # fails loudly if in use
        server_task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if server_task.done():
                server_task.result()
                raise OSError("API server exited during start-up")
            await asyncio.sleep(0.01)
        await self.actions.start()
        self.scheduler.start()
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
        await self.stop_event.wait()
        log.info("shutting down")
        self.notifier.stopping()
        self.scheduler.shutdown(wait=False)
        clock_task.cancel()
        server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(server_task, SHUTDOWN_GRACE)
        await _cancel(self._running, SHUTDOWN_GRACE)
        await self.actions.aclose()
        if self.monitor.gpu is not None:
            self.monitor.gpu.close()
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
            if not skew or self.monitor is None:
                continue
            dropped = 0
            if skew < 0:
                dropped = self.monitor.store.drop_after(math.floor(self.clock() * 1000))
                if self.evaluation is not None:
                    self.evaluation.last_eval.clear()
            self._schedule(self.monitor.config)
            log.warning(
                "wall clock jumped: jobs rescheduled from the new time",
                extra={"seconds": round(skew, 3), "samples_dropped": dropped},
            )

    def _new_client(self) -> httpx.AsyncClient:
        """An HTTP client for one target; trust_env=False keeps proxies from redirecting traffic."""
        if self._tls is None:  # one CA bundle in memory, not one per target (~0.6 MiB each)
            self._tls = ssl.create_default_context()
        limits = httpx.Limits(max_connections=8, max_keepalive_connections=4)
        return httpx.AsyncClient(transport=self.transport, limits=limits, trust_env=False, verify=self._tls)

    def _monitor(self) -> Monitor:
        assert self.monitor is not None
        return self.monitor

    def _actions(self) -> ActionPlane:
        assert self.actions is not None
        return self.actions

    def _nvml_module(self) -> Any | None:
        """The NVML module for gpu_power_limit: the injected one (tests), else pynvml if installed."""
        if self.nvml is not None:
            return self.nvml
        try:
            import pynvml  # noqa: PLC0415 - lazy: the package works without a GPU stack
        except ImportError:
            return None
        return pynvml

    def _evaluation(self) -> RuleEvaluation:
        assert self.evaluation is not None
        return self.evaluation

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGTERM, self.stop)
            loop.add_signal_handler(signal.SIGINT, self.stop)
            loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))

    def stop(self) -> None:
        """Ask the daemon to shut down."""
        if self.stop_event is not None:
            self.stop_event.set()


def _job_kind(job_id: object) -> str:
    """`scrape:vllm-0` -> `scrape`: the label of the missed-deadline counter."""
    return str(job_id).split(":")[0]


def _api_error_body(status: int, reason: str, message: str) -> bytes:
    """The own API's JSON error (as controlapi.error_response writes it), for the listener's refusals."""
    return json.dumps({"status": "error", "error": message, "reason": reason}).encode()


async def _cancel(running: set[asyncio.Task[Any]], grace: float) -> None:
    """Cancel the daemon's in-flight jobs (scrapes, probes), and only those."""
    tasks = [t for t in running if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=grace)


def _datetime(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)
