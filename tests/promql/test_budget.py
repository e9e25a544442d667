"""What one query may do once it parses (issue 28, findings 2 and 4): a bounded label value, a samples budget,
the deadline checked inside functions and aggregations, and sorts in O(n log n) with Prometheus' order."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import FrameType

import pytest

from vllm_watchdog.promql.budget import TICK_EVERY, TOO_MANY_SAMPLES, Budget
from vllm_watchdog.promql.engine import Engine
from vllm_watchdog.promql.labelfuncs import MAX_LABEL_VALUE
from vllm_watchdog.promql.values import QueryError, Vector
from vllm_watchdog.store import SampleStore, make_labels

ROOT = Path(__file__).resolve().parents[2]


def _store(series: int, name: str = "x", value: str = "v") -> SampleStore:
    store = SampleStore(1e9)
    for i in range(series):
        store.append(make_labels(name, {"a": f"{value}{i}"}), 0, float((i * 7919) % series))
    return store


def _nested_label_replace(levels: int, dollars: int) -> str:
    text = "x"
    for _ in range(levels):
        text = f'label_replace({text}, "a", "{"$1" * dollars}", "a", "(.*)")'
    return text


_CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from vllm_watchdog.promql.engine import Engine
from vllm_watchdog.promql.values import QueryError
from vllm_watchdog.store import SampleStore, make_labels
store = SampleStore(1e9)
store.append(make_labels("x", {"a": "abcdefghij"}), 0, 1.0)
try:
    value = Engine(store).query(sys.stdin.read(), 1.0)
    print(json.dumps(["answered", max(len(v) for s in value for _, v in s.labels)]))
except QueryError as exc:
    print(json.dumps(["refused", str(exc)]))
"""


def test_nested_label_replace_is_refused_at_the_first_oversized_value() -> None:
    # Three levels of "$1" x 2700 (16 KB) drove the daemon to 23 GB; the child has 3 GiB of address space.
    text = _nested_label_replace(3, 2700)
    assert len(text) < 16_384
    child = subprocess.run(
        [sys.executable, "-c", _CHILD], input=text, capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert json.loads(child.stdout) == [
        "refused",
        f"label_replace(): the value of label 'a' would be longer than {MAX_LABEL_VALUE} characters",
    ]


def test_label_values_up_to_the_limit_are_written() -> None:
    store = SampleStore(1e9)
    store.append(make_labels("x", {"a": "ab", "b": "c" * 2000, "c": "d" * 2000}), 0, 1.0)
    engine = Engine(store)
    fits = engine.query(f'label_replace(x, "z", "{"$1" * (MAX_LABEL_VALUE // 2)}", "a", "(.*)")', 1.0)
    assert isinstance(fits, Vector) and dict(fits[0].labels)["z"] == "ab" * (MAX_LABEL_VALUE // 2)
    with pytest.raises(QueryError, match="label_replace"):
        engine.query(f'label_replace(x, "z", "{"$1" * (MAX_LABEL_VALUE // 2 + 1)}", "a", "(.*)")', 1.0)
    joined = engine.query('label_join(x, "z", "", "b", "c")', 1.0)
    assert isinstance(joined, Vector) and len(dict(joined[0].labels)["z"]) == 4000
    with pytest.raises(QueryError, match="label_join"):
        engine.query('label_join(x, "z", "", "b", "c", "a", "b")', 1.0)


def test_a_replacement_is_not_expanded_when_it_could_pass_a_mebibyte() -> None:
    store = SampleStore(1e9)
    store.append(make_labels("x", {"a": "v" * 1000}), 0, 1.0)
    # 1,100 references to a 1,000-character group: refused before 1.1 MB is built.
    with pytest.raises(QueryError, match="would be longer than"):
        Engine(store).query(f'label_replace(x, "z", "{"$1" * 1100}", "a", "(.*)")', 1.0)


def test_the_samples_budget_stops_a_query() -> None:
    engine = Engine(_store(100), max_samples=1_000)
    value = engine.query("x * 2 + x", 1.0)
    assert isinstance(value, Vector) and len(value) == 100
    with pytest.raises(QueryError, match=TOO_MANY_SAMPLES):
        engine.query("max_over_time(x[10m:1s])", 100.0)  # 101 steps of 100 samples
    with pytest.raises(QueryError, match=TOO_MANY_SAMPLES):
        engine.query_range("x", 0.0, 100.0, 1.0)
    budget = Budget(max_samples=10)
    budget.charge(10)
    with pytest.raises(QueryError, match=TOO_MANY_SAMPLES):
        budget.charge(1)


def test_an_instant_query_without_subqueries_checks_its_deadline_inside_its_work() -> None:
    # The deadline was checked only at the steps of a range query or subquery: a nested label_replace or sort
    # over many series ran to its end whatever the timeout.
    ticks: list[None] = []
    engine = Engine(_store(3 * TICK_EVERY))
    engine.query('count(label_replace(x, "b", "$1", "a", "(.*)"))', 1.0, tick=lambda: ticks.append(None))
    assert len(ticks) >= 3


def test_a_tick_that_raises_abandons_the_query_inside_a_function() -> None:
    class Late(QueryError):
        pass

    def tick() -> None:
        raise Late("query timed out in expression evaluation")

    with pytest.raises(Late):
        Engine(_store(2 * TICK_EVERY)).query('label_join(x, "b", ",", "a", "a")', 1.0, tick=tick)


class _CallBudget:
    """A profiler that counts Python calls and raises past a budget: quadratic work fails fast, untimed."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.calls = 0

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            self.calls += 1
            if self.calls > self.budget:
                raise RuntimeError(f"more than {self.budget} Python calls")


def _profiled(engine: Engine, text: str, budget: int) -> Vector:
    profiler = _CallBudget(budget)
    sys.setprofile(profiler)
    try:
        value = engine.query(text, 1.0)
    finally:
        sys.setprofile(None)
    assert isinstance(value, Vector)
    return value


@pytest.mark.parametrize("text", ["sort(x)", "sort_desc(x)", "topk(1000, x)", "bottomk(1000, x)"])
def test_sorts_are_not_quadratic(text: str) -> None:
    # The insertion sort compared 1,000 series about 250,000 times, each comparison a Python call.
    n = 1000
    engine = Engine(_store(n))
    value = _profiled(engine, text, budget=30 * n)
    values = [s.value for s in value]
    assert values == sorted(values, reverse=text.startswith(("sort_desc", "topk")))


def test_nested_sort_desc_over_a_thousand_series() -> None:
    # 985 bytes that froze the loop for 21.6 s: NaNs sort last in reverse order, so the insertion sort
    # moved each of them past all the others at every level, sorted input or not.
    levels = (985 - 1) // len("sort_desc()")
    text = "sort_desc(" * levels + "x" + ")" * levels
    store = SampleStore(1e9)
    for i in range(1000):
        store.append(make_labels("x", {"a": f"v{i}"}), 0, math.nan if i % 2 else float(i % 7))
    value = _profiled(Engine(store), text, budget=20 * 1000 * levels)
    numbers = [s.value for s in value[:500]]
    assert numbers == sorted(numbers, reverse=True) and all(math.isnan(s.value) for s in value[500:])
    # Each level reverses the NaNs (Go's insertion sort), so an odd number of levels leaves them reversed.
    nan_order = [s.labels for s in value[500:]]
    assert nan_order == sorted(nan_order, reverse=levels % 2 == 1)
