"""Own metrics of target discovery, built at scrape time (Prometheus' prometheus_sd_* families, renamed)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .files import FileDiscovery
from .providers import TargetDiscovery


class DiscoveryCollector(Collector):
    """Targets found, dropped and refused, and the files read, of every discovery of the config."""

    def __init__(self, discovery: TargetDiscovery) -> None:
        self.discovery = discovery

    def collect(self) -> Iterator[Metric]:
        """Build every family."""
        found = GaugeMetricFamily(
            "vllm_watchdog_sd_discovered_targets",
            "Targets the discovery found at its last good look.",
            labels=["discovery", "mechanism"],
        )
        dropped = GaugeMetricFamily(
            "vllm_watchdog_sd_dropped_targets",
            "Discovered targets left out because their name is taken (by the config's targets or an "
            "earlier discovery).",
            labels=["discovery"],
        )
        problems = GaugeMetricFamily(
            "vllm_watchdog_sd_problems",
            "Problems of the discovery's last look (refused files or containers, over max_targets).",
            labels=["discovery"],
        )
        failures = CounterMetricFamily(
            "vllm_watchdog_sd_refresh_failures",
            "Looks that failed (no Docker engine) or found over max_targets (the last good targets stay).",
            labels=["discovery", "mechanism"],
        )
        read_errors = CounterMetricFamily(
            "vllm_watchdog_sd_file_read_errors",
            "file_sd files read and refused (unreadable, not valid, a bad group); counted once per change.",
            labels=["discovery"],
        )
        mtimes = GaugeMetricFamily(
            "vllm_watchdog_sd_file_mtime_seconds",
            "Modification time of each file_sd file when it was last read.",
            labels=["discovery", "filename"],
        )
        for name, d in self.discovery.discoveries.items():
            found.add_metric([name, d.mechanism], len(d.targets))
            dropped.add_metric([name], sum(1 for x in self.discovery.dropped if x.discovery == name))
            problems.add_metric([name], len(d.problems))
            failures.add_metric([name, d.mechanism], d.failures)
            if isinstance(d.looker, FileDiscovery):
                read_errors.add_metric([name], d.looker.read_errors)
                for path, mtime in sorted(d.looker.mtimes().items()):
                    mtimes.add_metric([name, path], mtime)
        yield from (found, dropped, problems, failures, read_errors, mtimes)
