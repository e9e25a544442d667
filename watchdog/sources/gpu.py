"""GPU signals read in-process through NVML, stored under dcgm-exporter names with staleness."""

from __future__ import annotations

import logging

from ..store import Exposure, SampleStore, Series, SeriesCache, make_labels
from .nvml import GpuSample, NvmlError, NvmlSource

log = logging.getLogger(__name__)


class GpuCollector:
    """Turns NVML readings into stored samples; a failing NVML makes `up{job="nvml"}` 0."""

    def __init__(self, source: NvmlSource, store: SampleStore, instance: str) -> None:
        self.source = source
        self.store = store
        self.instance = instance
        self.exposure = Exposure(store)
        self.up = False
        self.last_error: str | None = None
        self._opened = False
        self._series = SeriesCache(store, {"job": "nvml", "instance": instance})
        self.latest: list[
            GpuSample
        ] = []  # the last reading, every family (the store keeps only what rules read)

    def collect(self) -> list[GpuSample]:
        """One blocking NVML reading (run it in a thread); errors leave up=0, never raise."""
        try:
            if not self._opened:
                self.source.open()
                self._opened = True
            samples = self.source.collect()
        except NvmlError as exc:
            if self.up or self.last_error != str(exc):
                log.error("NVML failed", extra={"error": str(exc)})
            self.up, self.last_error = False, str(exc)
            self.source.close()
            self._opened = False  # reopen next time: the driver may come back
            return []
        self.up, self.last_error = True, None
        return samples

    def commit(self, samples: list[GpuSample], t_ms: int, keep: frozenset[str] | None) -> None:
        """Store one reading (or its absence) with job="nvml" and this host as instance."""
        batch: list[tuple[Series, float, int]] = []
        self.latest = samples if self.up else []
        for name, labels, value in samples:
            if keep is not None and name not in keep:
                continue
            batch.append((self._series.get(name, labels), value, t_ms))
        if self.up:
            self.exposure.commit(batch, t_ms)
        else:
            self.exposure.stale_all(t_ms)
        self.store.append(
            make_labels("up", {"job": "nvml", "instance": self.instance}),
            t_ms,
            1.0 if self.up else 0.0,
        )

    def close(self) -> None:
        """Release NVML."""
        self.source.close()
        self._opened = False
