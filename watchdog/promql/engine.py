"""The in-process PromQL engine: instant and range queries over the SampleStore, as Prometheus 2.42."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator

from ..store import Labels, SampleStore
from .binops import Vec
from .budget import MAX_SAMPLES
from .columns import Selections
from .compile import Call, Node, Sel, Subquery, children, compile_plan
from .evaluator import Evaluator, Shared
from .functions import DATE_FUNCTIONS
from .results import Result
from .selectors import Selector
from .values import Matrix, QueryError, QueryFunc, RangeSeries, Sample, Scalar, String, Value, Vector, to_ms

__all__ = ["Engine", "Evaluator", "vector_query"]


# Calls that read the evaluation time itself: over empty selections their result still changes with it.
_TIME_CALLS = DATE_FUNCTIONS | {"time", "timestamp"}
_MAX_OVER_NOTHING = 1024


# Kept while the plan is (compile_plan's cache decides how long): plans are immutable.
_SELECTORS: weakref.WeakKeyDictionary[Node, tuple[Selector, ...] | None] = weakref.WeakKeyDictionary()


def _time_free_selectors(plan: Node) -> tuple[Selector, ...] | None:
    """The selectors of an expression whose result is the same at every time while none of them selects a
    series; None if the expression reads the time (time(), timestamp(), the date functions) or holds a
    subquery (its steps fall at times of their own, so how many fall in its range changes)."""
    if plan in _SELECTORS:
        return _SELECTORS[plan]
    found = _SELECTORS[plan] = _walk_selectors(plan)
    return found


def _walk_selectors(plan: Node) -> tuple[Selector, ...] | None:
    selectors: list[Selector] = []
    stack = [plan]
    while stack:
        node = stack.pop()
        if isinstance(node, Subquery) or (isinstance(node, Call) and node.name in _TIME_CALLS):
            return None
        if isinstance(node, Sel):
            selectors.append(node.selector)
        stack.extend(children(node))
    return tuple(selectors)


class Engine:
    """Evaluates PromQL against a SampleStore with Prometheus 2.42 semantics."""

    def __init__(
        self,
        store: SampleStore,
        lookback: float = 300.0,
        *,
        default_step: float = 60.0,
        max_samples: int = MAX_SAMPLES,
    ) -> None:
        self.store = store
        self.max_samples = max_samples  # what one query may materialise, all its nodes together
        self.lookback_ms = to_ms(lookback)
        self.default_step_ms = max(1, to_ms(default_step))
        self.selections = Selections(store)
        self._over_nothing: dict[str, Result] = {}  # expression -> its result while it selects nothing
        self._shared: Shared | None = None

    @contextlib.contextmanager
    def shared(self, written: frozenset[str]) -> Iterator[None]:
        """A block in which the store changes only in series named `written` (the outputs of the rule group
        being evaluated, at one time, with no scrape between its rules): a sum of a range function over a
        selector of another name is worked out once per time and given again to every query that has it."""
        self._shared = Shared(written)
        try:
            yield
        finally:
            self._shared = None

    def _evaluator(self, start_ms: int, end_ms: int, tick: Callable[[], None] | None) -> Evaluator:
        return Evaluator(
            self.selections,
            self.lookback_ms,
            self.default_step_ms,
            start_ms,
            end_ms,
            tick,
            self._shared,
            self.max_samples,
        )

    def query(self, expr: str, at: float, *, tick: Callable[[], None] | None = None) -> Value:
        """Evaluate an instant query at unix seconds `at`; `tick`, called every 1,024 samples or nodes and at
        each step of a subquery, may raise to abandon it. Past max_samples it raises QueryError.

        While none of its selectors selects a series, an expression that does not read the time gives the
        same result at every time: the one of the first evaluation over nothing is kept and given again (a
        GPU rule without GPU metrics, a gateway rule without a gateway), never across a series appearing.
        """
        plan = compile_plan(expr)
        t = to_ms(at)
        selectors = _time_free_selectors(plan)
        if selectors is None or any(self.selections.select(s).series for s in selectors):
            return _value(plan, self._evaluator(t, t, tick).eval(plan, t), t)
        result = self._over_nothing.get(expr)
        if result is None:
            if len(self._over_nothing) >= _MAX_OVER_NOTHING:
                self._over_nothing.clear()
            result = self._over_nothing[expr] = self._evaluator(t, t, tick).eval(plan, t)
        return _value(plan, result, t)

    def query_range(
        self, expr: str, start: float, end: float, step: float, *, tick: Callable[[], None] | None = None
    ) -> Matrix:
        """Evaluate a range query: one instant evaluation per step from start to end inclusive; `tick` is
        called before each step and may raise to abandon the query."""
        plan = compile_plan(expr)
        if plan.kind not in ("vector", "scalar"):
            raise QueryError(
                f"invalid expression type {plan.kind!r} for range query, must be Scalar or instant Vector"
            )
        start_ms, end_ms, step_ms = to_ms(start), to_ms(end), to_ms(step)
        if step_ms <= 0:
            raise QueryError("zero or negative query resolution step widths are not accepted")
        ev = self._evaluator(start_ms, end_ms, tick)
        series: dict[Labels, tuple[list[int], list[float]]] = {}
        for t in range(start_ms, end_ms + 1, step_ms):
            ev.tick()
            result = ev.eval(plan, t)
            vec: Vec = [((), result)] if isinstance(result, float) else Evaluator.as_vector(result)
            for labels, v in vec:
                points = series.get(labels)
                if points is None:
                    points = series[labels] = ([], [])
                points[0].append(t)
                points[1].append(v)
        return Matrix(RangeSeries(labels, ts, vs) for labels, (ts, vs) in sorted(series.items()))


def _value(plan: Node, result: Result, t: int) -> Value:
    """An evaluation result as the query's value at t (ms)."""
    if isinstance(result, float):
        return Scalar(result, t)
    if isinstance(result, str):
        return String(result, t)
    if plan.kind == "matrix":
        return Matrix(RangeSeries(w.labels, w.ts, w.vals) for w in result)  # type: ignore[union-attr]
    return Vector(Sample(labels, v, t) for labels, v in Evaluator.as_vector(result))


def vector_query(engine: Engine) -> QueryFunc:
    """Adapt an Engine to the rule manager's QueryFunc: scalars become one unlabelled sample."""

    def query(expr: str, at: float) -> Vector:
        result = engine.query(expr, at)
        if isinstance(result, Vector):
            return result
        if isinstance(result, Scalar):
            return Vector([Sample((), result.value, result.t_ms)])
        if isinstance(result, String):
            raise QueryError(f"rule expression {expr!r} gives a string, not a vector or scalar")
        raise QueryError(f"rule expression {expr!r} gives a range vector, not a vector or scalar")

    return query
