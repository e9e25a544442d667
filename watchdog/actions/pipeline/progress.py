"""Whether the requests a drain waits for can still finish: a frozen engine finishes none of them.

Two signals say a request in flight progresses. The gateway in front sees each upstream body byte (a streamed
response's chunks), but a non-streamed response sends nothing until it ends. vLLM's own engine-step counter
(vllm:iteration_tokens_total_count, which the bundled hang rule reads too) moves on every step that makes a
token, streamed or not. The drain ends early only when every signal it has says nothing moved for
`stall_after` seconds; with no signal it waits as before, until all finished or its timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ...gateway.protocol.progress import UpstreamProgress
from .gatewayactions import Gateway

STALL_AFTER = 5.0  # the default of the restart and relaunch actions' `stall_after`
STEPS = "vllm:iteration_tokens_total_count"  # one count per engine step that made tokens
RUNNING = "vllm:num_requests_running"
# One series' samples: timestamps (ms) and values, oldest first.
Points = tuple[Sequence[int], Sequence[float]]


@dataclass(frozen=True)
class Progress:
    """What the drain knows of whether the requests in flight move: seconds vLLM's step counter stood still
    while it ran requests (None: unknown), and the gateway's word on its own requests (None: no gateway, or
    one that does not tell)."""

    engine_idle: float | None = None
    upstream: UpstreamProgress | None = None


def no_progress() -> Progress:
    """Neither signal: the drain waits until all finished or its timeout."""
    return Progress()


def stalled_for(progress: Progress, running: float) -> float | None:
    """Seconds in which no request in flight progressed as far as the signals tell; None if they cannot tell.

    `running` is what the drain counts in flight. The gateway alone can tell only when every request in flight
    is one of its own streams that has sent a chunk: a silent one, or one it does not see (vLLM runs more than
    the gateway sent), may be moving without a byte, which only the engine's steps show."""
    upstream = progress.upstream
    if upstream is not None and (upstream.in_flight == 0 or upstream.idle is None):
        upstream = None  # nothing of the gateway's in flight: it tells nothing about what vLLM runs
    engine = progress.engine_idle
    if upstream is None or upstream.idle is None:
        return engine
    if engine is not None:
        return min(engine, upstream.idle)
    unseen = upstream.silent + max(0.0, running - upstream.in_flight)
    return upstream.idle if unseen == 0 else None


def engine_idle(steps: Iterable[Points], running: Iterable[Points], now: float, fresh: float) -> float | None:
    """Seconds the step counter (each series of `steps`) stood still while vLLM ran requests (the sum of
    `running` above 0 at the same scrape), up to its newest sample; None without a sample newer than `fresh`
    seconds. With several series (one per engine), the least: any engine that steps is progress."""
    busy: dict[int, float] = {}
    for ts, vals in running:
        for t, v in zip(ts, vals, strict=True):
            if v == v:  # noqa: PLR0124 (a NaN, a staleness marker among them, is no sample)
                busy[t] = busy.get(t, 0.0) + v
    least: float | None = None
    for ts, vals in steps:
        points = [(t, v) for t, v in zip(ts, vals, strict=True) if v == v]  # noqa: PLR0124
        if not points or now * 1000.0 - points[-1][0] > fresh * 1000.0:
            continue
        newest, value = points[-1]
        since = newest
        for t, v in reversed(points):
            if v != value or busy.get(t, 0.0) <= 0:
                break
            since = t
        idle = (newest - since) / 1000.0
        least = idle if least is None else min(least, idle)
    return least


def progress_reader(gateway: Gateway | None, engine: Callable[[], float | None]) -> Callable[[], Progress]:
    """The drain's view of a target: its engine's idle seconds (from the sample store) and what the gateway in
    front said in its last set_drain answer (the drain asks it again on every poll)."""

    def read() -> Progress:
        return Progress(engine(), gateway.progress() if gateway is not None else None)

    return read
