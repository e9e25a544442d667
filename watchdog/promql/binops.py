"""Binary operators: arithmetic with Go float semantics, comparisons, set operators and vector matching."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

from ..store import Labels
from .compile import Binary
from .values import QueryError

Vec = list[tuple[Labels, float]]
"""An instant vector inside the evaluator: (labels, value) pairs."""

ARITHMETIC = frozenset(("+", "-", "*", "/", "%", "^"))
COMPARISONS = frozenset(("==", "!=", ">", "<", ">=", "<="))


def _div(a: float, b: float) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _mod(a: float, b: float) -> float:
    try:
        return math.fmod(a, b)  # Go's math.Mod: the result takes the sign of a
    except ValueError:
        return math.nan


def _pow(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except ValueError:
        if a == 0 and b < 0:
            odd = b == math.floor(b) and math.fmod(b, 2) != 0
            return math.copysign(math.inf, a) if odd else math.inf
        return math.nan
    except OverflowError:
        odd = b == math.floor(b) and math.fmod(b, 2) != 0
        return -math.inf if a < 0 and odd else math.inf


OPERATORS: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": _div,
    "%": _mod,
    "^": _pow,
    "atan2": math.atan2,
}
_TESTS: dict[str, Callable[[float, float], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
}


def drop_name(labels: Labels) -> Labels:
    """Labels without `__name__`."""
    if labels and any(k == "__name__" for k, _ in labels):
        return tuple(p for p in labels if p[0] != "__name__")
    return labels


def check_unique(vec: Vec) -> Vec:
    """Raise the error Prometheus gives when a result repeats a label set."""
    if len(vec) > 1 and len({labels for labels, _ in vec}) != len(vec):
        raise QueryError("vector cannot contain metrics with the same labelset")
    return vec


def _elem(op: str, lhs: float, rhs: float) -> tuple[float, bool]:
    """Prometheus' vectorElemBinop: (value, keep)."""
    test = _TESTS.get(op)
    if test is not None:
        return lhs, test(lhs, rhs)
    return OPERATORS[op](lhs, rhs), True


def scalar_scalar(op: str, lhs: float, rhs: float) -> float:
    """A binary operation between two scalars (comparisons give 0 or 1)."""
    test = _TESTS.get(op)
    if test is not None:
        return 1.0 if test(lhs, rhs) else 0.0
    return OPERATORS[op](lhs, rhs)


def vector_scalar(op: str, vec: Vec, scalar: float, swap: bool, return_bool: bool) -> Vec:
    """A binary operation between a vector and a scalar; swap=True when the scalar is on the left."""
    drop = op in ARITHMETIC or return_bool
    is_cmp = op in COMPARISONS
    out: Vec = []
    for labels, v in vec:
        lv, rv = (scalar, v) if swap else (v, scalar)
        value, keep = _elem(op, lv, rv)
        if is_cmp and swap:
            value = rv
        if return_bool:
            value, keep = (1.0 if keep else 0.0), True
        if keep:
            out.append((drop_name(labels) if drop else labels, value))
    return out


def signature_func(node: Binary) -> Callable[[Labels], Labels]:
    """The match-signature of a series for this operation's on/ignoring clause."""
    if node.on:
        names = frozenset(node.matching)
        return lambda labels: _signature(labels, names, True)
    excluded = frozenset((*node.matching, "__name__"))
    return lambda labels: _signature(labels, excluded, False)


@lru_cache(maxsize=1 << 16)
def _signature(labels: Labels, names: frozenset[str], on: bool) -> Labels:
    # Cached: rules match the same series every evaluation.
    if on:
        return tuple(p for p in labels if p[0] in names)
    return tuple(p for p in labels if p[0] not in names)


def set_operation(node: Binary, lhs: Vec, rhs: Vec) -> Vec:
    """`and`, `or` and `unless`."""
    sig = signature_func(node)
    if node.op == "and":
        if not lhs or not rhs:
            return []
        right = {sig(labels) for labels, _ in rhs}
        return [s for s in lhs if sig(s[0]) in right]
    if node.op == "or":
        if not lhs:
            return list(rhs)
        if not rhs:
            return list(lhs)
        left = {sig(labels) for labels, _ in lhs}
        return list(lhs) + [s for s in rhs if sig(s[0]) not in left]
    if not lhs or not rhs:
        return list(lhs)
    right = {sig(labels) for labels, _ in rhs}
    return [s for s in lhs if sig(s[0]) not in right]


def _format_labels(labels: Labels) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}"


@lru_cache(maxsize=1 << 16)
def _result_labels(node: Binary, many: Labels, one: Labels) -> Labels:
    out = dict(many)
    if node.op in ARITHMETIC:
        out.pop("__name__", None)
    if node.card == "one-to-one":
        if node.on:
            keep = set(node.matching)
            out = {k: v for k, v in out.items() if k in keep}
        else:
            for name in node.matching:
                out.pop(name, None)
    if node.include:
        one_d = dict(one)
        for name in node.include:
            value = one_d.get(name, "")
            if value:
                out[name] = value
            else:
                out.pop(name, None)
    if node.return_bool:
        out.pop("__name__", None)
    return tuple(sorted(out.items()))


def vector_vector(node: Binary, lhs: Vec, rhs: Vec) -> Vec:
    """Arithmetic and comparisons between two vectors with one-to-one or group_left/right matching."""
    if not lhs or not rhs:
        return []
    sig = signature_func(node)
    swapped = node.card == "one-to-many"
    if swapped:
        lhs, rhs = rhs, lhs
    right: dict[Labels, tuple[Labels, float]] = {}
    for labels, v in rhs:
        key = sig(labels)
        dup = right.get(key)
        if dup is not None:
            side = "left" if swapped else "right"
            matched = (
                tuple(p for p in labels if p[0] in node.matching)
                if node.on
                else tuple(p for p in labels if p[0] not in node.matching and p[0] != "__name__")
            )
            raise QueryError(
                f"found duplicate series for the match group {_format_labels(matched)} on the {side} "
                f"hand-side of the operation: [{_format_labels(labels)}, {_format_labels(dup[0])}];"
                "many-to-many matching not allowed: matching labels must be unique on one side"
            )
        right[key] = (labels, v)
    matched_sigs: dict[Labels, set[Labels] | None] = {}
    out: Vec = []
    for labels, v in lhs:
        key = sig(labels)
        hit = right.get(key)
        if hit is None:
            continue
        vl, vr = (hit[1], v) if swapped else (v, hit[1])
        value, keep = _elem(node.op, vl, vr)
        if node.return_bool:
            value = 1.0 if keep else 0.0
        elif not keep:
            continue
        metric = _result_labels(node, labels, hit[0])
        if node.card == "one-to-one":
            if key in matched_sigs:
                raise QueryError(
                    "multiple matches for labels: "
                    "many-to-one matching must be explicit (group_left/group_right)"
                )
            matched_sigs[key] = None
        else:
            inserted = matched_sigs.get(key)
            if inserted is None:
                inserted = matched_sigs[key] = set()
            elif metric in inserted:
                raise QueryError("multiple matches for labels: grouping labels must ensure unique matches")
            inserted.add(metric)
        out.append((metric, value))
    return out
