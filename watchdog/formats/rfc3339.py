"""RFC 3339 times as Go writes and reads them: time.Time in JSON, go-openapi's strfmt.DateTime, Prometheus'
API times, Docker's timestamps. The one home of both directions; each caller names the edge rules it needs."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import Literal

ZERO = "0001-01-01T00:00:00Z"  # Go's zero time.Time

MILLISECONDS = 1_000
MICROSECONDS = 1_000_000

_EPOCH = date(1970, 1, 1)
_EPOCH_TIME = datetime(1970, 1, 1, tzinfo=UTC)
_FRACTION = re.compile(r"(.*?)\.([0-9]+)(.*)", re.DOTALL)

NoZone = Literal["reject", "utc", "local"]


def format_rfc3339(ticks: int | None, per_second: int = MILLISECONDS, *, fixed: bool = False) -> str:
    """`ticks` (1/per_second seconds since the epoch) in UTC with 'Z'. The fraction loses its trailing zeros
    (Go's time.RFC3339Nano, time.Time in JSON) or, `fixed`, keeps every digit of the unit (strfmt.DateTime's
    `.000`). None is Go's zero time, in the same shape."""
    width = len(str(per_second)) - 1
    if ticks is None:
        return ZERO[:-1] + ("." + "0" * width if fixed and width else "") + "Z"
    seconds, part = divmod(ticks, per_second)
    days, rest = divmod(seconds, 86400)
    day = _EPOCH + timedelta(days=days)
    frac = f".{part:0{width}d}" if width else ""
    if not fixed:
        frac = frac.rstrip("0").rstrip(".")
    return f"{day.isoformat()}T{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}{frac}Z"


def millis(seconds: float) -> int:
    """Unix seconds as whole milliseconds, rounded to the nearest."""
    return round(seconds * 1000)


def micros(seconds: float) -> int:
    """Unix seconds as whole microseconds, rounded as datetime.fromtimestamp rounds them."""
    return (datetime.fromtimestamp(seconds, UTC) - _EPOCH_TIME) // timedelta(microseconds=1)


def parse_rfc3339(
    text: str,
    *,
    no_zone: NoZone = "reject",
    lowercase_z: bool = False,
    require_t: bool = False,
    unix_seconds: bool = False,
    nanoseconds: bool = False,
) -> float:
    """Unix seconds of an RFC 3339 time, read as Python's datetime.fromisoformat reads ISO 8601; ValueError
    if it is none. The edge rules: what a time without a zone is (`no_zone`: refused, UTC, or the machine's
    zone), whether 'z' stands for 'Z', whether the 'T' between date and time is required (Go's layout; Python
    also reads ' ' and a date alone), whether a number is unix seconds (Prometheus' API times), and whether
    digits past the microsecond count (Docker's nanoseconds; Python keeps six)."""
    if unix_seconds:
        try:
            return float(text)
        except ValueError:
            pass
    if lowercase_z:
        text = text.replace("z", "Z")
    if require_t and "T" not in text:
        raise ValueError(f"not an RFC 3339 time (no 'T'): {text!r}")
    extra = 0.0
    if nanoseconds and (found := _FRACTION.fullmatch(text)) is not None:
        head, digits, zone = found.groups()
        text, extra = head + zone, float("0." + digits[:9])
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        if no_zone == "reject":
            raise ValueError(f"not an RFC 3339 time (no zone): {text!r}")
        if no_zone == "utc":
            when = when.replace(tzinfo=UTC)
    return when.timestamp() + extra
