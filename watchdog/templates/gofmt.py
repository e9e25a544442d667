"""Go's text renderings: values as templates see them, fmt printing (Sprint, Sprintf, %v of float64),
strconv quoting and floats, and the label sets, durations and times that promtool and the API print."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

from ..store import Labels

_TOO_LARGE = 1_000_000  # fmt rejects widths and precisions beyond this (%!(BADWIDTH))


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


# ---- floats -------------------------------------------------------------------------------------------


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


# ---- printing values ----------------------------------------------------------------------------------


def _map_body(items: list[tuple[str, object]], verb: str) -> str:
    return "map[" + " ".join(f"{fmt_value(k, verb)}:{fmt_value(v, verb)}" for k, v in items) + "]"


def fmt_value(v: object, verb: str = "v") -> str:
    """One operand printed with a verb and no flags; bad combinations print as Go does (%!d(string=x))."""
    return Printer(verb=verb).arg(v)


def sprint(args: list[object]) -> str:
    """fmt.Sprint: a space between operands when neither is a string."""
    out: list[str] = []
    for i, a in enumerate(args):
        if i > 0 and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out.append(" ")
        out.append(fmt_value(a))
    return "".join(out)


def sprintln(args: list[object]) -> str:
    """fmt.Sprintln: operands separated by spaces, then a newline."""
    return " ".join(fmt_value(a) for a in args) + "\n"


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


def go_labels(labels: Labels) -> str:
    """labels.Labels.String(): `{a="1", b="2"}` with the name shown as `__name__`."""
    return "{" + ", ".join(f"{k}={go_quote(v)}" for k, v in labels) + "}"


def indent_lines(text: str, indent: str) -> str:
    """Prefix every line but the first with `indent`, as promtool's indentLines does."""
    return ("\n" + indent).join(text.split("\n"))


@dataclass
class Printer:
    """One fmt directive: verb, flags, width and precision."""

    verb: str = "v"
    minus: bool = False
    plus: bool = False
    sharp: bool = False
    space: bool = False
    zero: bool = False
    width: int = -1
    prec: int = -1

    def pad(self, s: str, numeric_sign: bool = False) -> str:
        """Pad to width; zero padding goes after a sign for numbers."""
        n = self.width - len(s)
        if n <= 0:
            return s
        if self.minus:
            return s + " " * n
        if self.zero:
            if numeric_sign and s[:1] in "+- ":
                return s[0] + "0" * n + s[1:]
            return "0" * n + s
        return " " * n + s

    def bad(self, v: object) -> str:
        """%!verb(type=value) for an operand the verb does not fit."""
        if v is None:
            return f"%!{self.verb}(<nil>)"
        return f"%!{self.verb}({go_type(v)}={fmt_value(v)})"

    def arg(self, v: object) -> str:
        """Format one operand."""
        verb = self.verb
        if v is None:
            return self.pad("<nil>") if verb == "v" else self.bad(v)
        if isinstance(v, GoTime):
            return self.string(str(v)) if verb in "vsqxX" else self.bad(v)
        if isinstance(v, str):
            return self.string(v) if verb in "vsqxX" else self.bad(v)
        if isinstance(v, bool):
            return self.pad("true" if v else "false") if verb in "vt" else self.bad(v)
        if isinstance(v, int):
            return self.integer(v) if verb in "vdboOxXcqU" else self.bad(v)
        if isinstance(v, float):
            return self.floating(v) if verb in "vbeEfFgGxX" else self.bad(v)
        if isinstance(v, dict):
            if self.sharp and verb == "v":
                return self.pad(
                    go_type(v)
                    + "{"
                    + ", ".join(f"{go_quote(k)}:{fmt_value(x)}" for k, x in sorted(v.items()))
                    + "}"
                )
            return self.pad(_map_body(sorted(v.items()), verb))
        if isinstance(v, AlertData):
            parts = [v.Labels, v.ExternalLabels, v.ExternalURL, v.Value]
            return self.pad("{" + " ".join(fmt_value(p, verb) for p in parts) + "}")
        return self.bad(v)

    def string(self, s: str) -> str:
        """%s %q %x %X %v of a string."""
        if self.prec >= 0:
            s = s[: self.prec]
        if self.verb == "q" or (self.verb == "v" and self.sharp):
            if (
                self.sharp
                and "`" not in s
                and all(c == "\t" or c.isprintable() for c in s)
                and self.verb == "q"
            ):
                return self.pad("`" + s + "`")
            return self.pad(go_quote(s, ascii_only=self.plus))
        if self.verb in "xX":
            data = s.encode("utf-8", "surrogateescape")
            sep = " " if self.space else ""
            pre = ("0X" if self.verb == "X" else "0x") if self.sharp else ""
            hexes = [pre + f"{b:02x}" for b in data] if sep else [f"{b:02x}" for b in data]
            text = sep.join(hexes) if sep else (pre + "".join(hexes) if data else "")
            return self.pad(text.upper() if self.verb == "X" else text)
        return self.pad(s)

    def integer(self, n: int) -> str:
        """%d %b %o %O %x %X %c %q %U %v of an int."""
        verb = self.verb
        if verb == "c":
            return self.pad(chr(n) if 0 <= n <= 0x10FFFF else "\ufffd")
        if verb == "q":
            return self.pad(
                "'" + go_quote(chr(n) if 0 <= n <= 0x10FFFF else "\ufffd")[1:-1].replace('\\"', '"') + "'"
            )
        if verb == "U":
            return self.pad(f"U+{n:04X}")
        base = {"b": 2, "o": 8, "O": 8, "x": 16, "X": 16}.get(verb, 10)
        digits = {2: f"{abs(n):b}", 8: f"{abs(n):o}", 16: f"{abs(n):x}", 10: str(abs(n))}[base]
        if verb == "X":
            digits = digits.upper()
        prec = self.prec
        if prec < 0 and self.zero and self.width > 0 and not self.minus:
            prec = self.width - (1 if n < 0 or self.plus or self.space else 0)
        if prec == 0 and n == 0:
            digits = ""
        digits = digits.rjust(prec, "0") if prec > 0 else digits
        prefix = ""
        if self.sharp or verb == "O":
            prefix = {
                2: "0b",
                8: "0o" if verb == "O" else ("0" if not digits.startswith("0") else ""),
                16: "0X" if verb == "X" else "0x",
                10: "",
            }[base]
        sign = "-" if n < 0 else "+" if self.plus else " " if self.space else ""
        return Printer(minus=self.minus, width=self.width).pad(sign + prefix + digits)

    def floating(self, v: float) -> str:
        """%e %f %g %x %v of a float64."""
        verb = "g" if self.verb == "v" else self.verb
        prec = self.prec if self.prec >= 0 else (6 if verb in "eEfF" else -1)
        if verb == "b":
            return self.bad(v)
        body = format_float(v, verb, prec, self.sharp)
        if self.sharp and verb in "gG" and prec < 0:  # '#' keeps 6 significant digits, zeros included
            mant, e, exp = body.partition("e" if verb == "g" else "E")
            mant = mant if "." in mant else mant + "."
            have = len(mant.lstrip("-").replace(".", "").lstrip("0")) or 1
            body = mant + "0" * max(0, 6 - have) + e + exp
        if body[0] not in "+-":
            body = ("+" if self.plus else " " if self.space else "") + body
        elif body == "+Inf" and not self.plus:
            body = " Inf" if self.space else "+Inf"
        if body[-3:] in ("Inf", "NaN"):
            return Printer(minus=self.minus, width=self.width).pad(body)
        return self.pad(body, numeric_sign=True)


_DIRECTIVE = re.compile(r"%([-+# 0]*)(\*|\d+)?(?:\.(\*|\d+)?)?(.?)", re.S)


def sprintf(fmt: str, args: list[object]) -> str:
    """fmt.Sprintf with Go's error spellings (%!d(MISSING), %!(EXTRA ...), %!(NOVERB))."""
    out: list[str] = []
    i = argi = 0
    while i < len(fmt):
        j = fmt.find("%", i)
        if j < 0:
            out.append(fmt[i:])
            break
        out.append(fmt[i:j])
        m = _DIRECTIVE.match(fmt, j)
        assert m is not None
        flags, width, prec, verb = m.groups()
        i = m.end()
        p = Printer(
            verb=verb,
            minus="-" in flags,
            plus="+" in flags,
            sharp="#" in flags,
            space=" " in flags,
            zero="0" in flags and "-" not in flags,
        )
        bad = ""
        for which, spec in (("width", width), ("prec", prec)):
            if spec is None:
                if which == "prec" and m.group(0)[len(flags) + 1 + len(width or "") :].startswith("."):
                    p.prec = 0
                continue
            if spec == "*":
                n = args[argi] if argi < len(args) else None
                argi += 1
                if not isinstance(n, int) or isinstance(n, bool) or abs(n) > _TOO_LARGE:
                    bad += "%!(BADWIDTH)" if which == "width" else "%!(BADPREC)"
                    continue
                if which == "width":
                    p.width, p.minus = (abs(n), p.minus or n < 0)
                    p.zero = p.zero and not p.minus
                else:
                    p.prec = n if n >= 0 else -1
            elif int(spec) > _TOO_LARGE:
                bad += "%!(BADWIDTH)" if which == "width" else "%!(BADPREC)"
            elif which == "width":
                p.width = int(spec)
            else:
                p.prec = int(spec)
        out.append(bad)
        if verb == "":
            out.append("%!(NOVERB)")
        elif verb == "%":
            out.append("%")
        elif verb == "T" and argi < len(args):
            out.append(p.pad(go_type(args[argi])))
            argi += 1
        elif argi >= len(args):
            out.append(f"%!{verb}(MISSING)")
        else:
            out.append(p.arg(args[argi]))
            argi += 1
    if argi < len(args):
        extra = ", ".join("<nil>" if a is None else f"{go_type(a)}={fmt_value(a)}" for a in args[argi:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


# ---- durations and times ------------------------------------------------------------------------------

_MODEL_UNITS = (
    ("y", 365 * 86400_000, True),
    ("w", 7 * 86400_000, True),
    ("d", 86400_000, False),
    ("h", 3600_000, False),
    ("m", 60_000, False),
    ("s", 1000, False),
    ("ms", 1, False),
)
_EPOCH = date(1970, 1, 1)


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


def rfc3339(ms: int | None) -> str:
    """A time as Go marshals time.Time to JSON (RFC 3339, UTC); None is Go's zero time."""
    if ms is None:
        return "0001-01-01T00:00:00Z"
    seconds, millis = divmod(ms, 1000)
    days, rest = divmod(seconds, 86400)
    day = _EPOCH + timedelta(days=days)
    frac = f".{millis:03d}".rstrip("0") if millis else ""
    return f"{day.isoformat()}T{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}{frac}Z"


# ---- strconv.ParseFloat ---------------------------------------------------------------------------------

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


def parse_float(s: str) -> float:
    """strconv.ParseFloat(s, 64); ValueError carries Go's message."""
    syntax = ValueError(f"strconv.ParseFloat: parsing {go_quote(s)}: invalid syntax")
    low = s.lower()
    if low == "nan":
        return math.nan
    if (low[1:] if low[:1] in "+-" else low) in ("inf", "infinity"):
        return -math.inf if low[0] == "-" else math.inf
    if not (_DEC.fullmatch(s) or _HEX.fullmatch(s)) or ("_" in s and not _underscores_ok(s)):
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
