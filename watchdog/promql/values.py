"""PromQL value types shared by the evaluator, the rule manager and the backends."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import WatchdogError
from ..store import Labels


class PromQLError(WatchdogError):
    """An expression could not be parsed or is not supported; `position` is a 0-based offset or None."""

    def __init__(self, message: str, position: int | None = None) -> None:
        self.message = message
        self.position = position
        where = f" at position {position}" if position is not None else ""
        super().__init__(f"{message}{where}")


class QueryError(WatchdogError):
    """Evaluating a valid expression failed (duplicate label sets, many-to-many matching, backend down)."""


class QueryTimeout(QueryError):
    """A query ran past its deadline and was abandoned."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of an instant vector; `t_ms` is the evaluation time in milliseconds."""

    labels: Labels
    value: float
    t_ms: int


class Vector(list[Sample]):
    """An instant vector."""


@dataclass(frozen=True, slots=True)
class RangeSeries:
    """The samples of one series inside a range: timestamps in ms and values, oldest first."""

    labels: Labels
    ts: Sequence[int]
    vals: Sequence[float]


class Matrix(list[RangeSeries]):
    """A range vector."""


@dataclass(frozen=True, slots=True)
class Scalar:
    """A scalar at an evaluation time."""

    value: float
    t_ms: int


@dataclass(frozen=True, slots=True)
class String:
    """A string literal."""

    value: str
    t_ms: int


Value = Vector | Matrix | Scalar | String

QueryFunc = Callable[[str, float], Vector]
"""How rules evaluate: (expression, evaluation time in unix seconds) -> instant vector.

A scalar result becomes one sample with no labels, as Prometheus' rule engine does. Raises QueryError
(or PromQLError) when the expression cannot be evaluated."""


def to_ms(t: float) -> int:
    """Unix seconds to integer milliseconds, the resolution Prometheus evaluates at."""
    return round(t * 1000)
