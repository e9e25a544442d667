"""Scraping one Prometheus text endpoint into the sample store, the way Prometheus does."""

from __future__ import annotations

import asyncio
import math
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..config.httpauth import ClientSettings
from ..config.limits import ScrapeLimits
from ..errors import SampleLimitError, ScrapeError
from ..logs import bound
from ..store import Exposure, SampleStore, Series, make_labels
from .aliases import current_name
from .exposition import ExpositionError, iter_samples, parse_series, scan
from .httpget import HttpGet
from .serieslimits import SERIES_LIMIT, HeldSeries, check_labels

_SKIP = Series(())  # cached for series that the rules do not need
# A sample's own timestamp must lie within these bounds of the scrape time, as Prometheus accepts it: at most
# 10 minutes ahead (scrape.go's maxAheadTime) and at most 1 hour behind (the TSDB head's minimum valid time,
# half a 2 h block behind its newest sample). Outside them it is dropped and counted: one far-future sample
# stored would make every later sample of its series out of order, freezing the series.
MAX_AHEAD_MS = 10 * 60 * 1000
MAX_BEHIND_MS = 60 * 60 * 1000
OUT_OF_BOUNDS = "error on ingesting samples that are too old or are too far into the future"
_HEADERS = {
    "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
    # Identity keeps CPU low on loopback and rules out decompression bombs.
    "Accept-Encoding": "identity",
    "User-Agent": "vllm-watchdog",
}


def _parse_error(exc: ExpositionError) -> ScrapeError:
    """The scrape error of a malformed body, with the line that is wrong."""
    return ScrapeError(f"parse error: line {exc.line}: {exc.message}", "parse")


class ScrapeRecorder(Protocol):
    """Receives every scrape outcome as fetched (`scrapelog.ScrapeLog` records them for replay)."""

    def record_scrape(
        self,
        *,
        t: float,
        job: str,
        instance: str,
        labels: Mapping[str, str],
        body: str | None,
        error: str | None = None,
        kind: str = "connection",
        duration: float = 0.0,
    ) -> None:
        """One scrape: the body as fetched, or the fetch error."""

    def record_forget(self, *, t: float, job: str, instance: str) -> None:
        """The target was dropped."""


@dataclass
class ScrapeStatus:
    """What the last scrape of a target saw, for the API and own metrics."""

    up: bool = False
    last_scrape: float | None = None
    last_duration: float = 0.0
    last_error: str | None = None
    error_kind: str | None = None  # ScrapeError.kind of the last failure; None when the last scrape worked
    samples: int = 0
    scrapes: int = 0
    failures: int = 0
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    out_of_bounds: int = 0  # samples of the last scrape dropped for their timestamp
    out_of_bounds_total: int = 0
    series_held: int = 0  # series of this target the store holds, or may yet (series_limit caps them)


class ScrapeTarget:
    """One endpoint: fetch, parse with a per-target series cache, commit atomically, mark stale."""

    def __init__(
        self,
        *,
        url: str,
        job: str,
        instance: str,
        store: SampleStore,
        timeout: float,
        sample_limit: int,
        body_size_limit: int,
        label_limit: int = ScrapeLimits.label_limit,
        label_name_length_limit: int = ScrapeLimits.label_name_length_limit,
        label_value_length_limit: int = ScrapeLimits.label_value_length_limit,
        series_limit: int | None = ScrapeLimits.series_limit,
        keep_name: Callable[[str], bool] | None = None,
        extra_labels: dict[str, str] | None = None,
        monotonic: Callable[[], float] = time.perf_counter,
        recorder: ScrapeRecorder | None = None,
        tls: ssl.SSLContext | None = None,
        settings: ClientSettings | None = None,
    ) -> None:
        self.url = url
        self.settings = settings  # the target's TLS and credentials
        self.job = job
        self.instance = instance
        self.store = store
        self.tls = tls
        self._http: HttpGet | None = None  # made at the first fetch: replay and benches never fetch
        self.timeout = timeout
        self.limits = ScrapeLimits(
            sample_limit=sample_limit,
            body_size_limit=body_size_limit,
            label_limit=label_limit,
            label_name_length_limit=label_name_length_limit,
            label_value_length_limit=label_value_length_limit,
            series_limit=series_limit,
        )
        self.sample_limit = sample_limit
        self.body_size_limit = body_size_limit
        self._held = HeldSeries(self.limits.held_series, self.limits.held_label_bytes)
        self.keep_name = keep_name
        self.extra_labels = dict(extra_labels or {})
        self.target_labels = {**self.extra_labels, "job": job, "instance": instance}
        self.monotonic = monotonic
        self.recorder = recorder
        self.status = ScrapeStatus()
        self._cache: dict[str, Series] = {}
        self._cache_bytes = 0  # of its keys: a target churning long label sets must not fill memory either
        self.exposure = Exposure(store)
        self._synthetic: dict[str, Series] = {}

    async def fetch(self) -> str:
        """GET the body, bounded by timeout (overall, as Prometheus' scrape_timeout) and body_size_limit."""
        try:
            # One deadline over the whole exchange: a target that trickles its body, a byte at a time, must
            # not hold the scrape longer than a silent one.
            async with asyncio.timeout(self.timeout):
                return await self._fetch()
        except TimeoutError as exc:
            raise ScrapeError(f"timeout after {self.timeout:g}s (deadline exceeded)", "timeout") from exc

    async def _fetch(self) -> str:
        if self._http is None:
            self._http = HttpGet(self.url, _HEADERS, self.body_size_limit, self.tls, settings=self.settings)
        resp = await self._http.get()
        if resp.status != 200:
            raise ScrapeError(f"server returned HTTP status {resp.status}", "status")
        try:
            return resp.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ScrapeError(f"body is not UTF-8: {exc}", "encoding") from exc

    @property
    def connected(self) -> bool:
        """Whether the scrape connection is open (kept alive between scrapes)."""
        return self._http is not None and self._http.connected

    async def aclose(self) -> None:
        """Close the kept-alive scrape connection."""
        if self._http is not None:
            await self._http.aclose()

    def _series_for(self, raw: str) -> Series:
        self._cache_bytes += len(raw)
        name, labels = parse_series(raw)
        name = current_name(name)
        for key, value in self.target_labels.items():
            if key in labels and labels[key] != "":
                labels["exported_" + key] = labels[key]  # honor_labels: false
            labels[key] = value
        full = make_labels(name, labels)
        # Every series, those the rules do not read too: the target's `up` is what a Prometheus with the same
        # limits (and no metric relabelling) would say of it, and no cached key is longer than they allow.
        check_labels(full, self.limits)
        if self.keep_name is not None and not self.keep_name(name):
            return _SKIP
        series = self.store.get(full)
        self._held.add(series)
        return series

    def _recount_held(self) -> bool:
        """Forget the held series the store dropped (and their cache entries); whether there were any."""
        gone = self._held.recount()
        if gone:
            cache = self._cache
            for key in [key for key, series in cache.items() if series.labels in gone]:
                del cache[key]
        return bool(gone)

    def ingest(self, text: str, t_ms: int, limit_checked: bool = False) -> int:
        """Parse a body and commit its samples atomically; return the number of samples read. `limit_checked`:
        the body is known to be within sample_limit (scrape() counted it off the event loop)."""
        cache = self._cache
        if len(cache) > 4 * self.sample_limit or self._cache_bytes > self.body_size_limit:
            cache.clear()  # a target churning label values must not grow the cache without bound
            self._cache_bytes = 0
        lowest, highest = t_ms - MAX_BEHIND_MS, t_ms + MAX_AHEAD_MS
        try:
            if not limit_checked:
                self._check_limit(text)
            try:
                batch, count, dropped = scan(text, cache, self._series_for, _SKIP, t_ms, lowest, highest)
            except ScrapeError as exc:
                # Over series_limit: once the series the store has dropped since are let go, it may fit.
                if exc.kind != SERIES_LIMIT or not self._recount_held():
                    raise
                batch, count, dropped = scan(text, cache, self._series_for, _SKIP, t_ms, lowest, highest)
        except ExpositionError as exc:
            raise _parse_error(exc) from exc
        finally:
            self.status.series_held = len(self._held)
        self.exposure.commit(batch, t_ms)
        self.status.out_of_bounds = dropped
        self.status.out_of_bounds_total += dropped
        return count

    def _check_limit(self, text: str) -> None:
        """SampleLimitError if the body holds more samples than sample_limit (ExpositionError if a line is
        malformed: a parse error comes first, as in Prometheus).

        Only a body with more lines than the limit can, so a healthy scrape pays one C-speed count. A series
        explosion costs one pass of the line splitter and nothing else: no label set of it is parsed, cached
        or stored (parsing first would cache up to the whole body's series, hundreds of MB per scrape).
        """
        if self._may_exceed(text):
            self._count_samples(text)

    def _may_exceed(self, text: str) -> bool:
        return text.count("\n") >= self.sample_limit

    def _count_samples(self, text: str) -> None:
        limit = self.sample_limit
        count = sum(1 for _ in iter_samples(text))
        if count > limit:
            raise SampleLimitError(f"sample_limit exceeded: {count} samples > limit {limit}")

    async def _check_limit_off_loop(self, text: str) -> None:
        """_check_limit with the slow count in a worker thread: an explosion of 300,000 series (12 MB) takes
        the line splitter 0.4 s, which on the loop would hold every other target's scrape and, on a loaded
        machine, time out those in flight."""
        if self._may_exceed(text):
            try:
                await asyncio.to_thread(self._count_samples, text)
            except ExpositionError as exc:
                raise _parse_error(exc) from exc

    def _synth(self, name: str, t_ms: int, value: float) -> None:
        series = self._synthetic.get(name)
        if series is None:
            series = self.store.get(make_labels(name, self.target_labels))
            self._synthetic[name] = series
        series.append(t_ms, value)
        self.store.register(series)

    async def scrape(self, now: float) -> ScrapeStatus:
        """One scrape at wall-clock `now`; never raises for target faults."""
        start = self.monotonic()
        text: str | None = None
        error: ScrapeError | None = None
        try:
            text = await self.fetch()
            await self._check_limit_off_loop(text)
        except ScrapeError as exc:
            error = exc
        status = self.complete(now, text, error, lambda: self.monotonic() - start, limit_checked=True)
        if self.recorder is not None:
            self.recorder.record_scrape(
                t=now,
                job=self.job,
                instance=self.instance,
                labels=self.extra_labels,
                body=text,
                error=None if error is None else bound(str(error)),
                kind="connection" if error is None else error.kind,
                duration=status.last_duration,
            )
        return status

    def complete(
        self,
        now: float,
        text: str | None,
        error: ScrapeError | None,
        elapsed: Callable[[], float],
        limit_checked: bool = False,
    ) -> ScrapeStatus:
        """Commit one fetched body (or the fetch error) at `now`; replay feeds recorded outcomes here."""
        t_ms = math.floor(now * 1000)
        status = self.status
        status.scrapes += 1
        try:
            if error is not None:
                raise error
            status.samples = self.ingest(text or "", t_ms, limit_checked)
            status.up, status.last_error, status.error_kind = True, None, None
            if status.out_of_bounds:  # up stays 1, as in Prometheus, but the status says what was lost
                status.last_error = f"{OUT_OF_BOUNDS}: {status.out_of_bounds} dropped"
        except ScrapeError as exc:
            status.errors_by_kind[exc.kind] = status.errors_by_kind.get(exc.kind, 0) + 1
            status.up, status.last_error, status.samples = False, bound(str(exc)), 0
            status.error_kind, status.out_of_bounds = exc.kind, 0
            status.failures += 1
            self.exposure.stale_all(t_ms)
        status.last_duration = elapsed()
        status.last_scrape = now
        self._synth("up", t_ms, 1.0 if status.up else 0.0)
        self._synth("scrape_duration_seconds", t_ms, status.last_duration)
        self._synth("scrape_samples_scraped", t_ms, float(status.samples))
        return status

    def forget(self, now: float) -> None:
        """The target was removed from config: stale-mark everything it owned."""
        now_ms = math.floor(now * 1000)
        if self.recorder is not None:
            self.recorder.record_forget(t=now, job=self.job, instance=self.instance)
        self.exposure.stale_all(now_ms)
        for series in self._synthetic.values():
            series.mark_stale(now_ms)
