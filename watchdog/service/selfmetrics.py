"""The watchdog's own metrics, produced at scrape time from live state on an explicit registry."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..actions.plane import NOTIFY_DB
from ..actions.state import ACTIONS_DB
from ..errors import SCRAPE_ERROR_KINDS
from ..fdlimits import FdReserve, open_fds, soft_limit
from ..listener import REFUSALS, Listener
from ..ruler.evaluation import STATE_FILE, RuleEvaluation
from ..ruler.groups import key_name
from ..sources.enginestate import STATE_SERIES
from ..sources.monitor import Monitor
from ..sources.scrape import ScrapeStatus
from ..sources.selffeed import OwnCollector, Want, everything
from ..statehealth import PROBE_FILE, StateHealth

STATE_FILES = (ACTIONS_DB, NOTIFY_DB, STATE_FILE, PROBE_FILE)  # their write error counters start at 0


@dataclass
class DaemonCounters:
    """Process-level counters the daemon updates."""

    reloads_ok: int = 0
    reloads_failed: int = 0
    last_reload_ok: bool = True
    config_errors: int = 0
    missed_deadlines: dict[str, int] = field(default_factory=dict)
    clock_jumps: dict[str, int] = field(default_factory=dict)  # direction -> wall-clock jumps noticed

    def missed(self, job: str) -> None:
        """Count a scheduled run that was skipped or started too late."""
        self.missed_deadlines[job] = self.missed_deadlines.get(job, 0) + 1


class WatchdogCollector(OwnCollector):
    """Exports scrape, probe, store and daemon state of one Monitor."""

    def __init__(
        self,
        monitor: Monitor,
        counters: DaemonCounters,
        evaluation: RuleEvaluation | None = None,
        state: StateHealth | None = None,
    ) -> None:
        self.monitor = monitor
        self.counters = counters
        self.evaluation = evaluation
        self.state = state

    def collect(self, want: Want = everything) -> Iterator[Metric]:
        """Build every family from current state (only those `want` names, for the self feed)."""
        m, c = self.monitor, self.counters
        if want("vllm_watchdog_build_info"):
            info = GaugeMetricFamily(
                "vllm_watchdog_build_info", "Build information.", labels=["version", "python"]
            )
            info.add_metric([__version__, platform.python_version()], 1)
            yield info
        yield from self._scrapes(m, want)
        yield from self._probes(m, want)
        if want("vllm_watchdog_store_series"):
            store = GaugeMetricFamily("vllm_watchdog_store_series", "Series held in the sample store.")
            store.add_metric([], m.store.series_count)
            yield store
        if want("vllm_watchdog_store_samples"):
            samples = GaugeMetricFamily("vllm_watchdog_store_samples", "Samples held in the sample store.")
            samples.add_metric([], m.store.sample_count)
            yield samples
        yield from (family for family in self._daemon(c) if want(family.name))
        if m.gpu is not None and want("vllm_watchdog_nvml_up"):
            gpu = GaugeMetricFamily("vllm_watchdog_nvml_up", "1 if the last NVML reading succeeded.")
            gpu.add_metric([], 1 if m.gpu.up else 0)
            yield gpu
        if self.evaluation is not None:
            if want("ALERTS") or want("ALERTS_FOR_STATE"):
                yield from _alerts(self.evaluation)
            yield from _evaluations(self.evaluation, want)
        health = self.state
        if health is not None and (
            want("vllm_watchdog_state_writable") or want("vllm_watchdog_state_write_errors")
        ):
            alerts = self.evaluation.manager.persistence_errors if self.evaluation is not None else 0
            yield from _state(health, alerts)

    @staticmethod
    def _daemon(c: DaemonCounters) -> Iterator[Metric]:
        """Reloads, missed deadlines and clock jumps: a few samples, from counters."""
        reloads = CounterMetricFamily(
            "vllm_watchdog_config_reloads", "Config reloads by result.", labels=["result"]
        )
        reloads.add_metric(["success"], c.reloads_ok)
        reloads.add_metric(["failure"], c.reloads_failed)
        yield reloads
        last = GaugeMetricFamily(
            "vllm_watchdog_config_last_reload_successful", "1 if the last config reload succeeded."
        )
        last.add_metric([], 1 if c.last_reload_ok else 0)
        yield last
        errors = GaugeMetricFamily(
            "vllm_watchdog_config_errors",
            "Problems found by the last failed config reload (0 after success).",
        )
        errors.add_metric([], c.config_errors)
        yield errors
        missed = CounterMetricFamily(
            "vllm_watchdog_missed_deadlines",
            "Scheduled runs skipped or started late, by job.",
            labels=["job"],
        )
        for job, n in sorted(c.missed_deadlines.items()):
            missed.add_metric([job], n)
        yield missed
        jumps = CounterMetricFamily(
            "vllm_watchdog_clock_jumps",
            "Wall-clock jumps the daemon noticed (the monotonic clock disagreed), by direction.",
            labels=["direction"],
        )
        for direction, n in sorted(c.clock_jumps.items()):
            jumps.add_metric([direction], n)
        yield jumps

    def _scrapes(self, m: Monitor, want: Want) -> Iterator[Metric]:
        labels = ["job", "instance", "target"]  # the scraped series' own; target is "" (absent) for dcgm
        if want("vllm_watchdog_target_info"):
            info = GaugeMetricFamily(
                "vllm_watchdog_target_info",
                "1 per watched target: its name (target), and the job and instance of its scraped series.",
                labels=labels,
            )
            for rt in m.targets.values():
                info.add_metric([rt.scrape.job, rt.scrape.instance, rt.config.name], 1)
            yield info
        # Each family with what it reads of a scraper's status, built only if wanted.
        per_scraper: list[
            tuple[GaugeMetricFamily | CounterMetricFamily, Callable[[ScrapeStatus], float] | None]
        ] = []
        for family_type, name, doc, read in _SCRAPE_FAMILIES:
            if want(name):
                extra = ["kind"] if read is None else []
                per_scraper.append((family_type(name, doc, labels=labels + extra), read))
        if not per_scraper:
            return
        scrapers = [rt.scrape for rt in m.targets.values()] + ([m.dcgm] if m.dcgm else [])
        for s in scrapers:
            key = [s.job, s.instance, s.extra_labels.get("target", "")]
            st = s.status
            for family, read in per_scraper:
                if read is None:  # errors by kind, every kind from 0
                    for kind, n in sorted((dict.fromkeys(SCRAPE_ERROR_KINDS, 0) | st.errors_by_kind).items()):
                        family.add_metric([*key, kind], n)
                else:
                    family.add_metric(key, read(st))
        yield from (family for family, _ in per_scraper)

    def _probes(self, m: Monitor, want: Want) -> Iterator[Metric]:
        labels = ["job", "instance", "target"]
        fams = {
            name: GaugeMetricFamily(name, doc, labels=labels) for name, doc in _PROBE_FAMILIES if want(name)
        }
        if not fams:
            return
        for rt in m.targets.values():
            key = [rt.scrape.job, rt.scrape.instance, rt.config.name]  # the config's instance parses the URL
            h = rt.health.status
            if h.ok is not None:
                _add(fams, "vllm_watchdog_health_up", key, 1 if h.ok else 0)
                _add(fams, "vllm_watchdog_health_latency_seconds", key, h.latency)
            if rt.canary is not None and rt.canary.status.ok is not None:
                cs = rt.canary.status
                _add(fams, "vllm_watchdog_canary_success", key, 1 if cs.ok else 0)
                _add(fams, "vllm_watchdog_canary_latency_seconds", key, cs.latency)
            for name, value in rt.state.samples().items():
                if value is not None:
                    _add(fams, name, key, value)
        yield from fams.values()


def _add(families: dict[str, GaugeMetricFamily], name: str, key: list[str], value: float) -> None:
    family = families.get(name)
    if family is not None:
        family.add_metric(key, value)


# (family type, name, help, what it reads of a ScrapeStatus: None for the errors by kind), in /metrics order.
_SCRAPE_FAMILIES: list[
    tuple[type[GaugeMetricFamily | CounterMetricFamily], str, str, Callable[[ScrapeStatus], float] | None]
] = [
    (
        GaugeMetricFamily,
        "vllm_watchdog_target_up",
        "1 if the last scrape succeeded.",
        lambda st: 1 if st.up else 0,
    ),
    (CounterMetricFamily, "vllm_watchdog_scrapes", "Scrapes attempted.", lambda st: st.scrapes),
    (CounterMetricFamily, "vllm_watchdog_scrape_errors", "Failed scrapes by kind.", None),
    (
        GaugeMetricFamily,
        "vllm_watchdog_scrape_duration_seconds",
        "Duration of the last scrape.",
        lambda st: st.last_duration,
    ),
    (
        GaugeMetricFamily,
        "vllm_watchdog_scrape_samples",
        "Samples read by the last scrape.",
        lambda st: st.samples,
    ),
    (
        CounterMetricFamily,
        "vllm_watchdog_scrape_samples_out_of_bounds",
        "Samples dropped for a timestamp over 1h old or 10m ahead (as Prometheus drops them).",
        lambda st: st.out_of_bounds_total,
    ),
    (
        GaugeMetricFamily,
        "vllm_watchdog_scrape_series",
        "Series of the source the store holds (live, or stale within the retention); series_limit caps them.",
        lambda st: st.series_held,
    ),
]
_PROBE_FAMILIES = (
    ("vllm_watchdog_health_up", "1 if the last /health probe returned 200."),
    ("vllm_watchdog_health_latency_seconds", "Latency of the last /health probe."),
    ("vllm_watchdog_canary_success", "1 if the last canary completion generated a token."),
    ("vllm_watchdog_canary_latency_seconds", "Latency of the last canary completion."),
    (
        STATE_SERIES["paused"],
        "1 if vLLM's GET /is_paused last answered true, 0 if false or no answer; absent without dev mode.",
    ),
    (
        STATE_SERIES["sleeping"],
        "1 if vLLM's GET /is_sleeping last answered true (also while paused), 0 if false or no answer; "
        "absent without dev mode.",
    ),
)


def _state(health: StateHealth, alert_file_errors: int) -> Iterator[Metric]:
    writable = GaugeMetricFamily(
        "vllm_watchdog_state_writable",
        "1 if state_dir can be written (last probe, and every state file on disk); 0: disruptive actions "
        "are refused.",
    )
    writable.add_metric([], 1 if health.writable else 0)
    yield writable
    errors = CounterMetricFamily(
        "vllm_watchdog_state_write_errors",
        "Failed writes to files in state_dir (the probe, the action database, the notification queue, the "
        "alert state), by file.",
        labels=["file"],
    )
    counts = {name: 0 for name in STATE_FILES} | health.errors
    counts[STATE_FILE] += alert_file_errors  # the alert state file counts its own (ruler.state.StateFile)
    for name, n in sorted(counts.items()):
        errors.add_metric([name], n)
    yield errors


def _alerts(ev: RuleEvaluation) -> Iterator[Metric]:
    """ALERTS and ALERTS_FOR_STATE, as Prometheus writes them, one family each with per-series labels."""
    families: dict[str, Metric] = {}
    docs = {
        "ALERTS": "Active alerts: 1 per pending or firing alert, labelled with its state.",
        "ALERTS_FOR_STATE": "When each active alert became active (unix seconds).",
    }
    for labels, value in ev.manager.alert_series():
        name = labels.get("__name__", "ALERTS")
        family = families.setdefault(name, Metric(name, docs.get(name, name), "gauge"))
        family.add_sample(name, {k: v for k, v in labels.items() if k != "__name__"}, value)
    yield from families.values()


def _evaluations(ev: RuleEvaluation, want: Want) -> Iterator[Metric]:
    families = (family for family in _evaluation_families(ev) if want(family.name))
    yield from families


def _evaluation_families(ev: RuleEvaluation) -> Iterator[Metric]:
    total = CounterMetricFamily(
        "vllm_watchdog_rule_group_evaluations", "Rule group evaluations.", labels=["rule_group"]
    )
    duration = GaugeMetricFamily(
        "vllm_watchdog_rule_group_last_duration_seconds",
        "How long the last evaluation of a group took.",
        labels=["rule_group"],
    )
    groups = dict.fromkeys((key_name(k) for k in ev.manager.group_keys()), 0)  # every group from the start
    for group, n in sorted((groups | ev.stats.evaluations).items()):
        total.add_metric([group], n)
    for group, seconds in sorted(ev.stats.last_duration.items()):
        duration.add_metric([group], seconds)
    yield total
    yield duration
    failures = CounterMetricFamily(
        "vllm_watchdog_rule_evaluation_failures",
        "Rule evaluations that failed (query error, limit exceeded), by group.",
        labels=["rule_group"],
    )
    for group, n in sorted((groups | ev.manager.failures()).items()):
        failures.add_metric([group], n)
    yield failures
    remote = CounterMetricFamily(
        "vllm_watchdog_remote_query_failures", "Queries the remote rule backend failed to answer."
    )
    remote.add_metric([], ev.stats.remote_failures)
    yield remote


class FdCollector(Collector):
    """The descriptor limit, use and reserve, and the connections shed to keep it."""

    def __init__(self, guard: FdReserve) -> None:
        self.guard = guard

    def collect(self) -> Iterator[Metric]:
        """Build the families."""
        soft, used = soft_limit(), open_fds()
        if soft is not None:
            yield GaugeMetricFamily("vllm_watchdog_fd_limit", "The soft RLIMIT_NOFILE.", value=soft)
        if used is not None:
            yield GaugeMetricFamily(
                "vllm_watchdog_fd_open", "File descriptors this process holds.", value=used
            )
        yield GaugeMetricFamily(
            "vllm_watchdog_fd_reserve",
            "Descriptors kept back from API clients for scrapes, probes and state writes.",
            value=self.guard.reserve,
        )
        yield CounterMetricFamily(
            "vllm_watchdog_fd_connections_shed",
            "API connections closed at accept because they would have used the descriptor reserve.",
            value=self.guard.shed,
        )
        yield CounterMetricFamily(
            "vllm_watchdog_fd_accept_errors",
            "Accepts that failed because the process or system was out of descriptors (EMFILE, ENFILE).",
            value=self.guard.accept_errors,
        )


class ListenerCollector(Collector):
    """A listener's open connections, evictions and refusals by reason, as `<prefix>connections` etc."""

    def __init__(self, prefix: str, listener: Callable[[], Listener | None]) -> None:
        self.prefix = prefix
        self.listener = listener

    def collect(self) -> Iterator[Metric]:
        """Build the families."""
        listener = self.listener()
        if listener is None:
            return
        yield GaugeMetricFamily(
            self.prefix + "connections", "Open client connections.", value=len(listener.connections)
        )
        yield CounterMetricFamily(
            self.prefix + "connections_evicted",
            "Idle connections, and connections still sending a request, closed to make room at the connection cap.",
            value=listener.evicted,
        )
        refused = CounterMetricFamily(
            self.prefix + "refused",
            "Requests or connections refused below the application, by reason.",
            labels=["reason"],
        )
        for reason, n in sorted((dict.fromkeys(REFUSALS, 0) | listener.refused).items()):
            refused.add_metric([reason], n)
        yield refused
