"""The monitor: every source of one config feeding one sample store, rebuilt in place on reload."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import httpx

from ..config.addresses import scrape_address
from ..config.httpauth import ClientSettings, CredentialError, sign
from ..config.httpclient import HttpClientConfig
from ..config.limits import ScrapeLimits
from ..config.model import Config
from ..config.targets import TargetConfig
from ..logs import Recurring
from ..scrapelog import ScrapeLog
from ..store import SampleStore, make_labels
from .enginestate import STATE_SERIES, EngineStateProbe, asleep_in_store
from .gpu import GpuCollector
from .nvml import NvmlSource
from .outages import EXPORTER, EXPORTER_BOUNDS, outage_summary
from .probes import PROBE_SERIES, CanaryProbe, HealthProbe, ProbeStatus
from .scrape import OUT_OF_BOUNDS, ScrapeStatus, ScrapeTarget
from .storeneeds import NO_RULES, StoreNeeds

log = logging.getLogger(__name__)

GC_SLACK = 30.0  # seconds of history kept beyond what rules need, so gc can run lazily
SUMMARY_EVERY = 300.0  # seconds between summaries while a target is down (one line per scrape otherwise)


@dataclass
class TargetRuntime:
    """Everything that watches one configured target."""

    config: TargetConfig
    scrape: ScrapeTarget  # its own kept-alive connection
    client: httpx.AsyncClient  # the canary's and the engine state probe's
    health: HealthProbe
    canary: CanaryProbe | None
    state: EngineStateProbe  # paused or asleep on purpose (dev-mode endpoints)
    labels: dict[str, str] = field(default_factory=dict)
    settings: ClientSettings | None = None  # the target's TLS and credentials, where it has any
    client_tls: ssl.SSLContext | None = None  # the context `client` was built with


def client_for(
    settings: ClientSettings | None = None, tls: ssl.SSLContext | None = None, **kwargs: Any
) -> httpx.AsyncClient:
    """An httpx client with these settings' TLS context and credentials (kwargs go to httpx, `verify` being
    the default context); trust_env=False keeps proxy variables from redirecting traffic."""
    default = kwargs.pop("verify", True)
    auth = (
        functools.partial(sign, settings) if settings is not None and settings.config.authenticates else None
    )
    return httpx.AsyncClient(trust_env=False, verify=tls or default, auth=auth, **kwargs)


@dataclass(frozen=True)
class MonitorOptions:
    """How a Monitor runs: what builds its HTTP clients, the NVML module, the clock, and what commands and
    tests replace (keep every family, record every scrape)."""

    # One client (and connection pool) per target: httpcore rescans its whole pool on every request, so a
    # single shared pool costs O(targets) per scrape. It is called with the target's ClientSettings and TLS
    # context where the target has TLS settings or credentials, else with no argument.
    client_factory: Callable[..., httpx.AsyncClient] = client_for
    nvml: Any | None = (
        None  # the NVML module of `gpus.nvml` (tests inject a fake); None: pynvml, if installed
    )
    hostname: str = field(default_factory=socket.gethostname)  # the instance of NVML's series
    keep_all: bool = False  # store every family, whether or not a rule reads it
    monotonic: Callable[[], float] = time.perf_counter
    recorder: ScrapeLog | None = None  # `run --record`: every scrape and probe, for `replay`


class Monitor:
    """Owns the store and the sources of the current config: targets, GPU exporters and NVML."""

    def __init__(self, config: Config, options: MonitorOptions, needs: StoreNeeds = NO_RULES) -> None:
        self.options = options
        self.client_factory, self.monotonic = options.client_factory, options.monotonic
        self.recorder = options.recorder
        self.retired: list[ScrapeTarget | HealthProbe | httpx.AsyncClient] = []
        # Failed scrapes and probes: a line when they start or change, then a summary every few minutes.
        self.warnings = Recurring(
            log, SUMMARY_EVERY, self.monotonic, lambda eps, now: outage_summary(eps, now, self.targets)
        )
        self.store = SampleStore(retention=0.0)
        self.gpu: GpuCollector | None = None  # NVML, while `gpus.nvml` is set
        self.targets: dict[str, TargetRuntime] = {}
        self.exporters: dict[str, ScrapeTarget] = {}  # the GPU exporters' scrapes, by exporter name
        self.keep_names: frozenset[str] | None = None
        self.config = config
        self.apply(config, needs, now=None)

    def apply(self, config: Config, needs: StoreNeeds, now: float | None) -> None:
        """Adopt a new config and what its rules read: keep unchanged targets (and their caches), build new
        ones, drop old."""
        g = config.global_
        keep_names = needs.kept_names(self.options.keep_all or g.keep_unreferenced)
        keep = keep_names.__contains__ if keep_names is not None else None
        margin = max(g.scrape_interval, g.evaluation_interval) + GC_SLACK
        self.store.retention = max(needs.max_lookback, g.lookback_delta) + margin
        # Each name for as long as its longest selector reads back: the bundled rules keep 40 minutes of the
        # few families a [30m] rate reads, and 5 of the rest (memory grows with the retention, for every
        # target). The API and the query command see the same history the rules do. A name no rule reads
        # (`up` and the other always kept, ALERTS) keeps the lookback, enough for an instant query and the
        # rails' look at the sleep state; it kept the longest range before, 40 minutes of a series per target.
        self.store.retention_by_name = {name: need + margin for name, need in needs.lookback_by_name.items()}
        filtered = keep_names is not None  # keep_unreferenced: every family, as long as the longest range
        self.store.other_retention = g.lookback_delta + margin if filtered else None
        old = self.targets
        same_scrape = self.config.global_ == g and self.keep_names == keep_names
        self.targets = {}
        for tc in config.targets:
            prev = old.pop(tc.name, None)
            if prev is not None and prev.config == tc and same_scrape:
                prev.config = tc  # the same target; what discovery says of it may be newer
                self.targets[tc.name] = prev
                continue
            if prev is not None:
                self._retire(prev, now)
            self.targets[tc.name] = self._build_target(config, tc, keep)
        for gone in old.values():
            self._retire(gone, now)
            for kind in ("scrape", "health", "canary", "bounds"):
                self.warnings.forget((kind, gone.config.name))
        self._apply_exporters(config, keep, same_scrape, now)
        self._apply_nvml(config)
        self.keep_names = keep_names
        self.config = config

    def _apply_exporters(
        self, config: Config, keep: Callable[[str], bool] | None, same_scrape: bool, now: float | None
    ) -> None:
        """Keep each GPU exporter whose settings are the same, build new ones; the series of the others go
        stale now, and their connections close after the reload."""
        before = {e.name: e for e in self.config.gpus.exporters}
        old, self.exporters = self.exporters, {}
        for ec in config.gpus.exporters:
            if ec.name in old and before.get(ec.name) == ec and same_scrape:
                self.exporters[ec.name] = old.pop(ec.name)
                continue
            instance, limits = scrape_address(ec.url), config.global_.limits
            self.exporters[ec.name] = self._scraper(
                config, ec.url, ec.job, instance, keep, dict(ec.labels), limits
            )
        for name, gone in old.items():
            if now is not None:
                gone.forget(now)
            self.retired.append(gone)
            if name not in self.exporters:
                for kind in (EXPORTER, EXPORTER_BOUNDS):
                    self.warnings.forget((kind, name))

    def _apply_nvml(self, config: Config) -> None:
        """Attach NVML while `gpus.nvml` is set (it opens at the first reading), release it when unset."""
        if config.gpus.nvml and self.gpu is None:
            source = NvmlSource(nvml=self.options.nvml, hostname=self.options.hostname)
            self.gpu = GpuCollector(source, self.store, instance=self.options.hostname)
        elif not config.gpus.nvml and self.gpu is not None:
            self.gpu.close()
            self.gpu = None

    def _retire(self, rt: TargetRuntime, now: float | None) -> None:
        """A target left the config: every series of it goes stale now (scraped, probed, engine state), as
        Prometheus stale-marks a target that discovery dropped; its connections close after the reload."""
        if now is not None:
            rt.scrape.forget(now)
            t_ms = math.floor(now * 1000)
            own = [name for pair in PROBE_SERIES.values() for name in pair] + list(STATE_SERIES.values())
            for name in own:
                self.store.get(make_labels(name, rt.labels)).mark_stale(t_ms)
        self.retired += [rt.scrape, rt.health, rt.client]

    async def close_retired(self) -> None:
        """Close the connections of targets dropped by a reload."""
        retired, self.retired = self.retired, []
        for closable in retired:
            await closable.aclose()

    async def aclose(self) -> None:
        """Close every connection, and release NVML."""
        for rt in self.targets.values():
            self.retired += [rt.scrape, rt.health, rt.client]
        self.retired += self.exporters.values()
        if self.gpu is not None:
            self.gpu.close()
        await self.close_retired()

    def _scraper(
        self,
        config: Config,
        url: str,
        job: str,
        instance: str,
        keep: Callable[[str], bool] | None,
        labels: dict[str, str],
        limits: ScrapeLimits,
        settings: ClientSettings | None = None,
    ) -> ScrapeTarget:
        g = config.global_
        return ScrapeTarget(
            url=url,
            job=job,
            instance=instance,
            store=self.store,
            timeout=g.scrape_timeout,
            **asdict(limits),
            keep_name=keep,
            extra_labels=labels,
            monotonic=self.monotonic,
            recorder=self.recorder,
            settings=settings,
        )

    def _build_target(
        self, config: Config, tc: TargetConfig, keep: Callable[[str], bool] | None
    ) -> TargetRuntime:
        settings = ClientSettings(tc.http) if tc.http != HttpClientConfig() else None
        client, tls = self._client(tc.name, settings)
        own = {**tc.labels, "target": tc.name}  # job and instance are the scrape's own
        limits = tc.scrape_limits(config.global_.limits)
        scrape = self._scraper(config, tc.metrics_url, tc.job, tc.instance, keep, own, limits, settings)
        health = HealthProbe(tc.health_url, tc.health_timeout, self.monotonic, settings=settings)
        canary = CanaryProbe(tc.url, tc.canary, client, self.monotonic) if tc.canary.enabled else None
        state = EngineStateProbe(tc.url, client, tc.health_timeout, self.monotonic)
        labels = tc.series_labels
        return TargetRuntime(tc, scrape, client, health, canary, state, labels, settings, tls)

    def _client(
        self, name: str, settings: ClientSettings | None
    ) -> tuple[httpx.AsyncClient, ssl.SSLContext | None]:
        """A client for the canary and the state probe, with the target's TLS context and credentials."""
        if settings is None:
            return self.client_factory(), None
        try:
            tls = settings.ssl_context()
        except CredentialError as exc:  # the scrape reports it every time; the canary fails verification
            log.error("target TLS settings unusable", extra={"target": name, "error": str(exc)})
            tls = None
        return self.client_factory(settings, tls), tls

    def _refresh_client(self, rt: TargetRuntime) -> None:
        """A new client once a TLS file changed (the scrape's own connection re-checks on each connect)."""
        if rt.settings is None or not rt.settings.custom_tls:
            return
        try:
            tls = rt.settings.ssl_context()
        except CredentialError:
            return
        if tls is not rt.client_tls:
            self.retired.append(rt.client)
            rt.client, rt.client_tls = self.client_factory(rt.settings, tls), tls
            for probe in (rt.canary, rt.state):
                if probe is not None:
                    probe.client = rt.client

    def _record_probe(self, rt: TargetRuntime, st: ProbeStatus, kind: str, now: float) -> None:
        """Log a failed probe and store its outcome and latency as samples of the target."""
        ok_name, latency_name = PROBE_SERIES[kind]
        key, extra = (kind, rt.config.name), {"target": rt.config.name, "probe": ok_name}
        if st.ok:
            self.warnings.recovered(key, "probe recovered", extra)
        else:
            self.warnings.failed(key, st.last_error, "probe failed", {**extra, "error": st.last_error})
        if self.recorder is not None:
            self.recorder.record_probe(
                t=now,
                probe=kind,
                job=rt.config.job,
                instance=rt.config.instance,
                labels={**rt.config.labels, "target": rt.config.name},
                ok=bool(st.ok),
                latency=st.latency,
                error=st.last_error,
            )
        t_ms = math.floor(now * 1000)
        self.store.append(make_labels(ok_name, rt.labels), t_ms, 1.0 if st.ok else 0.0)
        self.store.append(make_labels(latency_name, rt.labels), t_ms, st.latency)

    async def scrape(self, name: str, now: float) -> None:
        """Scrape one target's /metrics."""
        rt = self.targets.get(name)
        if rt is None:
            return
        self._report(("scrape", name), ("bounds", name), await rt.scrape.scrape(now), {"target": name})

    async def probe_health(self, name: str, now: float) -> None:
        """Probe one target's /health and record it as samples. The engine state is asked apart
        (`probe_state`, a job of its own): an /is_paused that answers slowly must not hold /health back."""
        rt = self.targets.get(name)
        if rt is None:
            return
        st = await rt.health.probe(now)
        self._record_probe(rt, st, "health", now)

    async def probe_state(self, name: str, now: float) -> None:
        """Ask whether one target's engine is paused or asleep, while its last /health probe succeeded; once
        one failed, the endpoints are asked again when it is back (the server may restart with other flags).
        Nothing before the first /health probe."""
        rt = self.targets.get(name)
        if rt is None or rt.health.status.ok is None:
            return
        await self._probe_state(rt, now, up=rt.health.status.ok)

    async def _probe_state(self, rt: TargetRuntime, now: float, up: bool = True) -> None:
        """Ask whether the engine is paused or asleep (while /health answers) and store the answers."""
        if up:
            self._refresh_client(rt)
            await rt.state.probe(now)
        else:
            rt.state.server_down()
        t_ms = math.floor(now * 1000)
        for name, value in rt.state.samples().items():
            if value is not None:
                self.store.append(make_labels(name, rt.labels), t_ms, value)
            else:  # no such endpoint (any more): the series ends, as a target's series end when it goes
                self.store.get(make_labels(name, rt.labels)).mark_stale(t_ms)

    def engine_state(self, name: str, now: float) -> str:
        """Why the target's engine is paused or asleep on purpose; "" if nothing says so, or nothing knows."""
        rt = self.targets.get(name)
        if rt is None:
            return ""
        return rt.state.reason(now) or asleep_in_store(
            self.store, name, now, self.config.global_.lookback_delta
        )

    def ready_since(self, name: str, started: float) -> bool:
        """Whether /health answered 200 and a canary generated a token, both sent at or after `started` (the
        server's (re)start). False with the canary off (nothing proves the engine generates)."""
        rt = self.targets.get(name)
        oks = (rt.health.status.last_ok, rt.canary.status.last_ok) if rt and rt.canary else (None,)
        return None not in oks and min(t for t in oks if t is not None) >= started

    async def probe_canary(self, name: str, now: float) -> None:
        """Send one target's canary completion and record it as samples; it waits while the engine is
        paused or asleep on purpose (a paused engine would hold it, and a failure would mean nothing)."""
        rt = self.targets.get(name)
        if rt is None or rt.canary is None or self.engine_state(name, now):
            return
        before = replace(rt.canary.status)
        self._refresh_client(rt)
        st = await rt.canary.probe(now)
        if not st.ok:
            after = now + st.latency
            await self._probe_state(rt, after)  # paused while the canary waited? (no request if no dev mode)
            if self.engine_state(name, after):
                rt.canary.status = before  # its failure says nothing about the engine
                return
        self._record_probe(rt, st, "canary", now)

    async def scrape_exporter(self, name: str, now: float) -> None:
        """Scrape one GPU exporter."""
        scraper = self.exporters.get(name)
        if scraper is None:
            return
        extra = {"exporter": name, "job": scraper.job}
        self._report((EXPORTER, name), (EXPORTER_BOUNDS, name), await scraper.scrape(now), extra)

    def _report(
        self, key: tuple[str, str], bounds: tuple[str, str], status: ScrapeStatus, extra: dict[str, str]
    ) -> None:
        """Log a failed scrape, or samples out of bounds, when that starts or changes, not at every scrape."""
        if status.up:
            self.warnings.recovered(key, "scrape recovered", extra)
        else:
            error = {**extra, "kind": status.error_kind, "error": status.last_error}
            self.warnings.failed(key, status.error_kind, "scrape failed", error)
        if status.up and status.out_of_bounds:
            n = status.out_of_bounds
            self.warnings.failed(bounds, "out_of_bounds", OUT_OF_BOUNDS, {**extra, "num_dropped": n})
        else:
            self.warnings.recovered(bounds, "no more samples out of bounds", extra)

    async def collect_gpus(self, now: float) -> None:
        """Read NVML in a worker thread (its calls block) and store the samples."""
        if self.gpu is None:
            return
        samples = await asyncio.to_thread(self.gpu.collect)
        t_ms = math.floor(now * 1000)
        self.gpu.commit(samples, t_ms, self.keep_names)
        if self.recorder is not None:
            self.recorder.record_gpu(t=now, instance=self.gpu.instance, up=self.gpu.up, samples=samples)

    def gc(self, now: float) -> int:
        """Trim the store to its retention."""
        return self.store.gc(now)
