"""Evaluates the nodes of a plan for one query: selectors over the SampleStore, and the dispatch to calls,
operators and aggregations, counting what it materialises against the query's Budget."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable

from ..store import Labels, Series, is_stale
from . import binops
from .aggregations import aggregate
from .binops import Vec, check_unique, drop_name
from .budget import MAX_SAMPLES, Budget
from .calls import eval_call
from .columns import Selections, Window, range_function, window
from .compile import Agg, At, Binary, Call, Neg, Node, Num, Paren, RangeSel, Sel, Str, Subquery
from .rangefuncs import COLUMN_FUNCTIONS
from .results import Mat, Result
from .values import QueryError


class Evaluator:
    """Evaluates plan nodes for one query (start/end are the query's, for `@ start()` / `@ end()`)."""

    def __init__(
        self,
        selections: Selections,
        lookback_ms: int,
        default_step_ms: int,
        start_ms: int,
        end_ms: int,
        tick: Callable[[], None] | None = None,
        shared: Shared | None = None,
        max_samples: int = MAX_SAMPLES,
    ) -> None:
        self.selections = selections
        self.shared = shared
        self.budget = Budget(tick, max_samples)
        self.tick = self.budget.step  # at each step of a range query or subquery; raises to abandon it
        self.lookback_ms = lookback_ms
        self.default_step_ms = default_step_ms
        self.start_ms = start_ms
        self.end_ms = end_ms
        self._subquery_points: dict[tuple[int, int], Vec] = {}

    # -- selectors -------------------------------------------------------------------------------------
    def series(self, sel: Sel) -> list[Series]:
        """The stored series a selector picks, in label order."""
        return self.selections.select(sel.selector).series

    def ref_time(self, at: At | None, offset_ms: int, t: int) -> int:
        """The time a selector or subquery reads at: its `@` (or t), minus its offset."""
        if at is None:
            return t - offset_ms
        if at.which == "start":
            return self.start_ms - offset_ms
        if at.which == "end":
            return self.end_ms - offset_ms
        return at.t_ms - offset_ms

    def instant(self, sel: Sel, t: int, *, with_time: bool = False) -> list[tuple[Labels, float, int]]:
        """The newest non-stale sample of each series within the lookback (closed window)."""
        ref = self.ref_time(sel.at, sel.offset_ms, t)
        floor = ref - self.lookback_ms
        out = []
        for s in self.series(sel):
            ts = s.ts
            i = len(ts) - 1
            if i < 0:
                continue
            if ts[i] > ref:  # usually the newest sample is the one: no search
                i = bisect_right(ts, ref) - 1
            if i < 0 or ts[i] < floor:
                continue
            v = s.vals[i]
            if v != v and is_stale(v):  # noqa: PLR0124 (fast NaN test)
                continue
            out.append((s.labels, v, ts[i]))
        return out

    def window(self, node: RangeSel, t: int) -> Mat:
        """Each series' non-stale samples with ref-range <= t <= ref (closed, as in 2.42)."""
        ref = self.ref_time(node.sel.at, node.sel.offset_ms, t)
        lo_t = ref - node.range_ms
        out = []
        for s in self.series(node.sel):
            ts = s.ts
            lo = bisect_left(ts, lo_t)
            hi = bisect_right(ts, ref)
            if lo < hi:
                self.budget.charge(hi - lo)
                w = window(s, lo, hi, lo_t, ref)
                if w is not None:
                    out.append(w)
        return out

    def column_function(
        self, name: str, node: RangeSel, t: int, summed: tuple[tuple[str, ...], bool] | None = None
    ) -> Vec:
        """A range function of COLUMN_FUNCTIONS over a range selector, reading windows in place; with
        `summed` (grouping, without), summed as `sum by/without` does."""
        sel = node.sel
        ref = self.ref_time(sel.at, sel.offset_ms, t)
        selection = self.selections.select(sel.selector)
        key = (node.range_ms, sel.offset_ms)
        self.budget.charge(len(selection.series))  # read in place: one sample each, as far as memory goes
        return range_function(name, selection, key, ref - node.range_ms, ref, t, summed)

    def summed(self, name: str, node: RangeSel, t: int, by: tuple[tuple[str, ...], bool]) -> Vec:
        """`sum by/without (name(node))`: the column function, summed; worked out once per time while the
        engine shares results and nothing writes to series of the selector's name (see Engine.shared)."""
        shared, sel = self.shared, node.sel
        if shared is None or sel.selector.name in shared.written:
            return self.column_function(name, node, t, by)
        at = None if sel.at is None else (sel.at.which, sel.at.t_ms)
        key = (name, sel.selector, node.range_ms, sel.offset_ms, at, t, self.start_ms, self.end_ms, by)
        found = shared.results.get(key)
        if found is None:
            found = shared.results[key] = self.column_function(name, node, t, by)
        return list(found)  # the callers' own list: none changes one, but none needs to know

    def subquery(self, node: Subquery, t: int) -> Mat:
        """Evaluate `expr[range:step]`: the inner expression at step-aligned times in [ref-range, ref]."""
        ref = self.ref_time(node.at, node.offset_ms, t)
        step = node.step_ms or self.default_step_ms
        lo_t = ref - node.range_ms
        first = step * (lo_t // step)
        if first < lo_t:
            first += step
        points: dict[Labels, tuple[list[int], list[float]]] = {}
        for ts in range(first, ref + 1, step):
            self.tick()
            key = (id(node), ts)
            vec = self._subquery_points.get(key)
            if vec is None:
                vec = self.vector(node.expr, ts)
                self._subquery_points[key] = vec
            for labels, v in vec:
                series = points.get(labels)
                if series is None:
                    series = points[labels] = ([], [])
                if v != v and is_stale(v):  # noqa: PLR0124 (fast NaN test)
                    continue
                series[0].append(ts)
                series[1].append(v)
        return [Window(labels, ts_, vs, lo_t, ref) for labels, (ts_, vs) in points.items() if ts_]

    # -- dispatch --------------------------------------------------------------------------------------
    def eval(self, node: Node, t: int) -> Result:
        """Evaluate a node at time t (ms); the instant vectors it makes count against the query's budget."""
        if isinstance(node, (Num, Str)):
            return node.value
        if isinstance(node, Paren):
            return self.eval(node.expr, t)
        if isinstance(node, RangeSel):
            return self.window(node, t)
        if isinstance(node, Subquery):
            return self.subquery(node, t)
        result: Result
        if isinstance(node, Sel):
            result = [(labels, v) for labels, v, _ in self.instant(node, t)]
        elif isinstance(node, Neg):
            inner = self.eval(node.expr, t)
            if isinstance(inner, float):
                return -inner
            result = check_unique([(drop_name(labels), -v) for labels, v in self.as_vector(inner)])
        elif isinstance(node, Binary):
            result = self.binary(node, t)
        elif isinstance(node, Agg):
            result = self.aggregation(node, t)
        else:
            result = eval_call(self, node, t)
        if isinstance(result, list):
            self.budget.charge(len(result))
        return result

    def vector(self, node: Node, t: int) -> Vec:
        """Evaluate a node known to give an instant vector."""
        return self.as_vector(self.eval(node, t))

    @staticmethod
    def as_vector(result: Result) -> Vec:
        """Narrow an evaluation result to an instant vector."""
        if isinstance(result, list) and (not result or isinstance(result[0], tuple)):
            return result  # type: ignore[return-value]
        raise QueryError(f"expected an instant vector, got {type(result).__name__}")

    def scalar(self, node: Node, t: int) -> float:
        """Evaluate a node known to give a scalar."""
        result = self.eval(node, t)
        if not isinstance(result, float):
            raise QueryError("expected a scalar")
        return result

    def string(self, node: Node) -> str:
        """The value of a string argument (string literals only, possibly parenthesised)."""
        while isinstance(node, Paren):
            node = node.expr
        if not isinstance(node, Str):
            raise QueryError("expected a string literal")
        return node.value

    def binary(self, node: Binary, t: int) -> Result:
        """Evaluate a binary operation."""
        if node.lhs.kind == "scalar" and node.rhs.kind == "scalar":
            return binops.scalar_scalar(node.op, self.scalar(node.lhs, t), self.scalar(node.rhs, t))
        if node.lhs.kind == "scalar":
            lhs_s = self.scalar(node.lhs, t)
            rhs_v = self.vector(node.rhs, t)
            return check_unique(binops.vector_scalar(node.op, rhs_v, lhs_s, True, node.return_bool))
        lhs = self.vector(node.lhs, t)
        if node.rhs.kind == "scalar":
            rhs_s = self.scalar(node.rhs, t)
            return check_unique(binops.vector_scalar(node.op, lhs, rhs_s, False, node.return_bool))
        rhs = self.vector(node.rhs, t)
        if node.op in ("and", "or", "unless"):
            return check_unique(binops.set_operation(node, lhs, rhs))
        return check_unique(binops.vector_vector(node, lhs, rhs))

    def aggregation(self, node: Agg, t: int) -> Vec:
        """Evaluate an aggregation (the parameter first, as Prometheus does)."""
        param: float | str | None = None
        if node.param is not None:
            param = self.string(node.param) if node.param.kind == "string" else self.scalar(node.param, t)
        if node.op == "sum":
            inner = node.expr
            if isinstance(inner, Call) and inner.name in COLUMN_FUNCTIONS:
                arg = inner.args[0]
                while isinstance(arg, Paren):
                    arg = arg.expr
                # With a metric name the series stay apart once it is dropped (no check for duplicates).
                if isinstance(arg, RangeSel) and arg.sel.selector.name is not None:
                    return self.summed(inner.name, arg, t, (node.grouping, node.without))
        vec = self.vector(node.expr, t)
        return aggregate(node.op, vec, node.grouping, node.without, param)


class Shared:
    """Results worked out once while the store changes only in series named `written`."""

    __slots__ = ("results", "written")

    def __init__(self, written: frozenset[str]) -> None:
        self.written = written
        self.results: dict[tuple[object, ...], Vec] = {}
