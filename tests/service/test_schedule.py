"""The schedule's log: a job that keeps skipping runs (a scrape of a hung target) is one line, not one a tick."""

from __future__ import annotations

import logging

import pytest
from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobEvent

from tests.support.clock import Clock
from vllm_watchdog.service.schedule import Schedule
from vllm_watchdog.service.selfmetrics import DaemonCounters


def test_skipped_runs_log_once_and_count_each(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="vllm_watchdog.service.schedule")
    clock = Clock()
    counters = DaemonCounters()
    schedule = Schedule(counters, clock, clock)
    for _ in range(120):  # two minutes of 1 s scrapes that each outlast their interval
        schedule._on_missed(JobEvent(EVENT_JOB_MAX_INSTANCES, "scrape:dead", "default"))
        clock.advance(1.0)
    assert [r.getMessage() for r in caplog.records] == [
        "job skipped a run: its previous run outlasted its interval"
    ]
    assert caplog.records[0].__dict__["job"] == "scrape:dead"
    assert counters.missed_deadlines == {"scrape": 120}
