"""Go's durations as text: Prometheus' model.Duration and time.Duration (RFC 3339 times: formats/rfc3339)."""

from __future__ import annotations

from decimal import Decimal

_MODEL_UNITS = (
    ("y", 365 * 86400_000, True),
    ("w", 7 * 86400_000, True),
    ("d", 86400_000, False),
    ("h", 3600_000, False),
    ("m", 60_000, False),
    ("s", 1000, False),
    ("ms", 1, False),
)


def model_duration(seconds: float) -> str:
    """Prometheus model.Duration.String(): `1h30m`, `90d`, `1w`, `0s` (years and weeks only if exact)."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    out = []
    for unit, size, exact in _MODEL_UNITS:
        if exact and ms % size:
            continue
        if ms >= size:
            out.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(out)


def _trim(value: Decimal) -> str:
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def time_duration(seconds: float) -> str:
    """Go time.Duration.String(): `5m0s`, `1h0m0s`, `1.5s`, `500ms`, `0s`."""
    ns = round(seconds * 1_000_000_000)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return f"{sign}{_trim(Decimal(ns) / size)}{unit}"
    hours, rest = divmod(ns, 3600 * 1_000_000_000)
    minutes, rest = divmod(rest, 60 * 1_000_000_000)
    secs = _trim(Decimal(rest) / 1_000_000_000)
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{sign}{minutes}m{secs}s"
    return f"{sign}{secs}s"
