"""The daemon's periodic jobs on the event loop: stable start offsets, missed deadlines, runs in flight.

Each job is one task that sleeps until its next due time and runs its function there, so a job never
overlaps itself and a run costs one timer, not a scheduler pass over every job (APScheduler 3.x, which this
replaces, spent about 2.5x as much CPU per run). Due times are on the monotonic clock: they start at a stable
offset from the time the jobs were placed, as Prometheus spreads its targets over the interval (one target's
scrape and probes share theirs, and so does all upkeep: one wake-up each), and follow each other at the
job's interval without drift. A due time that passes while the job's previous run
is still in flight is skipped and counted as a missed deadline; so is each due time the loop slept through
(one run stands for the newest), and a run that would start more than its grace after its due time.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from ..logs import Recurring
from .selfmetrics import DaemonCounters

log = logging.getLogger(__name__)
Job = tuple[str, Callable[[float], Awaitable[Any]], float]  # id, fn(now), interval in seconds
Sleep = Callable[[float], Awaitable[Any]]


# The jobs that talk to one target: spread over the interval by the target's name, and run together. Each
# is a job of its own, so that one slow endpoint (an /is_paused held by a stopped engine core) delays only
# its own runs: the /health probe next to it keeps its interval.
_TARGET_KINDS = frozenset({"scrape", "health", "state", "canary", "integrity"})
# Discovery reads files and asks APIs, at intervals of its own: spread by its own id.
_SPREAD_KINDS = frozenset({"discovery"})
_UPKEEP = "upkeep"


def _phase(job_id: str) -> str:
    """What a job's start offset is keyed by: `target:NAME` for the scrape and probes of one target, the
    job's own id for discovery, and one shared key for the daemon's own upkeep (rule groups' stand-ins,
    notifications, actions, own metrics, gc, systemd)."""
    kind, _, name = job_id.partition(":")
    if kind in _TARGET_KINDS and name:
        return f"target:{name}"
    return job_id if kind in _SPREAD_KINDS else _UPKEEP


def _offset(job_id: str, interval: float) -> float:
    """A stable start offset: a fraction of the interval by the job's phase key, so targets are spread across
    the interval, as Prometheus does, while jobs of one key and one interval (a target's scrape and /health
    probe) fall due at the same instant and cost the process one wake-up between them. Upkeep's fraction is of
    one second, not of its interval, so upkeep of any whole-second interval meets on one grid. On a VM a
    wake-up of this process costs 0.1-0.25 ms of CPU, a third of a scrape's parse: seven upkeep jobs a second
    on phases of their own cost about 6% of the daemon's CPU at 8 targets."""
    key = _phase(job_id)
    fraction = (zlib.crc32(key.encode()) % 1000) / 1000
    return fraction * (min(interval, 1.0) if key == _UPKEEP else interval)


def _job_kind(job_id: str) -> str:
    """`scrape:vllm-0` -> `scrape`: the label of the missed-deadline counter."""
    return job_id.split(":", maxsplit=1)[0]


class _Entry:
    """One placed job: what it runs, when it is next due (monotonic seconds) and its task."""

    __slots__ = ("due", "fn", "grace", "id", "in_run", "interval", "kind", "retired", "task")

    def __init__(
        self, job_id: str, fn: Callable[[float], Awaitable[Any]], interval: float, due: float
    ) -> None:
        self.id, self.fn, self.interval, self.due = job_id, fn, interval, due
        self.kind = _job_kind(job_id)
        self.grace = max(round(interval), 1)  # a run starting later than this after its due time is skipped
        self.in_run = False
        self.retired = False
        self.task: asyncio.Task[None] | None = None


class Schedule:
    """Runs the daemon's jobs at their intervals; a skipped or late run counts as a missed deadline, and
    every finished run (failed or not) as progress."""

    def __init__(
        self,
        counters: DaemonCounters,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.counters = counters
        self.clock, self.monotonic, self.sleep = clock, monotonic, sleep
        self.last_progress = monotonic()
        self._jobs: dict[str, _Entry] = {}
        # job id -> the entry whose run is in flight (one that was replaced, too)
        self._in_run: dict[str, _Entry] = {}
        # A job whose run outlasts its interval (a scrape of a hung target) skips a run at every due time: one
        # line when that starts and one when it stops.
        self.late = Recurring(log, clock=monotonic)
        self._started = False
        self._stopping = False

    @property
    def running(self) -> bool:
        """The schedule was started and not shut down."""
        return self._started and not self._stopping

    def due_times(self) -> dict[str, float]:
        """Each job's next due time, on the monotonic clock."""
        return {job_id: e.due for job_id, e in self._jobs.items()}

    def replace(self, jobs: Iterable[Job]) -> None:
        """Drop every job and add these, each first due at its stable offset from now. A run in flight
        finishes; the job that replaces it skips its due times until then, so a job never overlaps itself."""
        for entry in self._jobs.values():
            self._retire(entry)
        now = self.monotonic()
        self._jobs = {
            job_id: _Entry(job_id, fn, every, now + _offset(job_id, every)) for job_id, fn, every in jobs
        }
        if self.running:
            for entry in self._jobs.values():
                self._spawn(entry)

    def start(self) -> None:
        """Start running jobs on the running loop."""
        if self._started:
            return
        self._started = True
        for entry in self._jobs.values():
            self._spawn(entry)

    def shutdown(self) -> None:
        """Run no more jobs; those in flight go on (see cancel_running)."""
        self._stopping = True
        for entry in self._jobs.values():
            self._retire(entry)

    async def cancel_running(self, grace: float) -> None:
        """Cancel the jobs in flight (scrapes, probes), and only those; wait at most `grace` seconds."""
        self.shutdown()
        tasks = [e.task for e in self._in_run.values() if e.task is not None and not e.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)

    def _spawn(self, entry: _Entry) -> None:
        entry.task = asyncio.get_running_loop().create_task(self._loop(entry), name=f"job:{entry.id}")

    def _retire(self, entry: _Entry) -> None:
        """No more runs of this entry: a sleeping one ends now, one in a run ends after it."""
        entry.retired = True
        if entry.task is not None and not entry.in_run:
            entry.task.cancel()

    async def _loop(self, entry: _Entry) -> None:
        while not entry.retired:
            await self.sleep(max(entry.due - self.monotonic(), 0.0))  # always yields, even when late
            if entry.retired:
                return
            now = self.monotonic()
            due = entry.due
            slept_through = int((now - due) // entry.interval) if now > due else 0
            due += slept_through * entry.interval  # the newest due time that has passed (or the one ahead)
            entry.due = due + entry.interval
            for _ in range(slept_through):
                self.counters.missed(entry.kind)
            if now - due > entry.grace:
                self.counters.missed(entry.kind)
            elif entry.id in self._in_run:  # the run of the job this one replaced is still in flight
                self._skipped(entry)
            else:
                await self._run(entry)

    async def _run(self, entry: _Entry) -> None:
        entry.in_run = True
        self._in_run[entry.id] = entry
        try:
            await entry.fn(self.clock())
        except asyncio.CancelledError:
            if self._stopping or entry.retired:  # cancel_running at shutdown: expected, not a traceback
                return
            cancelling = getattr(asyncio.current_task(), "cancelling", None)
            if cancelling is None:  # Python 3.10 cannot tell the two apart: the task ends, and says so
                log.exception("job failed", extra={"job": entry.id})
                raise
            if cancelling():  # cancelled from outside (the loop is closing): end
                raise
            log.exception("job failed", extra={"job": entry.id})  # a CancelledError that escaped `fn`
        except Exception:  # a bug in one job must not stop the schedule
            log.exception("job failed", extra={"job": entry.id})
        finally:
            entry.in_run = False
            if self._in_run.get(entry.id) is entry:
                del self._in_run[entry.id]
        end = self.last_progress = self.monotonic()
        if entry.retired:  # replaced or shut down while it ran: its due times are no longer its own
            return
        if end >= entry.due:  # due times passed while it ran: each one is a skipped run
            passed = int((end - entry.due) // entry.interval) + 1
            entry.due += passed * entry.interval
            for _ in range(passed):
                self._skipped(entry)
        elif entry.id in self.late.episodes:
            self.late.recovered(entry.id, "job back on schedule", {"job": entry.id})

    def _skipped(self, entry: _Entry) -> None:
        """A due time of this job passed while its previous run was in flight."""
        self.counters.missed(entry.kind)
        message = "job skipped a run: its previous run outlasted its interval"
        self.late.failed(entry.id, "late", message, {"job": entry.id})
