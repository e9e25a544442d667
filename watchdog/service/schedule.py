"""The daemon's periodic jobs on one APScheduler: stable start offsets, missed deadlines, runs in flight."""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timezone
from typing import Any

from apscheduler.events import (
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
    JobEvent,
    JobSubmissionEvent,
)
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from ..logs import Recurring
from .selfmetrics import DaemonCounters

log = logging.getLogger(__name__)
Job = tuple[str, Callable[[float], Awaitable[Any]], float]  # id, fn(now), interval in seconds


def _offset(name: str, interval: float) -> float:
    """A stable per-job start offset that spreads targets across the interval, as Prometheus does."""
    return (zlib.crc32(name.encode()) % 1000) / 1000 * interval


def _job_kind(job_id: object) -> str:
    """`scrape:vllm-0` -> `scrape`: the label of the missed-deadline counter."""
    return str(job_id).split(":")[0]


def _datetime(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)


class Schedule:
    """Runs the daemon's jobs at their intervals; a missed or coalesced run counts as a missed deadline, and
    every finished run (failed or not) as progress."""

    def __init__(
        self, counters: DaemonCounters, clock: Callable[[], float], monotonic: Callable[[], float]
    ) -> None:
        self.counters = counters
        self.clock, self.monotonic = clock, monotonic
        self.scheduler = AsyncIOScheduler()  # start() binds it to the running loop
        self.scheduler.add_listener(self._on_missed, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
        self.scheduler.add_listener(self._on_submitted, EVENT_JOB_SUBMITTED)
        self.last_progress = monotonic()
        self._running: set[asyncio.Task[Any]] = set()
        self._intervals: dict[str, float] = {}
        # A job whose run outlasts its interval (a scrape of a hung target) skips a run at every tick: one
        # line when that starts and one when it stops (APScheduler's own line per skip is silenced).
        self.late = Recurring(log, clock=monotonic)
        self._stopping = False

    @property
    def running(self) -> bool:
        """The scheduler was started and not shut down."""
        return bool(self.scheduler.running)

    def replace(self, jobs: Iterable[Job]) -> None:
        """Drop every job and add these, each first due at its stable offset from now."""
        self.scheduler.remove_all_jobs()
        now = self.clock()
        self._intervals = {}
        for job_id, fn, interval in jobs:
            self._intervals[job_id] = interval
            self.scheduler.add_job(
                self._run(job_id, fn),
                "interval",
                seconds=interval,
                id=job_id,
                max_instances=1,
                coalesce=True,
                misfire_grace_time=max(round(interval), 1),
                # No APScheduler jitter: 3.x adds it to the previous, already jittered fire time, so periods
                # drift long and ~2.5% of 1 s scrapes silently vanish. A stable per-job offset spreads jobs
                # instead, as Prometheus spreads its targets.
                next_run_time=_datetime(now + _offset(job_id, interval)),
            )

    def _run(self, job_id: str, fn: Callable[[float], Awaitable[Any]]) -> Callable[[], Any]:
        async def run() -> None:
            task = asyncio.current_task()
            if task is not None:
                self._running.add(task)
            start = self.monotonic()
            try:
                await fn(self.clock())
            except asyncio.CancelledError:
                if self._stopping:  # cancel_running at shutdown: expected, not a traceback in the log
                    return
                raise
            except Exception:  # a bug in one job must not stop the schedule
                log.exception("job failed")
            finally:
                if task is not None:
                    self._running.discard(task)
            self.last_progress = self.monotonic()
            if self.last_progress - start < self._intervals.get(job_id, 0.0):
                self.late.recovered(job_id, "job back on schedule", {"job": job_id})

        return run

    def start(self) -> None:
        """Start running jobs on the running loop."""
        self.scheduler.start()

    def shutdown(self) -> None:
        """Run no more jobs; those in flight go on (see cancel_running)."""
        self._stopping = True
        self.scheduler.shutdown(wait=False)

    async def cancel_running(self, grace: float) -> None:
        """Cancel the jobs in flight (scrapes, probes), and only those; wait at most `grace` seconds."""
        self._stopping = True
        tasks = [t for t in self._running if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)

    def _on_missed(self, event: JobEvent) -> None:
        self.counters.missed(_job_kind(event.job_id))
        message = "job skipped a run: its previous run outlasted its interval"
        self.late.failed(event.job_id, "late", message, {"job": event.job_id})

    def _on_submitted(self, event: JobSubmissionEvent) -> None:
        # A coalesced run stands for several due times; each extra one is a missed deadline.
        for _ in event.scheduled_run_times[1:]:
            self.counters.missed(_job_kind(event.job_id))
