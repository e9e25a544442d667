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
class EngineSteps:
    """What the sample store says of a target's engine, each up to its newest sample (None: unknown): seconds
    its step counter stood still, and seconds vLLM reported requests running without a break."""

    still: float | None = None
    busy: float | None = None


def unknown_engine(target: str) -> EngineSteps:
    """No sample store to ask: the engine's steps are unknown."""
    return EngineSteps()


@dataclass(frozen=True)
class Progress:
    """What the drain knows of whether the requests in flight move: the engine's steps, and the gateway's word
    on its own requests (None: no gateway, or one that does not tell)."""

    engine: EngineSteps = EngineSteps()
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
    engine = engine_stalled_for(progress.engine, upstream)
    if upstream is None or upstream.idle is None:
        return engine
    if engine is not None:
        return min(engine, upstream.idle)
    unseen = upstream.silent + max(0.0, running - upstream.in_flight)
    return upstream.idle if unseen == 0 else None


def engine_stalled_for(engine: EngineSteps, upstream: UpstreamProgress | None) -> float | None:
    """Seconds the step counter stood still while the engine had work: vLLM reported requests running, or the
    gateway's oldest request in flight was with it (a frozen engine's own gauge stops with it, at the count it
    had); an engine idle until a request came a moment ago is not frozen. None if the counter is unknown."""
    if engine.still is None:
        return None
    oldest = upstream.oldest if upstream is not None and upstream.oldest is not None else 0.0
    return min(engine.still, max(engine.busy or 0.0, oldest))


def engine_steps(steps: Iterable[Points], running: Iterable[Points], now: float, fresh: float) -> EngineSteps:
    """EngineSteps from the samples of the step counter (a series per engine: the least time still of any, as
    one that steps is progress) and of the running gauge (summed per scrape); a series whose newest sample is
    older than `fresh` seconds tells nothing of now."""
    still: float | None = None
    for ts, vals in steps:
        points = _fresh(ts, vals, now, fresh)
        if points:
            seconds = _trailing(points, points[-1][1].__eq__)
            still = seconds if still is None else min(still, seconds)
    busy: dict[int, float] = {}
    for ts, vals in running:
        for t, v in _fresh(ts, vals, now, fresh):
            busy[t] = busy.get(t, 0.0) + v
    total = sorted(busy.items())
    return EngineSteps(still, _trailing(total, lambda v: v > 0) if total else None)


def _fresh(ts: Sequence[int], vals: Sequence[float], now: float, fresh: float) -> list[tuple[int, float]]:
    """The samples that are numbers (not NaN, staleness markers among them); none if the newest is stale."""
    points = [(t, v) for t, v in zip(ts, vals, strict=True) if v == v]  # noqa: PLR0124 (the NaN test)
    return points if points and now * 1000.0 - points[-1][0] <= fresh * 1000.0 else []


def _trailing(points: Sequence[tuple[int, float]], holds: Callable[[float], bool]) -> float:
    """Seconds from the earliest sample of the unbroken run of samples that hold to the newest (0 if the
    newest does not hold)."""
    newest = since = points[-1][0]
    for t, v in reversed(points):
        if not holds(v):
            break
        since = t
    return (newest - since) / 1000.0


def progress_reader(gateway: Gateway | None, engine: Callable[[], EngineSteps]) -> Callable[[], Progress]:
    """The drain's view of a target: its engine's steps (from the sample store) and what the gateway in front
    said in its last set_drain answer (the drain asks it again on every poll)."""

    def read() -> Progress:
        return Progress(engine(), gateway.progress() if gateway is not None else None)

    return read
