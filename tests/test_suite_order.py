"""The suite's own scheduling: groups go to xdist workers longest first, and a `spread` module's tests apart."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import longest_first, runshare


class FakeItem:
    """What assign_groups reads of a pytest item."""

    def __init__(self, nodeid: str, fixtures: tuple[str, ...] = (), spread: bool = False) -> None:
        self.nodeid = nodeid
        self.fixturenames = fixtures
        self.spread = spread
        self.groups: list[str] = []

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "spread" and self.spread else None

    def add_marker(self, marker: Any) -> None:
        self.groups.append(marker.args[0])


def test_groups_go_longest_first_and_keep_their_tests_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        longest_first,
        "measured",
        lambda: {"tests/a.py": 5.0, "tests/b.py": 300.0, "shared-vllm": 100.0, "tests/s.py::t2": 50.0},
    )
    items: list[Any] = [
        FakeItem("tests/a.py::x"),
        FakeItem("tests/s.py::t1", spread=True),
        FakeItem("tests/a.py::y"),
        FakeItem("tests/v.py::z", fixtures=("vllm_server",)),
        FakeItem("tests/s.py::t2", spread=True),
        FakeItem("tests/b.py::w"),
        FakeItem("tests/new.py::n", fixtures=("docker_client",)),  # unknown, starts servers: 60 s guessed
    ]
    runshare.assign_groups(items)
    assert [i.nodeid for i in items] == [
        "tests/b.py::w",
        "tests/v.py::z",
        "tests/new.py::n",
        "tests/s.py::t2",
        "tests/a.py::x",
        "tests/a.py::y",
        "tests/s.py::t1",  # unknown and starts nothing: a twentieth of a second per test
    ]
    assert {i.nodeid: i.groups for i in items}["tests/s.py::t1"] == ["tests/s.py::t1"]
    assert {i.nodeid: i.groups for i in items}["tests/v.py::z"] == [runshare.SHARED_VLLM_GROUP]
    assert {i.nodeid: i.groups for i in items}["tests/a.py::y"] == ["tests/a.py"]


class FakeNode:
    def __init__(self) -> None:
        self.shutting_down = False
        self.sent: list[list[int]] = []
        self.shut = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)

    def shutdown(self) -> None:
        self.shut = True


def test_a_worker_gets_its_next_group_only_when_one_test_is_left() -> None:
    config: Any = SimpleNamespace(
        option=SimpleNamespace(loadscopereorder=True),
        getvalue=lambda name: ["popen"] if name == "tx" else None,
    )
    sched = longest_first.LongestFirst(config)
    assert config.option.loadscopereorder is False
    node: Any = FakeNode()
    sched.registered_collections[node] = ["a::1", "a::2", "a::3", "b::1"]
    sched.assigned_work[node] = {"a": {"a::1": True, "a::2": False, "a::3": False}}
    sched.workqueue["b"] = {"b::1": False}
    sched._reschedule(node)
    assert node.sent == []  # two to run: work in hand
    sched.assigned_work[node]["a"]["a::2"] = True
    sched._reschedule(node)
    assert node.sent == [[3]]  # one left, held back until the worker hears what follows
    sched._reschedule(node)
    assert node.shut  # nothing queued: the worker is told to finish


def test_long_groups_leave_a_worker_for_the_short_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(longest_first, "measured", lambda: {"l1": 500.0, "l2": 400.0, "l3": 300.0})
    config: Any = SimpleNamespace(
        option=SimpleNamespace(loadscopereorder=True),
        getvalue=lambda name: ["3*popen"] if name == "tx" else None,
    )
    sched = longest_first.LongestFirst(config)
    nodes: list[Any] = [FakeNode() for _ in range(3)]
    order = ["l1", "l2", "l3", "s1"]
    for node in nodes:
        sched.registered_collections[node] = [f"{g}::t" for g in order]
    for g in order:
        sched.workqueue[g] = {f"{g}::t": False}
    for node in nodes:
        sched._assign_work_unit(node)
    # 3 workers: two long groups at a time, and the third takes the short one
    assert [n.sent for n in nodes] == [[[0]], [[1]], [[3]]]
    sched.assigned_work[nodes[2]]["s1"]["s1::t"] = True
    sched._assign_work_unit(nodes[2])
    assert nodes[2].sent == [[3]]  # only a long group is left, and two run: it waits
    sched.assigned_work[nodes[0]]["l1"]["l1::t"] = True  # a long one ends
    sched._assign_work_unit(nodes[2])
    assert nodes[2].sent == [[3], [2]]
