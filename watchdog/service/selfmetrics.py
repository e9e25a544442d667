"""The daemon's own metrics (its build, reloads, schedule, state_dir, descriptors and listeners), produced at
scrape time from live state, and which collectors make up the own metrics the self feed writes too. Each
stage owns the collector of its metrics (sources/metrics.py, ruler/metrics.py, actions/metrics.py, ...); the
daemon registers them all on one explicit CollectorRegistry."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..actions.store.actionstore import ACTIONS_DB
from ..fdlimits import FdReserve, open_fds, soft_limit
from ..listener import REFUSALS, Listener
from ..ruler.evaluation import STATE_FILE, RuleEvaluation
from ..ruler.metrics import RuleCollector
from ..sources.metrics import MonitorCollector
from ..sources.monitor import Monitor
from ..sources.selffeed import OwnCollector, Want, everything
from ..sources.speccollector import SpecGoodputCollector
from ..statehealth import PROBE_FILE, StateHealth
from .actionwiring import NOTIFY_DB

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


class DaemonCollector(OwnCollector):
    """Exports the daemon's own: its build, config reloads, missed deadlines and clock jumps."""

    def __init__(self, counters: DaemonCounters) -> None:
        self.counters = counters

    def collect(self, want: Want = everything) -> Iterator[Metric]:
        """Build every family from current state (only those `want` names, for the self feed)."""
        if want("vllm_watchdog_build_info"):
            info = GaugeMetricFamily(
                "vllm_watchdog_build_info", "Build information.", labels=["version", "python"]
            )
            info.add_metric([__version__, platform.python_version()], 1)
            yield info
        yield from (family for family in self._daemon(self.counters) if want(family.name))

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


class StateCollector(OwnCollector):
    """Whether state_dir can be written, and the failed writes of each file there, every file from 0: those
    StateHealth collects and those a stage counts itself (`more_errors`, by file name)."""

    def __init__(
        self, health: StateHealth, files: Sequence[str], more_errors: Callable[[], Mapping[str, int]]
    ) -> None:
        self.health = health
        self.files = tuple(files)
        self.more_errors = more_errors

    def collect(self, want: Want = everything) -> Iterator[Metric]:
        """Build both families (none unless `want` names one of them)."""
        if not (want("vllm_watchdog_state_writable") or want("vllm_watchdog_state_write_errors")):
            return
        writable = GaugeMetricFamily(
            "vllm_watchdog_state_writable",
            "1 if state_dir can be written (last probe, and every state file on disk); 0: disruptive actions "
            "are refused.",
        )
        writable.add_metric([], 1 if self.health.writable else 0)
        yield writable
        errors = CounterMetricFamily(
            "vllm_watchdog_state_write_errors",
            "Failed writes to files in state_dir (the probe, the action database, the notification queue, "
            "the alert state), by file.",
            labels=["file"],
        )
        counts = dict.fromkeys(self.files, 0) | self.health.errors
        for name, n in self.more_errors().items():
            counts[name] = counts.get(name, 0) + n
        for name, n in sorted(counts.items()):
            errors.add_metric([name], n)
        yield errors


def own_collectors(
    monitor: Monitor, counters: DaemonCounters, evaluation: RuleEvaluation, health: StateHealth | None
) -> tuple[OwnCollector, ...]:
    """The collectors of the daemon's own metrics that the self feed writes too, in /metrics order: the
    daemon's, each stage's (sources, ruler) and state_dir's health (none without a state_dir)."""
    out: list[OwnCollector] = [
        DaemonCollector(counters),
        MonitorCollector(monitor),
        RuleCollector(evaluation),
        SpecGoodputCollector(
            monitor.store, lambda: [(n, rt.scrape.target_labels) for n, rt in monitor.targets.items()]
        ),
    ]
    if health is not None:
        out.append(StateCollector(health, STATE_FILES, evaluation.state_write_errors))
    return tuple(out)


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
            "Idle connections, and connections still sending a request, closed to make room at the "
            "connection cap.",
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
