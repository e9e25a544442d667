"""sort(), sort_desc(), topk() and bottomk() in O(n log n) give exactly what the insertion sort before them gave
(Go's order for short inputs, checked against promtool 2.42 by test_differential.py): random vectors with
ties, NaNs, infinities and signed zeros."""

from __future__ import annotations

import math
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_watchdog.promql.aggregations import aggregate, sort_vector
from vllm_watchdog.store import Labels

Sample = tuple[Labels, float]
Less = Callable[[float, float], bool]


def _less_topk(a: float, b: float) -> bool:
    return math.isnan(a) or a < b


def _less_bottomk(a: float, b: float) -> bool:
    return math.isnan(a) or a > b


def _insertion_sort(h: list[Sample], less: Less) -> list[Sample]:
    """The former sort: Go's sort.Sort(sort.Reverse(h)) as insertion sort."""
    h = list(h)
    for i in range(1, len(h)):
        j = i
        while j > 0 and less(h[j - 1][1], h[j][1]):
            h[j], h[j - 1] = h[j - 1], h[j]
            j -= 1
    return h


def _heap_fix(h: list[Sample], i: int, less: Less) -> None:
    while i > 0 and less(h[i][1], h[(i - 1) // 2][1]):  # up
        h[i], h[(i - 1) // 2] = h[(i - 1) // 2], h[i]
        i = (i - 1) // 2


def _heap_pop(h: list[Sample], less: Less) -> None:
    n = len(h) - 1
    h[0], h[n] = h[n], h[0]
    i = 0
    while 2 * i + 1 < n:  # down
        j = 2 * i + 1
        if j + 1 < n and less(h[j + 1][1], h[j][1]):
            j += 1
        if not less(h[j][1], h[i][1]):
            break
        h[i], h[j] = h[j], h[i]
        i = j
    h.pop()


def _old_top(op: str, vec: list[Sample], k: int) -> list[Sample]:
    """The former topk/bottomk without grouping: Go's container/heap, then the insertion sort."""
    less = _less_topk if op == "topk" else _less_bottomk
    h: list[Sample] = []
    for sample in vec:
        if not h:
            h.append(sample)
            continue
        top = h[0][1]
        if len(h) < k or less(top, sample[1]) or math.isnan(top):
            if len(h) == k:
                if k == 1:
                    h[0] = sample
                    continue
                _heap_pop(h, less)
            h.append(sample)
            _heap_fix(h, len(h) - 1, less)
    return _insertion_sort(h, less)


_VALUES = st.sampled_from([0.0, -0.0, 1.0, 1.0, 2.5, -3.0, math.inf, -math.inf, math.nan, math.nan])
_VECTORS = st.lists(_VALUES, max_size=40).map(
    lambda values: [((("i", f"{i:03d}"),), v) for i, v in enumerate(values)]
)


def _same(a: list[Sample], b: list[Sample]) -> bool:
    """Equal as sequences, NaN equal to NaN and -0 told from 0."""
    return [(labels, repr(v)) for labels, v in a] == [(labels, repr(v)) for labels, v in b]


@settings(max_examples=300, deadline=None)
@given(_VECTORS)
def test_sort_and_sort_desc_order_as_before(vec: list[Sample]) -> None:
    assert _same(sort_vector(vec, descending=False), _insertion_sort(vec, _less_bottomk))
    assert _same(sort_vector(vec, descending=True), _insertion_sort(vec, _less_topk))


@settings(max_examples=300, deadline=None)
@given(_VECTORS, st.integers(min_value=1, max_value=45))
def test_topk_and_bottomk_choose_and_order_as_before(vec: list[Sample], k: int) -> None:
    for op in ("topk", "bottomk"):
        assert _same(aggregate(op, vec, (), False, float(k)), _old_top(op, vec, k))
