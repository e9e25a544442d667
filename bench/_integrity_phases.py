"""Parts of bench/integrity.py: the checker's clock, the engine's CPU, and what each phase measures."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.mixed_traffic import MixedTraffic
from tests.support.perturbed import model_dir, perturbed_model, reload_weights
from tests.support.vllm_server import VllmServer
from vllm_watchdog.config.targets import TargetConfig
from vllm_watchdog.integrity.checker import KnownAnswers
from vllm_watchdog.integrity.verdict import Verdict

LEARN_LIMIT = 30  # checks: learning takes learn_probes agreeing probes (3 by default)
TRAFFIC_SETTLE = 3.0  # seconds of traffic before the first check under load


def engine_cpu(pgid: int) -> float:
    """CPU seconds (user + system) used so far by every live process of the process group `pgid` (vLLM's
    API server, its EngineCore and workers)."""
    total, tick = 0, os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / tick


@dataclass
class Bench:
    """One engine and one checker: check() steps the checker's clock by the interval (the periodic check's
    schedule without its wait), clock() is what the real-time phases give it."""

    answers: KnownAnswers
    target: TargetConfig
    server: VllmServer
    models: Path  # where the perturbed copies are made
    interval: float
    _offset: float = field(default_factory=time.time)
    _start: float = field(default_factory=time.monotonic)

    def clock(self) -> float:
        """The checker's now: wall time plus every interval that check() skipped."""
        return self._offset + time.monotonic() - self._start

    async def check(self) -> Verdict:
        """One periodic check, as if an interval had passed since the last."""
        self._offset += self.interval
        return await self.answers.check(self.target, self.clock())

    async def verify(self) -> Verdict:
        """An on-demand verify (confirmed, never learns)."""
        return await self.answers.verify(self.target, self.clock())

    def state(self) -> str:
        """The target's baseline state: learning, learnt or pinned."""
        return self.answers.status(self.target.name).state

    def tokens(self) -> int:
        """Probe tokens spent so far on the target."""
        return self.answers.status(self.target.name).tokens_total

    def perturb(self, scale: float) -> tuple[Path, float]:
        """Load the copy scaled by `scale` into the engine; returns it and the fraction of it changed."""
        path = perturbed_model(scale, root=self.models)
        reload_weights(self.server.url, path)
        return path, float(json.loads((path / "perturbation.json").read_text())["changed_fraction"])

    def restore(self) -> None:
        """Load the original weights again."""
        reload_weights(self.server.url, model_dir())


async def learn(b: Bench) -> tuple[int, Verdict | None]:
    """Check until the baseline is learnt; returns the checks it took and the last verdict."""
    last = None
    for n in range(1, LEARN_LIMIT + 1):
        last = await b.check()
        if b.state() != "learning":
            return n, last
    raise RuntimeError(f"no baseline after {LEARN_LIMIT} checks; last: {last}")


@dataclass
class Series:
    """Verdicts of repeated checks."""

    verdicts: list[Verdict] = field(default_factory=list)

    def add(self, v: Verdict) -> None:
        """Record one verdict."""
        self.verdicts.append(v)

    @property
    def diverged(self) -> int:
        """Checks that said wrong (a false positive, on an unperturbed engine)."""
        return sum(v.ok is False for v in self.verdicts)

    @property
    def unknown(self) -> int:
        """Checks that could not tell."""
        return sum(v.ok is None for v in self.verdicts)

    @property
    def max_divergence(self) -> float:
        """The largest divergence measured (nats), nan when none was."""
        known = [v.divergence for v in self.verdicts if not math.isnan(v.divergence)]
        return max(known, default=math.nan)


async def repeated(b: Bench, n: int, traffic: MixedTraffic | None) -> Series:
    """`n` checks in a row, with `traffic` running beside them (started and stopped here) or quiet."""
    out = Series()
    if traffic is not None:
        traffic.start()
        await asyncio.sleep(TRAFFIC_SETTLE)
    try:
        for _ in range(n):
            out.add(await b.check())
    finally:
        if traffic is not None:
            await asyncio.to_thread(traffic.stop)
    return out


@dataclass(frozen=True)
class SweepRow:
    """One perturbation size: what the verify after loading it said, and after restoring the original."""

    scale: float
    changed: float  # fraction of the tensor's elements that the scale changed (bf16 rounds small ones back)
    verdict: Verdict
    seconds: float  # the verify's wall time
    restored: Verdict


async def sweep(b: Bench, scales: list[float]) -> list[SweepRow]:
    """Each scale: load it, verify, restore the original weights, verify again."""
    rows = []
    for scale in scales:
        _, changed = await asyncio.to_thread(b.perturb, scale)
        started = time.monotonic()
        verdict = await b.verify()
        seconds = time.monotonic() - started
        await asyncio.to_thread(b.restore)
        rows.append(SweepRow(scale, changed, verdict, seconds, await b.verify()))
    return rows


Seen = list[tuple[float, float, Verdict]]  # (started, finished, verdict) of each periodic check


async def periodic(b: Bench, stop: asyncio.Event, seen: Seen) -> None:
    """The periodic check in real time: one check every interval, each verdict recorded with its times."""
    while not stop.is_set():
        started = time.monotonic()
        verdict = await b.answers.check(b.target, b.clock())
        seen.append((started, time.monotonic(), verdict))
        remaining = b.interval - (time.monotonic() - started)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(remaining, 0.0))


async def detection(b: Bench, scale: float, bound: float, rng: random.Random) -> tuple[float | None, float]:
    """From loading the copy scaled by `scale` (at a random phase of the interval) to the first diverged
    verdict of the periodic check; returns it (None: not within `bound`) and how long that check took
    (with its confirming probe)."""
    stop, seen = asyncio.Event(), []  # type: ignore[var-annotated]
    task = asyncio.create_task(periodic(b, stop, seen))
    try:
        await asyncio.sleep(rng.uniform(0.5, b.interval))
        await asyncio.to_thread(b.perturb, scale)
        loaded = time.monotonic()
        deadline = loaded + bound
        while time.monotonic() < deadline:
            caught = [(t1, t1 - t0) for t0, t1, v in seen if t1 > loaded and v.ok is False]
            if caught:
                return caught[0][0] - loaded, caught[0][1]
            await asyncio.sleep(0.1)
        return None, 0.0
    finally:
        stop.set()
        await task
        await asyncio.to_thread(b.restore)


@dataclass(frozen=True)
class Cost:
    """What one quiet check costs."""

    tokens: float  # prompt + completion tokens per check
    cpu: float  # the engine's CPU seconds per check, its idle use subtracted
    wall: float  # seconds per check
    idle: float  # the engine's CPU seconds per second when nobody asks it anything


async def cost(b: Bench, n: int) -> Cost:
    """`n` quiet checks, measured: tokens from the checker's count, CPU from the engine's /proc."""
    pgid = b.server.proc.pid if b.server.proc else 0
    cpu0, t0 = engine_cpu(pgid), time.monotonic()
    await asyncio.sleep(5.0)
    idle = (engine_cpu(pgid) - cpu0) / (time.monotonic() - t0)
    tokens0, cpu0, t0 = b.tokens(), engine_cpu(pgid), time.monotonic()
    for _ in range(n):
        await b.check()
    wall = time.monotonic() - t0
    used = engine_cpu(pgid) - cpu0 - idle * wall
    return Cost((b.tokens() - tokens0) / n, max(used, 0.0) / n, wall / n, idle)


async def soak(b: Bench, seconds: float, traffic: MixedTraffic) -> Series:
    """The periodic check in real time for `seconds` with `traffic` beside it."""
    stop, seen = asyncio.Event(), []  # type: ignore[var-annotated]
    traffic.start()
    await asyncio.sleep(TRAFFIC_SETTLE)
    task = asyncio.create_task(periodic(b, stop, seen))
    try:
        await asyncio.sleep(seconds)
    finally:
        stop.set()
        await task
        await asyncio.to_thread(traffic.stop)
    out = Series()
    for _, _, v in seen:
        out.add(v)
    return out


def traffic_summary(counts: Counter[str]) -> str:
    """Requests by kind, and how many failed."""
    kinds = Counter(k.split(":")[0] for k in counts.elements())
    failed = sum(n for k, n in counts.items() if not k.endswith(":200"))
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + f"; {failed} failed"
