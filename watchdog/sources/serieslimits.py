"""What a scrape may bring into the store: Prometheus' label limits per series, a cap on a target's series.

A scrape that breaks either fails as a whole (ScrapeError; the scraper stores nothing of it), as Prometheus
fails a scrape over its `label_limit`, `label_name_length_limit` or `label_value_length_limit`. Prometheus has
no cap on the series one target keeps over time: its head block holds them for up to three hours. The
watchdog's store holds a series as long as the longest range a rule reads of its family, so a target that
renames its series at every scrape would grow it for that long; `series_limit` stops it.
"""

from __future__ import annotations

from ..config.limits import ScrapeLimits
from ..errors import ScrapeError
from ..formats.gostrconv import go_quote
from ..store import Labels, Series, metric_name

LABEL_LIMITS = "label_limits"  # ScrapeError.kind of the three, as Prometheus counts them together
SERIES_LIMIT = "series_limit"


def _byte_length(text: str) -> int:
    """len() of Go's string: UTF-8 bytes."""
    return len(text) if text.isascii() else len(text.encode())


def _short(text: str) -> str:
    """Go's %.50s."""
    return text[:50]


def check_labels(labels: Labels, limits: ScrapeLimits) -> None:
    """ScrapeError if the series (the target's labels added) breaks a label limit: Prometheus'
    verifyLabelLimits, its checks in its order and its messages."""
    name = metric_name(labels)
    if limits.label_limit and len(labels) > limits.label_limit:
        raise ScrapeError(
            f"label_limit exceeded (metric: {_short(name)}, number of labels: {len(labels)}, "
            f"limit: {limits.label_limit})",
            LABEL_LIMITS,
        )
    name_limit, value_limit = limits.label_name_length_limit, limits.label_value_length_limit
    for label, value in labels:
        if name_limit and len(label) > name_limit:  # label names are ASCII: the parser takes no other
            raise ScrapeError(
                f"label_name_length_limit exceeded (metric: {_short(name)}, label name: {_short(label)}, "
                f"length: {len(label)}, limit: {name_limit})",
                LABEL_LIMITS,
            )
        if value_limit and len(value) > value_limit // 4 and (length := _byte_length(value)) > value_limit:
            raise ScrapeError(
                f"label_value_length_limit exceeded (metric: {_short(name)}, label name: {_short(label)}, "
                f"value: {go_quote(_short(value))}, length: {length}, limit: {value_limit})",
                LABEL_LIMITS,
            )


def label_bytes(labels: Labels) -> int:
    """The label text of a series (names and values, in characters): what its labels take in the store."""
    return sum(len(name) + len(value) for name, value in labels)


class HeldSeries:
    """The series one target has put in the store, or may yet (its scraper caches them): at most `limit`, and
    at most `max_bytes` of label text (0: no limit).

    A series leaves when the store drops it (`registered` goes false at the end of the retention); the count
    is re-taken only when a scrape would go over a limit: within them, a new series costs one lookup.
    """

    def __init__(self, limit: int, max_bytes: int) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.bytes = 0
        self._held: dict[Labels, Series] = {}

    def add(self, series: Series) -> None:
        """Count a series a scrape brings; ScrapeError (kind series_limit) if it is one too many."""
        labels, held = series.labels, self._held
        if labels in held:
            held[labels] = series
            return
        size = label_bytes(labels)
        if self.limit and len(held) >= self.limit:
            what = f"series held: {len(held)}, limit: {self.limit}"
        elif self.max_bytes and self.bytes + size > self.max_bytes:
            what = f"label text held: {self.bytes} + {size} bytes, limit: {self.max_bytes}"
        else:
            held[labels] = series
            self.bytes += size
            return
        raise ScrapeError(f"series_limit exceeded (metric: {_short(series.name)}, {what})", SERIES_LIMIT)

    def recount(self) -> set[Labels]:
        """Forget the series the store no longer holds, and return their labels: no cache may hand them out
        again, uncounted. Only between scrapes: a scrape's own new series are not in the store yet."""
        gone = {labels for labels, series in self._held.items() if not series.registered}
        for labels in gone:
            del self._held[labels]
            self.bytes -= label_bytes(labels)
        return gone

    def __len__(self) -> int:
        return len(self._held)
