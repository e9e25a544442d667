"""The scrape log's records, line-delta coding of bodies, and segment naming."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import WatchdogError

FORMAT = "vllm-watchdog-scrapelog"
VERSION = 1
_SEGMENT = re.compile(r"\.(\d{6,})\.gz$")


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
    return sorted(found, key=segment_number)


def segment_number(path: str) -> int:
    """The NNNNNN of FILE.NNNNNN.gz; -1 if the path does not name a segment."""
    m = _SEGMENT.search(path)
    return int(m.group(1)) if m else -1
