"""Gateway signals into the sample store, so that embedded rules see them without a scrape's lag."""

from __future__ import annotations

from ..store import Exposure, SampleStore, Series, make_labels
from .metrics import families
from .snapshot import GatewaySnapshot


class GatewayFeed:
    """Writes each gateway snapshot as samples (the families our /metrics exports), with staleness."""

    def __init__(self, store: SampleStore) -> None:
        self.store = store
        self.exposure = Exposure(store)
        self._cache: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = {}

    def commit(self, snap: GatewaySnapshot | None, t_ms: int) -> None:
        """Store one snapshot; None (the gateway is gone) marks every gateway series stale."""
        if snap is None:
            self.exposure.stale_all(t_ms)
            return
        batch: list[tuple[Series, float, int]] = []
        for family in families(snap):
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                series = self._cache.get(key)
                if series is None:
                    series = self._cache[key] = self.store.get(make_labels(sample.name, dict(sample.labels)))
                batch.append((series, float(sample.value), t_ms))
        self.exposure.commit(batch, t_ms)
        if len(self._cache) > 4 * max(len(batch), 64):  # sessions come and go: forget old series handles
            self._cache.clear()
