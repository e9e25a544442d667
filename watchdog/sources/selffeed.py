"""The watchdog's own metrics into its sample store, so that in-process rules can watch the watchdog too.

A Prometheus that scrapes the watchdog's /metrics sees these families with job="vllm-watchdog" (its scrape
job) and, with `honor_labels: true`, the job and instance of the series that name their own (the per-target
scrape counters). The feed writes the same series in-process, so one rule file serves both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client.registry import Collector

from ..store import Exposure, SampleStore, Series, SeriesCache
from .enginestate import STATE_SERIES
from .probes import PROBE_SERIES

JOB = "vllm-watchdog"
PREFIX = "vllm_watchdog_"
# Written by the monitor already, under the target's job and instance: never twice.
_WRITTEN_ELSEWHERE = frozenset(
    [*(name for pair in PROBE_SERIES.values() for name in pair), *STATE_SERIES.values()]
)


class SelfFeed:
    """Writes the own samples that rules read (all of them when `wanted` returns None) at each commit."""

    def __init__(
        self,
        store: SampleStore,
        collectors: Sequence[Collector],
        instance: str,
        wanted: Callable[[], frozenset[str] | None],
    ) -> None:
        self.collectors = tuple(collectors)
        self.instance = instance
        self.wanted = wanted
        self.exposure = Exposure(store)
        self._series = SeriesCache(store)

    def commit(self, t_ms: int) -> int:
        """Collect the own families once and store their samples at t_ms; returns how many were stored."""
        wanted = self.wanted()
        if wanted is not None and not any(_own(name) for name in wanted):
            return 0
        batch: list[tuple[Series, float, int]] = []
        for collector in self.collectors:
            for family in collector.collect():
                for sample in family.samples:
                    if not _own(sample.name) or (wanted is not None and sample.name not in wanted):
                        continue
                    labels = {"job": JOB, "instance": self.instance, **sample.labels}
                    batch.append((self._series.get(sample.name, labels), float(sample.value), t_ms))
        self.exposure.commit(batch, t_ms)
        if len(self._series) > 4 * max(len(batch), 64):  # actions and notifiers come and go with reloads
            self._series.clear()
        return len(batch)


def _own(name: str) -> bool:
    return name.startswith(PREFIX) and name not in _WRITTEN_ELSEWHERE
