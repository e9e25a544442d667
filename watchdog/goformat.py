"""Go's text renderings that promtool prints: quoted strings, label sets, %E floats, durations."""

from __future__ import annotations

import math
from decimal import Decimal

from .store import Labels

_ESCAPES = {"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r", "\t": r"\t", "\v": r"\v"}


def go_quote(text: str) -> str:
    """strconv.Quote: a double-quoted string with Go escapes."""
    out = ['"']
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def go_labels(labels: Labels) -> str:
    """labels.Labels.String(): `{a="1", b="2"}` with the name shown as `__name__`."""
    return "{" + ", ".join(f"{k}={go_quote(v)}" for k, v in labels) + "}"


def go_float(value: float, letter: str = "E") -> str:
    """strconv.FormatFloat(v, 'E' or 'e', -1, 64): shortest digits in exponent form, e.g. 1.5E+00."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return f"{sign}0{letter}+00"
    digits_tuple = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, digits_tuple.digits))
    assert isinstance(digits_tuple.exponent, int)
    exp = digits_tuple.exponent + len(digits) - 1
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}{letter}{'-' if exp < 0 else '+'}{abs(exp):02d}"


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


def indent_lines(text: str, indent: str) -> str:
    """Prefix every line but the first with `indent`, as promtool's indentLines does."""
    return ("\n" + indent).join(text.split("\n"))
