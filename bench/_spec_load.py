"""Part of bench/speculation.py: the traffic and the measurement.

A workload is one or more segments (a text and a number of closed-loop clients for some seconds). Goodput is
read from the server's own counter, vllm:generation_tokens_total, over a window that starts after a warm-up
(`WARM`): from the end of the first segment's warm-up to the end of the last segment. A count from the
clients' side, from the first request to the last answer, reads the ramp and the last wave's tail too; with
32-token answers at 64 clients a point of 8 s is only a few waves, and that count moved by up to 2x between
two measurements of one server. Each request's max_tokens is drawn between half and 1.5 times the bench's, so
that the clients do not all finish in one step and start again together (waves).

While a window runs, /metrics is read every second into the watchdog's estimator
(watchdog/sources/specgoodput.py), as the watchdog's scrapes would.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vllm_watchdog.sources.exposition import parse  # noqa: E402
from vllm_watchdog.sources.speccollector import COUNTERS, PER_POS, RUNNING  # noqa: E402
from vllm_watchdog.sources.specgoodput import Snapshot, SpecGoodput  # noqa: E402

WARM = 2.0  # seconds of each workload before its window starts
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "golf", "hotel", "india", "kilo", "lima", "oscar")
SNIPPET = "for i in range(10):\n    total = total + values[i] * weights[i]\n"


@dataclass(frozen=True)
class Text:
    """One kind of traffic: its prompts and sampling."""

    name: str
    temperature: float

    def body(self, rng: random.Random, max_tokens: int) -> dict[str, object]:
        """One completion request, its length drawn around max_tokens."""
        words = " ".join(rng.choice(WORDS) for _ in range(160))
        prompt = SNIPPET * 12 if self.temperature == 0 else words
        return {
            "model": "tiny-llama",
            "prompt": prompt,
            "max_tokens": rng.randint(max(max_tokens // 2, 1), max_tokens * 3 // 2),
            "temperature": self.temperature,  # no per-request seed: vLLM 0.32's CPU sampler crashes on it
            "ignore_eos": True,
        }


REPEAT = Text(
    "repeat", 0.0
)  # a repeated code snippet, greedy: the ngram draft copies the prompt and the loops
SAMPLED = Text("sampled", 1.0)  # random words at temperature 1: the ngram proposer finds no match


@dataclass(frozen=True)
class Segment:
    """`clients` closed-loop clients sending `text` for `seconds`."""

    text: Text
    clients: int
    seconds: float


@dataclass(frozen=True)
class Workload:
    """What one measurement sends; `group` names the estimate its scrapes feed (and the schedule it gets)."""

    name: str
    group: str
    segments: tuple[Segment, ...]


def snapshot_of(text: str, now: float) -> Snapshot | None:
    """vLLM's counters from a /metrics body (summed over engines), under the names the watchdog's collector
    reads (sources/speccollector.py); None without the step counters."""
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for name, labels, value, _ in parse(text):
        if name == PER_POS:
            pos = int(labels.get("position", "0"))
            per_pos[pos] = per_pos.get(pos, 0.0) + value
        else:
            sums[name] = sums.get(name, 0.0) + value
    if not {COUNTERS["steps"], COUNTERS["step_tokens"], COUNTERS["generated"], RUNNING} <= sums.keys():
        return None
    values = {key: sums.get(name, 0.0) for key, name in COUNTERS.items()}
    positions = tuple(per_pos.get(i, 0.0) for i in range(len(per_pos)))
    return Snapshot(now, sums[RUNNING], per_pos=positions, **values)


@dataclass
class Tally:
    """Requests that failed during a workload (a measurement with errors is reported, not hidden)."""

    errors: int = 0


async def _client(
    c: httpx.AsyncClient, url: str, text: Text, rng: random.Random, stop: asyncio.Event, mt: int, tally: Tally
) -> None:
    while not stop.is_set():
        try:
            resp = await c.post(url + "/v1/completions", json=text.body(rng, mt), timeout=300)
            resp.raise_for_status()
        except httpx.HTTPError:
            tally.errors += 1
            await asyncio.sleep(0.2)


async def _read(c: httpx.AsyncClient, url: str) -> Snapshot:
    resp = await c.get(url + "/metrics", timeout=30)
    snap = snapshot_of(resp.text, time.monotonic())
    if snap is None:
        raise RuntimeError(f"{url}/metrics has no vllm:generation_tokens_total or no step counters")
    return snap


async def _scrape(c: httpx.AsyncClient, url: str, est: SpecGoodput | None, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        if est is not None and not stop.is_set():
            with contextlib.suppress(httpx.HTTPError, RuntimeError):
                est.observe(await _read(c, url))


async def measure(
    url: str, work: Workload, max_tokens: int, est: SpecGoodput | None, seed: int
) -> tuple[float, int]:
    """Goodput (generated tokens per second, the server's counter over the window) and errors of one run of
    `work`; `est` is fed a snapshot a second during the window."""
    tally = Tally()
    peak = max(s.clients for s in work.segments)
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=peak + 8)) as c:
        clients: list[asyncio.Task[None]] = []
        stops: list[asyncio.Event] = []
        first: Snapshot | None = None
        scraper: asyncio.Task[None] | None = None
        done = asyncio.Event()
        for n, seg in enumerate(work.segments):
            stop = asyncio.Event()
            rngs = [random.Random(seed * 1009 + 97 * n + i) for i in range(seg.clients)]
            clients += [
                asyncio.create_task(_client(c, url, seg.text, r, stop, max_tokens, tally)) for r in rngs
            ]
            if stops:
                stops[-1].set()  # the last segment's clients finish what they sent, then stop
            stops.append(stop)
            if first is None:
                await asyncio.sleep(WARM)
                first = await _read(c, url)
                if est is not None:
                    est.last = None  # no interval across the time this server was idle
                    est.observe(first)
                scraper = asyncio.create_task(_scrape(c, url, est, done))
            await asyncio.sleep(seg.seconds)
        last = await _read(c, url)
        done.set()
        stops[-1].set()
        await asyncio.gather(*clients, *([scraper] if scraper else []))
    assert first is not None
    return (last.generated - first.generated) / (last.t - first.t), tally.errors
