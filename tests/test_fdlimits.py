"""The descriptor reserve's decision with an injected limit, count and clock; the soft limit raised to the
hard one (in a child process, so that this one keeps its own). End to end: tests/api/test_hostile_api.py."""

from __future__ import annotations

import subprocess
import sys

from tests.support.clock import Clock
from vllm_watchdog.fdlimits import FdReserve


def test_a_descriptor_in_the_reserve_is_refused_without_counting() -> None:
    def never() -> int:
        raise AssertionError("counted")

    guard = FdReserve(64, limit=lambda: 1024, count=never)
    assert guard.exhausted(960) and guard.exhausted(1023)
    assert not guard.exhausted(10)  # low numbers: far from the limit whatever holes there are


def test_between_a_quarter_and_the_floor_the_open_descriptors_decide_counted_at_most_every_recount() -> None:
    counts, clock = [970], Clock(0.0)
    guard = FdReserve(64, limit=lambda: 1024, count=lambda: counts[0], monotonic=clock, recount=1.0)
    assert guard.exhausted(500)  # 970 open: fewer than 64 free
    counts[0] = 100
    assert guard.exhausted(500)  # the count is reused within `recount`
    clock.advance(1.0)
    assert not guard.exhausted(500)
    assert not FdReserve(64, limit=lambda: None).exhausted(10**6)  # unlimited


def test_the_soft_limit_is_raised_to_the_hard_limit() -> None:
    script = """
import resource
from vllm_watchdog.fdlimits import raise_open_files_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
got = raise_open_files_limit()
print(got.was, got.soft == resource.getrlimit(resource.RLIMIT_NOFILE)[0], got.soft >= min(hard, 1 << 20))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["256", "True", "True"], out
