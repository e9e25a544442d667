"""The order in which xdist hands a run's test groups to its workers: the longest first.

A run ends when its last group ends. xdist's own `loadgroup` hands groups out by their number of tests
(a fuzz module of 500 one-millisecond cases first, a two-test module that restarts a real vLLM for six
minutes last, while the other workers idle), and gives a worker its next group while two of its tests are
still to run, so a long test can queue a group behind it that an idle worker could have run. Here the
groups go out by the seconds they took in a measured run (`tests/durations.json`, longest first, the
classic longest-processing-time rule), and a worker gets its next group only when it is down to the one
test it holds back until it knows what follows (pytest runs a test with the next one in hand, to know
which fixtures to tear down). The long groups start real vLLMs, each start about 45 CPU-seconds: at most
three run at once (and one worker stays for the short groups), so that their starts do not all fall in
the same minutes on two cores; six at once took 283 s each to answer.

The measured seconds only order the groups: a stale or missing entry makes a run slower, never wrong.
`scripts/test-durations.py` writes the file again from a run's `--durations=0` output.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest
from xdist.scheduler import LoadGroupScheduling
from xdist.workermanage import WorkerController

DURATIONS = Path(__file__).resolve().parent.parent / "durations.json"


@lru_cache(maxsize=1)
def measured() -> dict[str, float]:
    """Seconds per group and per test id (setup, call and teardown) in the run the file was written from; a
    test of a `spread` module is a group of its own, named by its id."""
    try:
        doc = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for part in ("tests", "groups") for k, v in doc.get(part, {}).items()}


def expected_seconds(group: str, tests: int, starts_servers: bool) -> float:
    """The group's measured seconds; a group the file does not know is guessed from what it does."""
    known = measured().get(group)
    if known is not None:
        return known
    return 60.0 if starts_servers else 0.05 * tests


LONG = 120.0  # seconds: a group this long starts real servers (every one in durations.json does)
LONG_AT_ONCE = 3


def _long(group: str) -> bool:
    """A group of two minutes or more in the measured run."""
    return measured().get(group, 0.0) >= LONG


class LongestFirst(LoadGroupScheduling):
    """`--dist loadgroup` that keeps the collection's order (longest group first), hands a worker its next
    group only when it has one test left, and runs at most LONG_AT_ONCE long groups at once."""

    def __init__(self, config: pytest.Config, log: object | None = None) -> None:
        config.option.loadscopereorder = False  # the collection is already in the order wanted
        super().__init__(config, log)

    def _reschedule(self, node: WorkerController) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        # One pending test is the one the worker holds until it hears of the next; more is work in hand.
        if self._pending_of(self.assigned_work.get(node, {})) > 1:
            return
        self._assign_work_unit(node)

    def _assign_work_unit(self, node: WorkerController) -> None:
        """The first queued group that may start now: a long one only while fewer than the cap run."""
        cap = max(1, min(self.numnodes - 1, LONG_AT_ONCE))
        running = sum(
            1
            for work in self.assigned_work.values()
            for scope, tests in work.items()
            if _long(scope) and not all(tests.values())
        )
        for scope in self.workqueue:
            if not _long(scope) or running < cap:
                self.workqueue.move_to_end(scope, last=False)
                super()._assign_work_unit(node)
                return
        # Only long groups are left and the cap runs: this worker waits for one to end (see below).

    def mark_test_complete(self, node: WorkerController, item_index: int, duration: float = 0) -> None:
        """Every worker may get work when a test ends: one that waited behind the cap, too."""
        super().mark_test_complete(node, item_index, duration)
        for other in self.nodes:
            if other is not node:
                self._reschedule(other)
