"""The sources' own metrics: targets, scrapes, probes, engine state, the sample store and NVML, built at
scrape time from one Monitor (prometheus_client's custom collector)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..errors import SCRAPE_ERROR_KINDS
from .enginestate import STATE_SERIES
from .monitor import Monitor
from .scrape import ScrapeStatus
from .selffeed import OwnCollector, Want, everything

_LABELS = ["job", "instance", "target"]  # the scraped series' own; target is "" (absent) for a GPU exporter


class MonitorCollector(OwnCollector):
    """Exports what the sources of one Monitor saw: each target, scrape, probe, the store and NVML."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def collect(self, want: Want = everything) -> Iterator[Metric]:
        """Build every family from current state (only those `want` names, for the self feed)."""
        m = self.monitor
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
        if m.gpu is not None and want("vllm_watchdog_nvml_up"):
            gpu = GaugeMetricFamily("vllm_watchdog_nvml_up", "1 if the last NVML reading succeeded.")
            gpu.add_metric([], 1 if m.gpu.up else 0)
            yield gpu

    def _scrapes(self, m: Monitor, want: Want) -> Iterator[Metric]:
        if want("vllm_watchdog_target_info"):
            info = GaugeMetricFamily(
                "vllm_watchdog_target_info",
                "1 per watched target: its name (target), and the job and instance of its scraped series.",
                labels=_LABELS,
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
                per_scraper.append((family_type(name, doc, labels=_LABELS + extra), read))
        if not per_scraper:
            return
        scrapers = [rt.scrape for rt in m.targets.values()] + list(m.exporters.values())
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
        fams = {
            name: GaugeMetricFamily(name, doc, labels=_LABELS) for name, doc in _PROBE_FAMILIES if want(name)
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
    (
        STATE_SERIES["unhealthy"],
        "Engines vLLM's GET /fault_tolerance/status last said are unhealthy (waiting for a retry), 0 if none "
        "or no answer; absent without --enable-fault-tolerance.",
    ),
)
