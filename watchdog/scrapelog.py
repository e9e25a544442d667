"""The scrape log: what every source delivered, compressed, append-only and rotated, for replay.

Format (version 1). A recording named FILE is a series of segments `FILE.000001.gz`, `FILE.000002.gz`, ...;
the writer always starts a new segment (a crashed one is never appended to) and deletes the oldest beyond
`keep`. Each segment is one gzip stream of JSON lines, sync-flushed about once a second, so `zcat` reads it
and a torn tail loses only the last incomplete line. Every segment is self-contained and starts with

    {"type": "header", "format": "vllm-watchdog-scrapelog", "version": 1, "segment": 3, "created": T}

followed by records in the order they happened (`t` is unix seconds):

    {"type": "scrape", "t", "job", "instance", "labels": {target labels}, "duration",
     "body": "exposition text"}          fetched; parse errors and limits are re-judged on replay
     or "delta": [[start, count] | "literal line", ...]   the body as line runs copied from the
                                         previous body of the same job/instance in this segment
     or "error": "message", "kind": "timeout"             the fetch failed
    {"type": "forget", "t", "job", "instance"}            the target was dropped by a reload
    {"type": "probe", "t", "probe": "health"|"canary", "job", "instance", "labels", "ok", "latency",
     "error"}
    {"type": "gpu", "t", "instance", "up", "samples": [[name, {labels}, value], ...]}

Values that JSON cannot hold (NaN, Inf) are written as Python's json writes them (NaN, Infinity).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import WatchdogError

log = logging.getLogger(__name__)

FORMAT = "vllm-watchdog-scrapelog"
VERSION = 1
_SEGMENT = re.compile(r"\.(\d{6,})\.gz$")
_READ_CHUNK = 1 << 16


class ScrapeLogError(WatchdogError):
    """A recording cannot be read (missing, or written by a newer format version)."""


# -- records as the reader returns them ------------------------------------------------------------
@dataclass(frozen=True)
class ScrapeRecord:
    """One scrape of one target: the fetched body, or the fetch error."""

    t: float
    job: str
    instance: str
    labels: Mapping[str, str]
    duration: float
    body: str | None
    error: str | None = None
    kind: str = "connection"


@dataclass(frozen=True)
class ForgetRecord:
    """A reload dropped a target: everything it exposed goes stale."""

    t: float
    job: str
    instance: str


@dataclass(frozen=True)
class ProbeRecord:
    """One health or canary probe outcome."""

    t: float
    probe: str
    job: str
    instance: str
    labels: Mapping[str, str]
    ok: bool
    latency: float
    error: str | None = None


@dataclass(frozen=True)
class GpuRecord:
    """One NVML reading (empty and up=False when NVML failed)."""

    t: float
    instance: str
    up: bool
    samples: Sequence[tuple[str, Mapping[str, str], float]] = field(default_factory=tuple)


Record = ScrapeRecord | ForgetRecord | ProbeRecord | GpuRecord


# -- the line delta of consecutive bodies of one target -------------------------------------------
def encode_delta(prev: list[str], lines: list[str]) -> list[list[int] | str]:
    """Lines as runs copied from `prev` ([start, count]) and literal lines; linear time."""
    index: dict[str, int] = {}
    for i, line in enumerate(prev):
        index.setdefault(line, i)
    ops: list[list[int] | str] = []
    run: list[int] | None = None
    for line in lines:
        if run is not None and run[0] + run[1] < len(prev) and prev[run[0] + run[1]] == line:
            run[1] += 1
            continue
        at = index.get(line)
        if at is None:
            run = None
            ops.append(line)
        else:
            run = [at, 1]
            ops.append(run)
    return ops


def decode_delta(prev: list[str], ops: Sequence[object]) -> list[str]:
    """Rebuild the lines that encode_delta encoded against `prev`."""
    out: list[str] = []
    for op in ops:
        if isinstance(op, str):
            out.append(op)
        elif isinstance(op, list) and len(op) == 2 and min(op) >= 0 and op[0] + op[1] <= len(prev):
            out.extend(prev[op[0] : op[0] + op[1]])
        else:
            raise ValueError(f"bad delta op {op!r}")
    return out


# -- the writer ------------------------------------------------------------------------------------
def segment_paths(path: str) -> list[str]:
    """The segments of a recording, oldest first; a path naming one segment file is just that file."""
    if _SEGMENT.search(path) and os.path.isfile(path):
        return [path]
    found = [p for p in glob.glob(glob.escape(path) + ".*.gz") if _SEGMENT.search(p[len(path) :])]
    return sorted(found, key=_seq)


def _seq(path: str) -> int:
    m = _SEGMENT.search(path)
    return int(m.group(1)) if m else -1


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
        self._seq = max((_seq(p) for p in segment_paths(path)), default=0)
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
        self._seq += 1
        name = f"{self.path}.{self._seq:06d}.gz"
        try:
            fh = open(name, "xb")  # noqa: SIM115 - kept open across calls
        except OSError as exc:
            self._fail("cannot create scrape log segment", name, exc)
            return False
        self._fh, self._seg_bytes = fh, 0
        self._z = zlib.compressobj(self.level, zlib.DEFLATED, 31)
        self._bodies.clear()
        header = {"type": "header", "format": FORMAT, "version": VERSION, "segment": self._seq}
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


# -- the reader ------------------------------------------------------------------------------------
def iter_records(path: str) -> Iterator[Record]:
    """Every record of a recording, oldest segment first; a torn or corrupt tail ends its segment."""
    paths = segment_paths(path)
    if not paths:
        raise ScrapeLogError(f"no scrape log segments at {path} (expected {path}.000001.gz, ...)")
    for seg in paths:
        bodies: dict[tuple[str, str], list[str]] = {}
        for n, raw in enumerate(_lines(seg)):
            try:
                obj = json.loads(raw)
            except ValueError:
                log.warning("skipping a corrupt scrape log line", extra={"path": seg})
                continue
            if n == 0:
                _check_header(seg, obj)
                continue
            try:
                rec = _record(obj, bodies)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("skipping a malformed scrape log record", extra={"path": seg, "error": str(exc)})
                continue
            if rec is not None:
                yield rec


def _check_header(seg: str, obj: Any) -> None:
    if not isinstance(obj, dict) or obj.get("type") != "header" or obj.get("format") != FORMAT:
        raise ScrapeLogError(f"{seg}: not a vllm-watchdog scrape log")
    if not isinstance(obj.get("version"), int) or obj["version"] > VERSION:
        raise ScrapeLogError(f"{seg}: format version {obj.get('version')} is newer than {VERSION}")


def _lines(seg: str) -> Iterator[bytes]:
    """Decompressed complete lines of one segment; stops quietly at a torn or corrupt end."""
    d = zlib.decompressobj(31)
    tail = b""
    with open(seg, "rb") as fh:
        while True:
            chunk = fh.read(_READ_CHUNK)
            if not chunk:
                break
            try:
                data = d.decompress(chunk)
                while d.eof and d.unused_data:  # concatenated gzip members
                    rest = d.unused_data
                    d = zlib.decompressobj(31)
                    data += d.decompress(rest)
            except zlib.error:
                log.warning("scrape log segment is corrupt; reading stops here", extra={"path": seg})
                break
            *complete, tail = (tail + data).split(b"\n")
            yield from complete


def _record(obj: dict[str, Any], bodies: dict[tuple[str, str], list[str]]) -> Record | None:
    kind, t = obj["type"], float(obj["t"])
    if kind == "scrape":
        key = (str(obj["job"]), str(obj["instance"]))
        body: str | None = None
        if "delta" in obj:
            if key not in bodies:
                raise ValueError(f"delta without a base body for {key}")
            lines = decode_delta(bodies[key], obj["delta"])
            bodies[key], body = lines, "\n".join(lines)
        elif "body" in obj:
            body = str(obj["body"])
            bodies[key] = body.split("\n")
        err = obj.get("error")
        return ScrapeRecord(
            t, key[0], key[1], dict(obj["labels"]), float(obj["duration"]), body,
            None if err is None else str(err), str(obj.get("kind", "connection")),
        )  # fmt: skip
    if kind == "forget":
        bodies.pop((str(obj["job"]), str(obj["instance"])), None)
        return ForgetRecord(t, str(obj["job"]), str(obj["instance"]))
    if kind == "probe":
        err = obj.get("error")
        return ProbeRecord(
            t, str(obj["probe"]), str(obj["job"]), str(obj["instance"]), dict(obj["labels"]),
            bool(obj["ok"]), float(obj["latency"]), None if err is None else str(err),
        )  # fmt: skip
    if kind == "gpu":
        rows = tuple((str(n), dict(lab), float(v)) for n, lab, v in obj["samples"])
        return GpuRecord(t, str(obj["instance"]), bool(obj["up"]), rows)
    return None  # a record type from a newer writer of the same version: ignore
