"""Parse an expression once, check that we can evaluate it, and lower it into a plan the engine walks."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Union

import promql_parser

from .functions import FUNCTIONS
from .labelfuncs import check_label_replace
from .limits import check_shape
from .plancache import WeightedCache
from .positions import PARSER_AGGREGATORS, error_position, find_token, tokenize
from .selectors import Selector, from_ast
from .values import PromQLError, QueryError

# Every aggregator the parser knows except those newer than Prometheus 2.42.
AGGREGATIONS = PARSER_AGGREGATORS - {"limitk", "limit_ratio"}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True, eq=False)
class Num:
    """A number literal."""

    value: float
    kind: str = "scalar"


@dataclass(frozen=True, eq=False)
class Str:
    """A string literal."""

    value: str
    kind: str = "string"


@dataclass(frozen=True, eq=False)
class At:
    """An `@` modifier: a fixed time in ms, or the query's start() / end()."""

    which: str  # "at", "start" or "end"
    t_ms: int = 0


@dataclass(frozen=True, eq=False)
class Sel:
    """An instant-vector selector with its offset and `@`."""

    selector: Selector
    offset_ms: int
    at: At | None
    kind: str = "vector"


@dataclass(frozen=True, eq=False)
class RangeSel:
    """A range-vector selector `sel[range]`."""

    sel: Sel
    range_ms: int
    kind: str = "matrix"


@dataclass(frozen=True, eq=False)
class Subquery:
    """`expr[range:step]` with its offset and `@`; step None means the engine's default step."""

    expr: Node
    range_ms: int
    step_ms: int | None
    offset_ms: int
    at: At | None
    kind: str = "matrix"


@dataclass(frozen=True, eq=False)
class Call:
    """A function call."""

    name: str
    args: tuple[Node, ...]
    kind: str


@dataclass(frozen=True, eq=False)
class Agg:
    """An aggregation; `grouping` is sorted."""

    op: str
    expr: Node
    param: Node | None
    grouping: tuple[str, ...]
    without: bool
    kind: str = "vector"


@dataclass(frozen=True, eq=False)
class Binary:
    """A binary operation with its vector-matching options."""

    op: str
    lhs: Node
    rhs: Node
    card: str  # one-to-one, many-to-one, one-to-many, many-to-many
    on: bool
    matching: tuple[str, ...]
    include: tuple[str, ...]
    return_bool: bool
    kind: str


@dataclass(frozen=True, eq=False)
class Neg:
    """Unary minus."""

    expr: Node
    kind: str


@dataclass(frozen=True, eq=False)
class Paren:
    """Parentheses (kept: `absent` and `timestamp` look through them differently)."""

    expr: Node
    kind: str


Node = Union[Num, Str, Sel, RangeSel, Subquery, Call, Agg, Binary, Neg, Paren]  # noqa: UP007 (runtime alias, py3.10)


def children(node: Node) -> list[Node]:
    """The direct sub-expressions of a lowered node (for walking a plan: which selectors, which constants)."""
    if isinstance(node, RangeSel):
        return [node.sel]
    if isinstance(node, (Subquery, Neg, Paren)):
        return [node.expr]
    if isinstance(node, Call):
        return list(node.args)
    if isinstance(node, Agg):
        return [node.expr] + ([node.param] if node.param is not None else [])
    if isinstance(node, Binary):
        return [node.lhs, node.rhs]
    return []


_CARD = {
    "VectorMatchCardinality.OneToOne": "one-to-one",
    "VectorMatchCardinality.ManyToOne": "many-to-one",
    "VectorMatchCardinality.OneToMany": "one-to-many",
    "VectorMatchCardinality.ManyToMany": "many-to-many",
}
_VALUE_KIND = {
    "ValueType.Vector": "vector",
    "ValueType.Scalar": "scalar",
    "ValueType.Matrix": "matrix",
    "ValueType.String": "string",
}


class _Unsupported(Exception):
    def __init__(self, message: str, token: str, *, kind: str | None = None, call: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.token = token
        self.kind = kind
        self.call = call


def _ms(delta: dt.timedelta | None) -> int:
    if delta is None:
        return 0
    return (delta.days * 86400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _at(node: Any) -> At | None:
    at = node.at
    if at is None:
        return None
    which = str(at.type).rsplit(".", 1)[-1].lower()
    if which == "at":
        return At("at", _ms(at.at - _EPOCH))
    return At(which)


def _lower(node: Any) -> Node:
    if isinstance(node, promql_parser.NumberLiteral):
        return Num(float(node.val))
    if isinstance(node, promql_parser.StringLiteral):
        return Str(node.val)
    if isinstance(node, promql_parser.VectorSelector):
        return _selector(node)
    if isinstance(node, promql_parser.MatrixSelector):
        return RangeSel(_selector(node.vector_selector), _ms(node.range))
    if isinstance(node, promql_parser.SubqueryExpr):
        step = _ms(node.step) if node.step is not None else None
        return Subquery(_lower(node.expr), _ms(node.range), step or None, _ms(node.offset), _at(node))
    if isinstance(node, promql_parser.ParenExpr):
        inner = _lower(node.expr)
        return Paren(inner, inner.kind)
    if isinstance(node, promql_parser.UnaryExpr):
        inner = _lower(node.expr)
        return Neg(inner, inner.kind)
    if isinstance(node, promql_parser.Call):
        return _call(node)
    if isinstance(node, promql_parser.AggregateExpr):
        return _aggregate(node)
    if isinstance(node, promql_parser.BinaryExpr):
        return _binary(node)
    raise _Unsupported(f"unsupported expression {type(node).__name__}", "")


def _selector(node: promql_parser.VectorSelector) -> Sel:
    if node.matchers.or_matchers:
        raise _Unsupported("'or' inside a selector's braces is not supported", "or", kind="ident")
    try:
        selector = from_ast(node)
    except ValueError as exc:
        raise _Unsupported(str(exc), node.name or "{") from exc
    return Sel(selector, _ms(node.offset), _at(node))


def _call(node: promql_parser.Call) -> Call:
    name = node.func.name
    if name not in FUNCTIONS:
        what = "native histograms are" if name.startswith("histogram_") else f"function {name!r} is"
        raise _Unsupported(f"{what} not supported (Prometheus 2.42 semantics)", name, kind="ident", call=True)
    args = tuple(_lower(a) for a in node.args)
    strings = [a.value for a in args[1:] if isinstance(a, Str)]
    if name == "label_replace" and len(strings) == 4:
        # Prometheus fails every evaluation on these; a rule file is refused at load instead.
        try:
            check_label_replace(strings[0], strings[3])
        except QueryError as exc:
            raise _Unsupported(str(exc), name, kind="ident", call=True) from None
    kind = _VALUE_KIND.get(str(node.func.return_type), "vector")
    return Call(name, args, kind)


def _aggregate(node: promql_parser.AggregateExpr) -> Agg:
    op = str(node.op).lower()
    if op not in AGGREGATIONS:
        raise _Unsupported(
            f"aggregation {op!r} is not supported (Prometheus 2.42 semantics)", op, kind="ident"
        )
    grouping: tuple[str, ...] = ()
    without = False
    if node.modifier is not None:
        grouping = tuple(sorted(node.modifier.labels))
        without = str(node.modifier.type).endswith("Without")
    param = _lower(node.param) if node.param is not None else None
    return Agg(op, _lower(node.expr), param, grouping, without)


def _binary(node: promql_parser.BinaryExpr) -> Binary:
    op = str(node.op).lower()
    lhs, rhs = _lower(node.lhs), _lower(node.rhs)
    mod = node.modifier
    card, on, return_bool = "one-to-one", False, False
    matching: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    if mod is not None:
        fill = mod.fill_values
        if fill is not None and (fill.lhs is not None or fill.rhs is not None):
            raise _Unsupported("fill modifiers are not supported (Prometheus 2.42 semantics)", "fill")
        card = _CARD[str(mod.card)]
        if mod.matching is not None:
            on = str(mod.matching.type).endswith("Include")
            matching = tuple(mod.matching.labels)
        include = tuple(mod.group_labels or ())
        return_bool = bool(mod.return_bool)
    if op in ("and", "or", "unless"):
        card = "many-to-many"
    kind = "scalar" if lhs.kind == "scalar" and rhs.kind == "scalar" else "vector"
    return Binary(op, lhs, rhs, card, on, matching, include, return_bool, kind)


@lru_cache(maxsize=1)
def _register_removed_functions() -> None:
    # promql-parser follows Prometheus 3, which renamed holt_winters; 2.42 rule files still use the old name.
    v = promql_parser.ValueType
    holt_winters = promql_parser.Function("holt_winters", [v.Matrix, v.Scalar, v.Scalar], v.Vector)
    promql_parser.register_extra_functions([holt_winters])


def _parse(text: str) -> promql_parser.Expr:
    """Parse a text that check_shape() let through."""
    _register_removed_functions()
    try:
        return promql_parser.parse(text)
    except ValueError as exc:
        message = str(exc)
        raise PromQLError(message, error_position(text, message)) from None


# Plans kept: a plan takes about 300 bytes per term, so at most about 20 MB, whatever the queries are.
_PLANS: WeightedCache[str, Node] = WeightedCache(max_entries=4096, max_weight=65_536)


def compile_plan(text: str) -> Node:
    """Parse, validate and lower an expression; raises PromQLError with a 0-based position; cached."""
    plan = _PLANS.get(text)
    if plan is not None:
        return plan
    terms = check_shape(text).terms  # before the parser, which a deep or large expression crashes or stalls
    ast = _parse(text)
    try:
        plan = _lower(ast)
    except _Unsupported as exc:
        tokens = tokenize(text)
        pos = find_token(tokens, exc.token, kind=exc.kind, call=exc.call) if exc.token else None
        if pos is None and exc.token == "fill":
            pos = next((t.start for t in tokens if t.text.startswith("fill")), None)
        raise PromQLError(exc.message, pos if pos is not None else 0) from None
    _PLANS.put(text, plan, terms)
    return plan


def compile_expr(text: str) -> promql_parser.Expr:
    """Parse and validate an expression at load time; raises PromQLError(message, position)."""
    compile_plan(text)
    return _parse(text)
