"""Reading the scrape log back, across segments, up to a torn or corrupt tail."""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterator
from typing import Any

from .records import (
    FORMAT,
    VERSION,
    ForgetRecord,
    GpuRecord,
    ProbeRecord,
    Record,
    ScrapeLogError,
    ScrapeRecord,
    decode_delta,
    segment_paths,
)

log = logging.getLogger(__name__)
_READ_CHUNK = 1 << 16


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
