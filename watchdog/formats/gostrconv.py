"""Go's strconv, the one home of its formats: float64 formatting (FormatFloat as fmt uses it), parsing
(ParseFloat, for template values, histogram `le` labels and Prometheus' API sample values), and quoting."""

from __future__ import annotations

import math
import re


def _shortest_digits(v: float) -> tuple[str, int]:
    """Shortest round-trip decimal digits of abs(v) and the decimal point position (0.DIGITS x 10^dp)."""
    mant, _, exp = repr(abs(v)).partition("e")
    ip, _, fp = mant.partition(".")
    digits, dp = ip + fp, len(ip) + int(exp or 0)
    stripped = digits.lstrip("0")
    dp -= len(digits) - len(stripped)
    return stripped.rstrip("0"), dp


def _exp_form(digits: str, dp: int, upper: bool) -> str:
    exp = dp - 1
    mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{mant}{'E' if upper else 'e'}{'-' if exp < 0 else '+'}{abs(exp):02d}"


def _fixed_form(digits: str, dp: int) -> str:
    if dp <= 0:
        return "0." + "0" * -dp + digits
    if dp >= len(digits):
        return digits + "0" * (dp - len(digits))
    return digits[:dp] + "." + digits[dp:]


def _hex_float(a: float, upper: bool) -> str:
    """Shortest %x of a non-negative float64: 0x1.8p+01."""
    if a == 0:
        body = "0x0p+00"
    else:
        mant, _, exp = a.hex().partition("p")
        ip, _, fp = mant[2:].partition(".")
        fp = fp.rstrip("0")
        e = int(exp)
        body = f"0x{ip}" + (f".{fp}" if fp else "") + f"p{'-' if e < 0 else '+'}{abs(e):02d}"
    return body.upper() if upper else body


def format_float(v: float, verb: str = "v", prec: int = -1, sharp: bool = False) -> str:
    """strconv.FormatFloat as fmt uses it; NaN, +Inf and -Inf keep their sign spelling ('+Inf')."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, v) < 0 else ""
    a = abs(v)
    if verb in "xX":
        return sign + _hex_float(a, verb == "X")  # precision is ignored for %x of floats
    if verb in "vgG" and prec < 0:
        digits, dp = _shortest_digits(a)
        if not digits:
            return sign + "0"
        exp = dp - 1
        if exp < -4 or exp >= 6:  # Go's shortest %g/%v threshold: 1e+06, not 1000000
            return sign + _exp_form(digits, dp, verb == "G")
        return sign + _fixed_form(digits, dp)
    if verb in "eE" and prec < 0:
        digits, dp = _shortest_digits(a)
        return sign + _exp_form(digits or "0", dp if digits else 1, verb == "E")
    if verb in "fF" and prec < 0:
        digits, dp = _shortest_digits(a)
        return sign + (_fixed_form(digits, dp) if digits else "0")
    spec = {"v": "g", "F": "f"}.get(verb, verb)
    return sign + format(a, ("#" if sharp else "") + f".{prec}{spec}")


def go_number(value: float) -> float | int:
    """A whole float as an int, so JSON shows it as Go's encoder does (60, not 60.0)."""
    return int(value) if value.is_integer() else value


_QUOTE_ESC = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(s: str, ascii_only: bool = False) -> str:
    """strconv.Quote (or QuoteToASCII)."""
    out = ['"']
    for ch in s:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch in _QUOTE_ESC:
            out.append(_QUOTE_ESC[ch])
        elif (ch == " " or ch.isprintable()) and not (ascii_only and ord(ch) > 0x7E):
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


_DEC = re.compile(r"[+-]?(?:[0-9_]+(?:\.[0-9_]*)?|\.[0-9_]+)(?:[eE][+-]?[0-9_]+)?")
_HEX = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F_]+(?:\.[0-9a-fA-F_]*)?|\.[0-9a-fA-F_]+)[pP][+-]?[0-9_]+")


def _underscores_ok(s: str) -> bool:
    saw, hexa = "^", False
    s = s[1:] if s[:1] in "+-" else s
    i = 0
    if len(s) >= 2 and s[0] == "0" and s[1] in "bBoOxX":
        i, saw, hexa = 2, "0", s[1] in "xX"
    for c in s[i:]:
        if c.isdigit() or (hexa and c in "abcdefABCDEF"):
            saw = "0"
        elif c == "_":
            if saw != "0":
                return False
            saw = "_"
        elif saw == "_":
            return False
        else:
            saw = "!"
    return saw != "_"


def parse_float(s: str, *, underscores: bool = True) -> float:
    """strconv.ParseFloat(s, 64); ValueError carries Go's message. Go reads `1_000` (underscores between
    digits); `underscores=False` refuses any, as histogram_quantile here has always read `le`."""
    syntax = ValueError(f"strconv.ParseFloat: parsing {go_quote(s)}: invalid syntax")
    low = s.lower()
    if low == "nan":
        return math.nan
    if (low[1:] if low[:1] in "+-" else low) in ("inf", "infinity"):
        return -math.inf if low[0] == "-" else math.inf
    if "_" in s and not (underscores and _underscores_ok(s)):
        raise syntax
    if not (_DEC.fullmatch(s) or _HEX.fullmatch(s)):
        raise syntax
    clean = s.replace("_", "")
    if not any(c.isdigit() for c in clean.split("e")[0].split("E")[0].split("p")[0].split("P")[0]):
        raise syntax
    try:
        v = float.fromhex(clean) if "x" in clean.lower() else float(clean)
    except OverflowError:
        v = math.inf
    if math.isinf(v):
        raise ValueError(f"strconv.ParseFloat: parsing {go_quote(s)}: value out of range")
    return v
