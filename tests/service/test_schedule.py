"""The schedule on an injected clock: offsets, no drift, no overlapping runs, missed deadlines, replace, shutdown.

Time is the test's (tests/support/clock.py): the schedule sleeps on `clock.sleep` and `await clock.run(s)` lets
seconds pass, so minutes of schedule play in milliseconds and every count is exact.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.support.clock import T0, Clock
from vllm_watchdog.service.schedule import Schedule, _offset
from vllm_watchdog.service.selfmetrics import DaemonCounters

pytestmark = pytest.mark.anyio
Fn = Callable[[float], Awaitable[None]]


@pytest.fixture
async def clock() -> Clock:
    return Clock()


@pytest.fixture
async def schedule(clock: Clock) -> AsyncIterator[Schedule]:
    s = Schedule(DaemonCounters(), clock, clock.monotonic, sleep=clock.sleep)
    yield s
    await s.cancel_running(1.0)


def recorder(calls: list[float], clock: Clock, takes: float = 0.0) -> Fn:
    """A job that notes the wall time it was handed and then runs for `takes` seconds of the test's time."""

    async def fn(now: float) -> None:
        calls.append(now)
        if takes:
            await clock.sleep(takes)

    return fn


async def test_jobs_start_at_their_stable_offset_and_keep_their_interval_without_drift(
    clock: Clock, schedule: Schedule
) -> None:
    a: list[float] = []
    b: list[float] = []
    schedule.replace([("scrape:a", recorder(a, clock), 1.0), ("eval:g", recorder(b, clock), 2.5)])
    schedule.start()
    assert schedule.running
    await clock.run(60.0)
    first_a, first_b = T0 + _offset("scrape:a", 1.0), T0 + _offset("eval:g", 2.5)
    assert _offset("scrape:a", 1.0) != _offset("eval:g", 2.5)  # spread, not all at once
    assert a == pytest.approx([first_a + k for k in range(len(a))])
    assert b == pytest.approx([first_b + 2.5 * k for k in range(len(b))])
    assert len(a) in (59, 60) and len(b) in (23, 24)
    assert schedule.counters.missed_deadlines == {}


async def test_one_targets_scrape_and_probe_share_their_times_and_all_upkeep_shares_one_grid(
    clock: Clock, schedule: Schedule
) -> None:
    # Each phase is one wake-up of the process: targets stay spread, as in Prometheus, but a target's scrape
    # and /health probe run together, and the daemon's own upkeep at any whole-second interval runs together.
    runs: dict[str, list[float]] = {}
    target_jobs = [f"{kind}:{name}" for name in ("a", "b") for kind in ("scrape", "health")]
    upkeep = {"eval:f;fast": 1.0, "eval:f;slow": 2.0, "notify": 1.0, "api": 1.0, "self": 1.0, "gc": 15.0}
    jobs = {**dict.fromkeys(target_jobs, 1.0), **upkeep, "discovery:files": 30.0}
    schedule.replace([(job, recorder(runs.setdefault(job, []), clock), every) for job, every in jobs.items()])
    due = schedule.due_times()
    assert due["scrape:a"] == due["health:a"] != due["scrape:b"] == due["health:b"]
    assert len({due[job] for job in upkeep}) == 1
    assert due["discovery:files"] not in {due["scrape:a"], due["scrape:b"], due["notify"]}
    schedule.start()
    await clock.run(61.0)
    assert runs["scrape:a"] == runs["health:a"] != runs["scrape:b"] == runs["health:b"]
    assert (
        len(runs["notify"]) in (60, 61)
        and runs["notify"] == runs["api"] == runs["self"] == runs["eval:f;fast"]
    )
    for job in ("eval:f;slow", "gc"):  # every run of a longer upkeep interval lands on a one-second tick
        assert len(runs[job]) >= 4 and set(runs[job]) <= set(runs["notify"])
    assert schedule.counters.missed_deadlines == {}


async def test_a_slow_engine_state_probe_keeps_the_targets_phase_and_never_stretches_its_health_probe(
    clock: Clock, schedule: Schedule
) -> None:
    # /is_paused held for 5 s by a stopped engine core: its job skips runs, the /health probe beside it
    # keeps its 1 s interval (it once asked /is_paused itself, and was probed every 5 s instead).
    runs: dict[str, list[float]] = {"health:a": [], "state:a": []}
    schedule.replace(
        [
            ("health:a", recorder(runs["health:a"], clock), 1.0),
            ("state:a", recorder(runs["state:a"], clock, takes=5.0), 1.0),
        ]
    )
    assert schedule.due_times()["state:a"] == schedule.due_times()["health:a"]  # one wake-up per target
    schedule.start()
    await clock.run(20.0)
    assert len(runs["health:a"]) in (19, 20) and len(runs["state:a"]) == 4
    assert set(runs["state:a"]) <= set(runs["health:a"])
    assert set(schedule.counters.missed_deadlines) == {"state"}


async def test_a_run_that_outlasts_its_interval_never_overlaps_and_each_skip_counts(
    clock: Clock, schedule: Schedule, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vllm_watchdog.service.schedule")
    in_flight = 0
    most = 0
    takes = [2.5] * 40 + [0.1] * 100  # two minutes of runs that outlast 1 s (one every 3 s), then quick ones

    async def scrape(now: float) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await clock.sleep(takes.pop(0))
        in_flight -= 1

    schedule.replace([("scrape:dead", scrape, 1.0)])
    schedule.start()
    await clock.run(120.0 + _offset("scrape:dead", 1.0))
    assert most == 1
    assert schedule.counters.missed_deadlines == {"scrape": 40 * 2}  # each run of 2.5 s skips 2 due times
    await clock.run(10.0)
    assert schedule.counters.missed_deadlines == {"scrape": 40 * 2}
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["job skipped a run: its previous run outlasted its interval", "job back on schedule"]
    assert caplog.records[0].__dict__["job"] == "scrape:dead"


async def test_due_times_the_loop_slept_through_count_as_missed_and_run_once(
    clock: Clock, schedule: Schedule
) -> None:
    runs: list[float] = []
    schedule.replace([("scrape:x", recorder(runs, clock), 1.0)])
    schedule.start()
    await clock.run(10.0)
    assert len(runs) == 10
    due = schedule.due_times()["scrape:x"]
    clock.advance(due - clock.monotonic() + 2.5)  # the loop is held past 3 due times
    await clock.run(0.0)
    assert len(runs) == 11 and runs[-1] == pytest.approx(runs[-2] + 3.5)  # one run, at once, for the newest
    assert schedule.counters.missed_deadlines == {"scrape": 2}
    await clock.run(10.0)
    assert len(runs) == 21 and runs[-1] - runs[-2] == pytest.approx(1.0)
    assert schedule.counters.missed_deadlines == {"scrape": 2}


async def test_a_run_later_than_its_grace_is_skipped(clock: Clock, schedule: Schedule) -> None:
    runs: list[float] = []
    # The 1.4 s job's grace is 1 s (its interval, rounded): held 1.2 s past a due time, it skips that run.
    schedule.replace([("probe:x", recorder(runs, clock), 1.4)])
    schedule.start()
    await clock.run(5.0)
    ran = len(runs)
    due = schedule.due_times()["probe:x"]
    clock.advance(due - clock.monotonic() + 1.2)
    await clock.run(0.0)
    assert len(runs) == ran and schedule.counters.missed_deadlines == {"probe": 1}
    due = schedule.due_times()["probe:x"]
    clock.advance(due - clock.monotonic() + 0.9)  # held 0.9 s past the next one: within its grace, it runs
    await clock.run(0.0)
    assert len(runs) == ran + 1 and schedule.counters.missed_deadlines == {"probe": 1}


async def test_a_failing_job_is_logged_and_keeps_its_schedule(
    clock: Clock, schedule: Schedule, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[float] = []

    async def broken(now: float) -> None:
        calls.append(now)
        raise RuntimeError("bug")

    schedule.replace([("notify", broken, 1.0)])
    schedule.start()
    before = schedule.last_progress
    await clock.run(5.0)
    assert len(calls) == 5
    assert schedule.last_progress > before  # a failed run is progress: the schedule itself is alive
    failed = [r for r in caplog.records if r.getMessage() == "job failed"]
    assert len(failed) == 5 and failed[0].exc_info is not None


async def test_replace_lets_a_run_in_flight_finish_and_its_successor_waits_for_it(
    clock: Clock, schedule: Schedule
) -> None:
    old: list[float] = []
    other: list[float] = []
    new: list[float] = []
    in_flight = 0
    most = 0

    async def long_scrape(now: float) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        old.append(now)
        await clock.sleep(4.0)
        in_flight -= 1

    async def new_scrape(now: float) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        new.append(now)
        in_flight -= 1

    schedule.replace([("scrape:a", long_scrape, 1.0), ("canary:a", recorder(other, clock), 1.0)])
    schedule.start()
    await clock.run(_offset("scrape:a", 1.0) + 0.5)
    assert len(old) == 1 and in_flight == 1
    old_ends = clock.monotonic() - 0.5 + 4.0
    schedule.replace([("scrape:a", new_scrape, 1.0)])
    first = schedule.due_times()["scrape:a"]
    skipped = math.ceil(old_ends - first)  # the new job's due times before the old run ends
    assert skipped >= 3
    await clock.run(10.0)
    assert most == 1 and len(old) == 1  # the old run finished, the old job ran no more
    assert schedule.counters.missed_deadlines == {"scrape": skipped}
    assert new[0] == pytest.approx(first + skipped - clock.monotonic() + clock())
    canary_runs = len(other)
    await clock.run(5.0)
    assert len(other) == canary_runs  # dropped by the replace


async def test_shutdown_runs_no_more_and_cancel_running_ends_runs_in_flight(
    clock: Clock, schedule: Schedule, caplog: pytest.LogCaptureFixture
) -> None:
    quick: list[float] = []
    hung: list[float] = []
    cancelled = asyncio.Event()

    async def hangs(now: float) -> None:
        hung.append(now)
        try:
            await clock.sleep(3600.0)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    schedule.replace([("scrape:hung", hangs, 1.0), ("gc", recorder(quick, clock), 1.0)])
    schedule.start()
    await clock.run(2.0)
    runs = len(quick)
    assert runs >= 1 and len(hung) == 1
    schedule.shutdown()
    assert not schedule.running
    await clock.run(5.0)
    assert len(quick) == runs and not cancelled.is_set()  # no new runs; the one in flight goes on
    await schedule.cancel_running(5.0)
    assert cancelled.is_set()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # expected: no traceback
    assert schedule.counters.missed_deadlines == {}


async def test_jobs_wait_on_the_monotonic_clock_and_are_handed_the_wall_time(
    clock: Clock, schedule: Schedule
) -> None:
    runs: list[float] = []
    schedule.replace([("self", recorder(runs, clock), 1.0)])
    schedule.start()
    await clock.run(3.0)
    assert len(runs) == 3
    clock.jump(-7200.0)  # the wall clock goes back 2 h: the schedule goes on
    await clock.run(3.0)
    assert len(runs) == 6
    assert runs[3] == pytest.approx(runs[2] + 1.0 - 7200.0)
    assert schedule.counters.missed_deadlines == {}


async def test_a_cancelled_error_from_a_job_is_its_bug_but_a_cancel_of_its_task_ends_it(
    clock: Clock, schedule: Schedule, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[float] = []

    async def escapes(now: float) -> None:
        runs.append(now)
        raise asyncio.CancelledError  # e.g. it awaited a future someone else cancelled

    async def hangs(now: float) -> None:
        await clock.sleep(3600.0)

    schedule.replace([("notify", escapes, 1.0), ("scrape:hung", hangs, 1.0)])
    schedule.start()
    await clock.run(3.0)
    assert len(runs) == 3
    assert [r.getMessage() for r in caplog.records].count("job failed") == 3
    # The loop closing cancels every task (asyncio.run does at exit): the job's task ends, mid-run or not.
    tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("job:")]
    assert len(tasks) == 2
    for task in tasks:
        task.cancel()
    done, pending = await asyncio.wait(tasks, timeout=5.0)
    assert not pending and all(t.cancelled() for t in done)
