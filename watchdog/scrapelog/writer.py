"""Writing the scrape log: buffered, compressed, rotated, never raising on I/O errors."""

from __future__ import annotations

import json
import logging
import os
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .records import FORMAT, VERSION, encode_delta, segment_number, segment_paths

log = logging.getLogger(__name__)


class ScrapeLog:
    """Append-only recorder the monitor calls after each scrape and probe; never raises on I/O errors.

    Records are compressed into memory as they come and written once `flush_interval` has passed (the
    daemon also calls flush() every second), so a crash loses at most about a second. A write costs a
    JSON encode and a deflate of the new lines (about 0.3 ms for a 50 kB vLLM body); call it from the
    event loop."""

    def __init__(
        self,
        path: str,
        *,
        max_bytes: int = 64 << 20,
        keep: int = 8,
        clock: Callable[[], float] = time.time,
        flush_interval: float = 1.0,
        level: int = 6,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = max(keep, 1)
        self.clock = clock
        self.flush_interval = flush_interval
        self.level = level
        self.errors = 0  # I/O errors (each abandons the current segment)
        self.dropped = 0  # records lost to I/O errors
        self.records = 0
        self.bytes_written = 0
        self._fh: Any = None
        self._z: Any = None
        self._pending = bytearray()
        self._unflushed = 0
        self._seg_bytes = 0
        self._segment = max((segment_number(p) for p in segment_paths(path)), default=0)
        self._bodies: dict[tuple[str, str], list[str]] = {}
        self._last_flush = clock()
        self._failing = False
        self._closed = False
        self._retry_at = 0.0

    # -- records --------------------------------------------------------------------------------
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
        """One scrape: the body as fetched (delta-encoded against the previous one), or the fetch error."""
        if not self._ready():
            self._bodies.pop((job, instance), None)  # its successor must not be a delta to a lost body
            return
        rec: dict[str, Any] = {"type": "scrape", "t": t, "job": job, "instance": instance}
        rec["labels"], rec["duration"] = dict(labels), duration
        if body is None:
            rec["error"], rec["kind"] = error or "unknown error", kind
        else:
            lines = body.split("\n")
            prev = self._bodies.get((job, instance))
            if prev is None:
                rec["body"] = body
            else:
                rec["delta"] = encode_delta(prev, lines)
            self._bodies[(job, instance)] = lines
        self._write(rec)

    def record_forget(self, *, t: float, job: str, instance: str) -> None:
        """A reload dropped a target."""
        self._bodies.pop((job, instance), None)
        if self._ready():
            self._write({"type": "forget", "t": t, "job": job, "instance": instance})

    def record_probe(
        self,
        *,
        t: float,
        probe: str,
        job: str,
        instance: str,
        labels: Mapping[str, str],
        ok: bool,
        latency: float,
        error: str | None = None,
    ) -> None:
        """One health or canary outcome."""
        if not self._ready():
            return
        rec = {"type": "probe", "t": t, "probe": probe, "job": job, "instance": instance}
        self._write(rec | {"labels": dict(labels), "ok": ok, "latency": latency, "error": error})

    def record_gpu(
        self, *, t: float, instance: str, up: bool, samples: Sequence[tuple[str, Mapping[str, str], float]]
    ) -> None:
        """One NVML reading."""
        if not self._ready():
            return
        rows = [[name, dict(labels), value] for name, labels, value in samples]
        self._write({"type": "gpu", "t": t, "instance": instance, "up": up, "samples": rows})

    # -- segments -------------------------------------------------------------------------------
    def _ready(self) -> bool:
        """A segment is open (opening one if due); False drops the record."""
        if self._z is not None:
            return True
        if self._closed:
            return False
        now = self.clock()
        if now >= self._retry_at:
            if self._open():
                return True
            self._retry_at = now + self.flush_interval
        self.dropped += 1
        return False

    def _write(self, rec: dict[str, Any]) -> None:
        line = json.dumps(rec, separators=(",", ":")).encode() + b"\n"
        self._pending += self._z.compress(line)
        self._unflushed += 1
        self.records += 1
        if self.clock() - self._last_flush >= self.flush_interval:
            self.flush()

    def _open(self) -> bool:
        """Start the next segment with its header; False (logged once per failure streak) on error."""
        self._segment += 1
        name = f"{self.path}.{self._segment:06d}.gz"
        try:
            fh = open(name, "xb")  # noqa: SIM115 - kept open across calls
        except OSError as exc:
            self._fail("cannot create scrape log segment", name, exc)
            return False
        self._fh, self._seg_bytes = fh, 0
        self._z = zlib.compressobj(self.level, zlib.DEFLATED, 31)
        self._bodies.clear()
        header = {"type": "header", "format": FORMAT, "version": VERSION, "segment": self._segment}
        header_line = json.dumps(header | {"created": self.clock()}).encode() + b"\n"
        self._pending = bytearray(self._z.compress(header_line))
        self._prune()
        return True

    def _prune(self) -> None:
        for old in segment_paths(self.path)[: -self.keep]:
            try:
                os.unlink(old)
            except OSError as exc:
                self._fail("cannot delete old scrape log segment", old, exc)

    def _fail(self, message: str, name: str, exc: OSError) -> None:
        self.errors += 1
        if not self._failing:
            log.error(message, extra={"path": name, "error": str(exc)})
        self._failing = True

    def flush(self) -> None:
        """Write what is buffered (a sync-flushed deflate block); rotate when the segment is full."""
        self._last_flush = self.clock()
        if self._z is None:
            return
        data = bytes(self._pending) + self._z.flush(zlib.Z_SYNC_FLUSH)
        self._pending.clear()
        if not self._put(data):
            return
        self._unflushed = 0
        self._failing = False
        if self._seg_bytes >= self.max_bytes:
            self._finish()

    def _put(self, data: bytes) -> bool:
        try:
            self._fh.write(data)
            self._fh.flush()
        except OSError as exc:
            self._fail("cannot write scrape log", self._fh.name, exc)
            self.dropped += self._unflushed
            self._unflushed = 0
            self._abandon()
            return False
        self._seg_bytes += len(data)
        self.bytes_written += len(data)
        return True

    def _finish(self) -> None:
        """End the current segment with the gzip trailer; the next record opens a new one."""
        if self._z is not None and self._put(bytes(self._pending) + self._z.flush(zlib.Z_FINISH)):
            self._abandon()

    def _abandon(self) -> None:
        fh, self._fh, self._z = self._fh, None, None
        self._pending.clear()
        self._bodies.clear()
        try:
            fh.close()
        except OSError as exc:
            self._fail("cannot close scrape log", fh.name, exc)

    def close(self) -> None:
        """Flush and end the current segment; later records are ignored."""
        if self._z is not None:
            self._finish()
        self._closed = True
