"""Gateway signals into the sample store, so that embedded rules see them without a scrape's lag."""

from __future__ import annotations

from ...store import Exposure, SampleStore, Series, SeriesCache
from ..protocol.snapshot import GatewaySnapshot
from .metrics import families


class GatewayFeed:
    """Writes each gateway snapshot as samples (the families our /metrics exports), with staleness."""

    def __init__(self, store: SampleStore) -> None:
        self.store = store
        self.exposure = Exposure(store)
        self._series = SeriesCache(store)

    def commit(self, snap: GatewaySnapshot | None, t_ms: int) -> None:
        """Store one snapshot; None (the gateway is gone) marks every gateway series stale."""
        if snap is None:
            self.exposure.stale_all(t_ms)
            return
        batch: list[tuple[Series, float, int]] = []
        for family in families(snap):
            for sample in family.samples:
                batch.append((self._series.get(sample.name, sample.labels), float(sample.value), t_ms))
        self.exposure.commit(batch, t_ms)
        if len(self._series) > 4 * max(len(batch), 64):  # sessions come and go: forget old series handles
            self._series.clear()
