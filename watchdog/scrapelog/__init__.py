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

from .reader import iter_records
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
    encode_delta,
    segment_paths,
)
from .writer import ScrapeLog

__all__ = [
    "FORMAT",
    "VERSION",
    "ForgetRecord",
    "GpuRecord",
    "ProbeRecord",
    "Record",
    "ScrapeLog",
    "ScrapeLogError",
    "ScrapeRecord",
    "decode_delta",
    "encode_delta",
    "iter_records",
    "segment_paths",
]
