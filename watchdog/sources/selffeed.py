"""The watchdog's own metrics into its sample store, so that in-process rules can watch the watchdog too.

A Prometheus that scrapes the watchdog's /metrics sees these families with job="vllm-watchdog" (its scrape
job) and, with `honor_labels: true`, the job and instance of the series that name their own (the per-target
scrape counters). The feed writes the same series in-process, so one rule file serves both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ..store import Exposure, SampleStore, Series, make_labels
from .enginestate import STATE_SERIES
from .probes import PROBE_SERIES

JOB = "vllm-watchdog"
PREFIX = "vllm_watchdog_"
# Written by the monitor already, under the target's job and instance: never twice.
_WRITTEN_ELSEWHERE = frozenset(
    [*(name for pair in PROBE_SERIES.values() for name in pair), *STATE_SERIES.values()]
)


Want = Callable[[str], bool]
"""Whether a family (by its name, without `_total`) is wanted."""


def everything(name: str) -> bool:
    """The `Want` of a scrape of /metrics: every family."""
    return True


class OwnCollector(Collector):
    """A collector that can build only some of its families: the feed asks for those the rules read."""

    def collect(self, want: Want = everything) -> Iterable[Metric]:
        """Build the families `want` names (all of them for /metrics)."""
        raise NotImplementedError


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
        self.store = store
        self.exposure = Exposure(store)
        # Series by sample name and label pairs in the order the family gives them (always the same).
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = {}
        self._wanted: frozenset[str] | None = None
        self._written: frozenset[str] | None = None  # the own sample names the rules read; None: all own
        self._want: Want = everything

    def commit(self, t_ms: int) -> int:
        """Collect the own families once and store their samples at t_ms; returns how many were stored."""
        wanted = self.wanted()
        if wanted is not self._wanted:
            self._wanted = wanted
            self._written = None if wanted is None else frozenset(name for name in wanted if _own(name))
            self._want = everything if self._written is None else _families(self._written).__contains__
        written, want = self._written, self._want
        if written is not None and not written:
            return 0
        keep = _own if written is None else written.__contains__
        batch: list[tuple[Series, float, int]] = []
        cache = self._series
        for collector in self.collectors:
            families = collector.collect(want) if isinstance(collector, OwnCollector) else collector.collect()
            for family in families:
                for sample in family.samples:
                    name = sample.name
                    if not keep(name):
                        continue
                    key = (name, tuple(sample.labels.items()))
                    series = cache.get(key)
                    if series is None:
                        labels = {"job": JOB, "instance": self.instance, **sample.labels}
                        series = cache[key] = self.store.get(make_labels(name, labels))
                    batch.append((series, float(sample.value), t_ms))
        self.exposure.commit(batch, t_ms)
        if len(cache) > 4 * max(len(batch), 64):  # actions and notifiers come and go with reloads
            cache.clear()
        return len(batch)


def _families(names: frozenset[str]) -> frozenset[str]:
    """The families whose samples these are: a counter's samples add `_total` to its name."""
    return names | {name.removesuffix("_total") for name in names}


def _own(name: str) -> bool:
    return name.startswith(PREFIX) and name not in _WRITTEN_ELSEWHERE
