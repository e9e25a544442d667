"""Function calls: evaluate arguments, then dispatch to the rangefuncs, mathfuncs and labelfuncs kernels."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Protocol

from ..formats.gostrconv import parse_float
from ..store import Labels
from . import labelfuncs, mathfuncs, rangefuncs
from .aggregations import sort_vector
from .binops import Vec, check_unique, drop_name
from .budget import Budget
from .compile import Call, Node, Paren, RangeSel, Sel, Subquery
from .results import Mat, Result
from .values import QueryError


class ArgumentEvaluator(Protocol):
    """What a call asks of the evaluator: its arguments evaluated, and the query's budget."""

    budget: Budget

    def window(self, node: RangeSel, t: int) -> Mat: ...
    def subquery(self, node: Subquery, t: int) -> Mat: ...
    def instant(self, sel: Sel, t: int, *, with_time: bool = False) -> list[tuple[Labels, float, int]]: ...
    def vector(self, node: Node, t: int) -> Vec: ...
    def scalar(self, node: Node, t: int) -> float: ...
    def string(self, node: Node) -> str: ...
    def column_function(
        self, name: str, node: RangeSel, t: int, summed: tuple[tuple[str, ...], bool] | None = None
    ) -> Vec: ...


_NO_NAME_DROP = frozenset(("last_over_time",))
_NO_LABELS: Labels = ()


def _unparen(node: Node) -> Node:
    while isinstance(node, Paren):
        node = node.expr
    return node


def absent_labels(node: Node) -> Labels:
    """The labels absent() reports: those fixed by one equality matcher of a plain selector."""
    node = _unparen(node)
    if isinstance(node, RangeSel):
        node = node.sel
    if not isinstance(node, Sel):
        return ()
    out: dict[str, str] = {}
    seen: set[str] = set()
    for m in node.selector.matchers:
        if m.name == "__name__":
            continue
        if m.op == "=" and m.name not in seen:
            out[m.name] = m.value
            seen.add(m.name)
        else:
            out.pop(m.name, None)
    return tuple(sorted((k, v) for k, v in out.items() if v != ""))


def _matrix_arg(ev: ArgumentEvaluator, node: Node, t: int) -> Mat:
    node = _unparen(node)
    if isinstance(node, RangeSel):
        return ev.window(node, t)
    if isinstance(node, Subquery):
        return ev.subquery(node, t)
    raise QueryError("expected a range vector argument")


def _range_call(ev: ArgumentEvaluator, node: Call, t: int) -> Vec:
    name = node.name
    mat = _matrix_arg(ev, node.args[0] if name not in ("quantile_over_time",) else node.args[1], t)
    if name == "absent_over_time":
        return [] if mat else [(absent_labels(_unparen(node.args[0])), 1.0)]
    scalars = tuple(
        ev.scalar(a, t) for a in (node.args[:1] if name == "quantile_over_time" else node.args[1:])
    )
    kernel = rangefuncs.RANGE_FUNCTIONS[name]
    keep_name = name in _NO_NAME_DROP
    out: Vec = []
    for w in mat:
        try:
            value = kernel(w.ts, w.vals, w.start_ms, w.end_ms, t, scalars)
        except ValueError as exc:
            raise QueryError(str(exc)) from None
        if value is not None:
            out.append((w.labels if keep_name else drop_name(w.labels), value))
    return out


def _timestamp(ev: ArgumentEvaluator, node: Call, t: int) -> Vec:
    arg = _unparen(node.args[0])
    if isinstance(arg, Sel):
        return [(drop_name(labels), ts / 1000) for labels, _, ts in ev.instant(arg, t)]
    return [(drop_name(labels), t / 1000) for labels, _ in ev.vector(arg, t)]


@lru_cache(maxsize=1 << 16)
def _bucket_of(labels: Labels) -> tuple[Labels, Labels, float] | None:
    """A bucket's histogram (labels without `le`), that without `__name__`, and its upper bound; cached."""
    le = next((val for key, val in labels if key == "le"), None)
    if le is None:
        return None
    try:
        bound = parse_float(le, underscores=False)
    except ValueError:  # Prometheus skips a bucket whose `le` strconv.ParseFloat refuses
        return None
    key = tuple(p for p in labels if p[0] != "le")
    return key, drop_name(key), bound


def _histogram_quantile(q: float, vec: Vec) -> Vec:
    groups: dict[Labels, tuple[Labels, list[tuple[float, float]]]] = {}
    for labels, v in vec:
        bucket = _bucket_of(labels)
        if bucket is None:
            continue
        key, unnamed, bound = bucket
        group = groups.get(key)
        if group is None:
            group = groups[key] = (unnamed, [])
        group[1].append((bound, v))
    return [(labels, mathfuncs.histogram_quantile(q, buckets)) for labels, buckets in groups.values()]


def _label_call(ev: ArgumentEvaluator, node: Call, t: int) -> Vec:
    vec = ev.vector(node.args[0], t)
    strings = [ev.string(a) for a in node.args[1:]]
    if node.name == "label_replace":
        dst, repl, src, regex = strings
        labelfuncs.check_label_replace(dst, regex)
        cache: dict[Labels, Labels] = {}
        out = []
        for labels, v in vec:
            new = cache.get(labels)
            if new is None:
                ev.budget.charge(0)  # a regex match and an expansion: the deadline is checked now and then
                new = cache[labels] = labelfuncs.label_replace(labels, dst, repl, src, regex)
            out.append((new, v))
        return out
    dst, sep, *srcs = strings
    labelfuncs.check_label_join(dst, srcs)
    joined = []
    for labels, v in vec:
        ev.budget.charge(0)
        joined.append((labelfuncs.label_join(labels, dst, sep, srcs), v))
    return joined


def _vector_call(ev: ArgumentEvaluator, node: Call, t: int) -> Result:
    name, args = node.name, node.args
    if name in mathfuncs.MATH_FUNCTIONS:
        fn = mathfuncs.MATH_FUNCTIONS[name]
        return [(drop_name(labels), fn(v)) for labels, v in ev.vector(args[0], t)]
    if name in mathfuncs.DATE_FUNCTIONS:
        if not args:
            return [(_NO_LABELS, mathfuncs.date_part(name, float(t // 1000)))]
        return [(drop_name(labels), mathfuncs.date_part(name, v)) for labels, v in ev.vector(args[0], t)]
    if name == "time":
        return t / 1000
    if name == "pi":
        return math.pi
    if name == "scalar":
        vec = ev.vector(args[0], t)
        return vec[0][1] if len(vec) == 1 else math.nan
    if name == "vector":
        return [(_NO_LABELS, ev.scalar(args[0], t))]
    if name == "timestamp":
        return _timestamp(ev, node, t)
    if name == "absent":
        return [] if ev.vector(args[0], t) else [(absent_labels(args[0]), 1.0)]
    if name in ("sort", "sort_desc"):
        return sort_vector(ev.vector(args[0], t), name == "sort_desc")
    if name in ("label_replace", "label_join"):
        return _label_call(ev, node, t)
    if name == "histogram_quantile":
        q = ev.scalar(args[0], t)
        return _histogram_quantile(q, ev.vector(args[1], t))
    scalars = [ev.scalar(a, t) for a in args[1:]]
    vec = ev.vector(args[0], t)
    if name == "round":
        to = scalars[0] if scalars else 1.0
        return [(drop_name(labels), mathfuncs.round_to(v, to)) for labels, v in vec]
    if name == "clamp":
        lo, hi = scalars
        if hi < lo:
            return []
        # Go computes max(lo, min(hi, v)); the other nesting differs for NaN and Inf bounds.
        return [(drop_name(labels), mathfuncs.go_max(lo, mathfuncs.go_min(hi, v))) for labels, v in vec]
    if name == "clamp_min":
        return [(drop_name(labels), mathfuncs.clamp_min(v, scalars[0])) for labels, v in vec]
    if name == "clamp_max":
        return [(drop_name(labels), mathfuncs.clamp_max(v, scalars[0])) for labels, v in vec]
    raise QueryError(f"function {name!r} is not supported")


def eval_call(ev: ArgumentEvaluator, node: Node, t: int) -> Result:
    """Evaluate a function call node at time t; vector results are checked for repeated label sets."""
    if not isinstance(node, Call):
        raise QueryError(f"cannot evaluate {type(node).__name__}")
    if node.name in rangefuncs.COLUMN_FUNCTIONS:
        arg = _unparen(node.args[0])
        if isinstance(arg, RangeSel):
            vec = ev.column_function(node.name, arg, t)
            # Series of one metric name differ in another label, so dropping the name keeps them apart.
            return vec if arg.sel.selector.name is not None else check_unique(vec)
    if node.name in rangefuncs.RANGE_FUNCTIONS or node.name == "absent_over_time":
        return check_unique(_range_call(ev, node, t))
    result = _vector_call(ev, node, t)
    if isinstance(result, list):
        return check_unique(result)  # type: ignore[arg-type]
    return result
