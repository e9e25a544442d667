"""Values as Go templates see them: the types Prometheus hands to alert templates and their Go type names."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone


class HTML(str):
    """html/template.HTML: a string type that is not assignable to string."""


class ArgsMap(dict[str, object]):
    """map[string]interface{} made by `args`; a missing key reads as nil."""


@dataclass(frozen=True)
class AlertData:
    """The struct Prometheus passes as dot to alert templates."""

    Labels: dict[str, str]
    ExternalLabels: dict[str, str]
    ExternalURL: str
    Value: float


@dataclass(frozen=True)
class GoTime:
    """A *time.Time in UTC with millisecond precision, as toTime returns."""

    ms: int

    def __str__(self) -> str:
        sec, milli = divmod(self.ms, 1000)
        t = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=sec)
        frac = f".{milli:03d}".rstrip("0") if milli else ""
        return f"{t:%Y-%m-%d %H:%M:%S}{frac} +0000 UTC"


def go_type(v: object) -> str:
    """The Go type name of a template value, as %T prints it."""
    if isinstance(v, HTML):
        return "template.HTML"
    if isinstance(v, str):
        return "string"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float64"
    if isinstance(v, ArgsMap):
        return "map[string]interface {}"
    if isinstance(v, dict):
        return "map[string]string"
    if isinstance(v, AlertData):
        return (
            "struct { Labels map[string]string; ExternalLabels map[string]string;"
            " ExternalURL string; Value float64 }"
        )
    if isinstance(v, GoTime):
        return "*time.Time"
    return "<nil>"
