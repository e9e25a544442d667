"""Live fake vLLM targets for bench/scrape.py: the real /metrics capture with every counter moving.

Each target serves the vLLM 0.32 capture with every counter (`_total`), every histogram bucket, `_count`
and `_sum`, and every summary `_count` and `_sum` advancing with time, at rates like a busy server's: the
capture's own values (one short run of a couple of requests) scaled so that about 10 requests a second
finish (~6,800 prompt and ~350 generation tokens a second), and a floor of 0.5/s for counters still at zero
in the capture (preemptions, errors, aborts, the HTTP histograms). Gauges and `_created` stay as captured.
Values are a function of the time since the server started, so every scrape sees larger counters than the
one before, and the daemon and Prometheus scraping the same target see the same series. Histograms stay
consistent: buckets are cumulative and `+Inf` equals `_count` on every render (counts are whole numbers:
each bucket's increase is floor(rate x fraction x t), the fraction nondecreasing in `le` and exactly 1 at
`+Inf`). Target i's rates are scaled by 0.5 + (i % 10) / 10, so targets differ.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

REQUESTS_PER_S = 10.0  # finished requests a second on a busy server
ZERO_RATE = 0.5  # a second, for counters the capture has at zero
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n"


@dataclass
class Slot:
    """One moving sample: value(t) = base + rate * t (whole: base + floor(rate * t))."""

    base: float
    rate: float
    whole: bool


def _families(lines: list[str]) -> dict[str, str]:
    """Family name -> type, from the # TYPE lines."""
    return {p[2]: p[3] for ln in lines if ln.startswith("# TYPE ") and len(p := ln.split()) >= 4}


def _family_of(name: str, types: dict[str, str]) -> tuple[str, str, str]:
    """(family, its type, suffix) of a sample name; suffix '' for a plain sample."""
    for suffix in ("_bucket", "_count", "_sum", "_total", "_created", ""):
        if suffix and not name.endswith(suffix):
            continue
        fam = name[: len(name) - len(suffix)] if suffix else name
        if fam in types:
            return fam, types[fam], suffix
        if suffix == "_total" and name in types:
            return name, types[name], suffix
    return name, "untyped", ""


def _split(line: str) -> tuple[str, str, float]:
    """(name, the sample's text up to its value, value) of a sample line without timestamp."""
    head, value = line.rsplit(" ", 1)
    return head.split("{", 1)[0], head, float(value)


def _series_key(head: str) -> str:
    """A histogram sample's series without `le` and suffix, to group its buckets with _count and _sum."""
    name, _, labels = head.partition("{")
    for suffix in ("_bucket", "_count", "_sum"):
        name = name.removesuffix(suffix)
    kept = [p for p in labels.rstrip("}").split(",") if p and not p.startswith("le=")]
    return name + "{" + ",".join(kept) + "}"


def _spread(count0: float, buckets: list[float], i: int) -> float:
    """Cumulative fraction of new observations in finite bucket i (of n): the capture's, smoothed half into
    the next bucket up so quantiles move between neighbours; spread evenly if the capture has none; exactly
    1.0 for +Inf (i == n)."""
    n = len(buckets)
    if i >= n:
        return 1.0
    if count0 <= 0:
        return (i + 1) / (n + 1)
    below = buckets[i - 1] if i else 0.0
    return min(1.0, 0.5 * (buckets[i] + below) / count0)


def _histogram_slots(samples: list[tuple[str, str, float]], suffixes: list[str]) -> list[Slot]:
    """Slots for one histogram (or summary) series: its buckets in order, then _count and _sum."""
    count0 = next((v for (n, _, v), s in zip(samples, suffixes, strict=True) if s == "_count"), 0.0)
    finite = [
        v for (_, h, v), s in zip(samples, suffixes, strict=True) if s == "_bucket" and 'le="+Inf"' not in h
    ]
    total0 = next((v for (n, _, v), s in zip(samples, suffixes, strict=True) if s == "_sum"), 0.0)
    scale = REQUESTS_PER_S / 2  # the capture finished about 2 requests
    rate = max(count0 * scale, ZERO_RATE)
    mean = total0 / count0 if count0 > 0 else 0.1
    slots, i = [], 0
    for (_, head, value), suffix in zip(samples, suffixes, strict=True):
        if suffix == "_bucket":
            frac = 1.0 if 'le="+Inf"' in head else _spread(count0, finite, i)
            i += 0 if 'le="+Inf"' in head else 1
            slots.append(Slot(value, rate * frac, True))
        elif suffix == "_count":
            slots.append(Slot(value, rate, True))
        else:
            slots.append(Slot(value, rate * mean, False))
    return slots


def _counter_rate(head: str, value: float) -> float:
    """A counter's increase a second: the capture's value scaled to ~10 requests/s (CPU seconds: one core)."""
    return 1.0 if head.startswith("process_cpu_seconds") else max(value * REQUESTS_PER_S / 2, ZERO_RATE)


class LivePayload:
    """The capture as a template: static text between moving values, rendered for a target at a time."""

    def __init__(self, text: str) -> None:
        lines = text.splitlines()
        types = _families(lines)
        self.parts: list[str] = []  # static text; a moving value goes between two parts
        self.slots: list[Slot] = []
        pending: list[str] = []
        groups: dict[str, list[int]] = {}  # histogram/summary series -> indices of its slots
        kinds: list[tuple[str, str, float, str]] = []
        for line in lines:
            if line.startswith("#") or not line.strip():
                pending.append(line + "\n")
                continue
            name, head, value = _split(line)
            _fam, kind, suffix = _family_of(name, types)
            moving = (kind == "counter" and suffix == "_total") or (
                kind in ("histogram", "summary") and suffix in ("_bucket", "_count", "_sum")
            )
            if not moving:
                pending.append(line + "\n")
                continue
            pending.append(head + " ")
            self.parts.append("".join(pending))
            pending = ["\n"]
            kinds.append((head, suffix, value, kind))
            if kind in ("histogram", "summary"):
                groups.setdefault(_series_key(head), []).append(len(kinds) - 1)
        self.parts.append("".join(pending))
        self.slots = [Slot(v, _counter_rate(h, v), False) for h, _, v, _ in kinds]
        for idx in groups.values():
            hs = _histogram_slots([(_series_key(kinds[i][0]), kinds[i][0], kinds[i][2]) for i in idx],
                                  [kinds[i][1] for i in idx])  # fmt: skip
            for i, slot in zip(idx, hs, strict=True):
                self.slots[i] = slot

    def render(self, t: float, scale: float) -> bytes:
        """The payload `t` seconds after start for a target whose rates are multiplied by `scale`."""
        out = [self.parts[0]]
        for slot, part in zip(self.slots, self.parts[1:], strict=True):
            grown = slot.rate * scale * t
            out.append(repr(slot.base + (math.floor(grown) if slot.whole else grown)))
            out.append(part)
        return "".join(out).encode()


async def serve_live(text: str, ports: list[int], lifetime: float) -> None:
    """One asyncio process serving the live payload of `text` at /metrics (200 at /health) on every port."""
    payload, start = LivePayload(text), time.monotonic()
    ok = HEAD % 3 + b"OK\n"

    def handler(scale: float) -> object:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    request = await reader.readuntil(b"\r\n\r\n")
                    path = request.split(b" ", 2)[1]
                    if path == b"/metrics":
                        body = payload.render(time.monotonic() - start, scale)
                        writer.write(HEAD % len(body) + body)
                    else:
                        writer.write(
                            ok
                            if path == b"/health"
                            else b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
                        )
                    await writer.drain()
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, IndexError):
                writer.close()

        return handle

    servers = [await asyncio.start_server(handler(0.5 + (i % 10) / 10), "127.0.0.1", p)  # type: ignore[arg-type]
               for i, p in enumerate(ports)]  # fmt: skip
    await asyncio.sleep(lifetime)
    for s in servers:
        s.close()
