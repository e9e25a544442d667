"""Go's fmt printing (Sprint, Sprintln, Sprintf, %v of every template value) and promtool's label sets."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..formats.gostrconv import format_float, go_quote
from ..store import Labels
from .govalues import AlertData, GoTime, go_type

_TOO_LARGE = 1_000_000  # fmt rejects widths and precisions beyond this (%!(BADWIDTH))


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
        flags, verb = m.group(1), m.group(4)
        i = m.end()
        p = Printer(
            verb=verb,
            minus="-" in flags,
            plus="+" in flags,
            sharp="#" in flags,
            space=" " in flags,
            zero="0" in flags and "-" not in flags,
        )
        bad, argi = _sizes(p, m, args, argi)
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


def _sizes(p: Printer, m: re.Match[str], args: list[object], argi: int) -> tuple[str, int]:
    """Set a directive's width and precision on `p` (`*` takes each from the next argument); returns the
    %!(BADWIDTH) or %!(BADPREC) to print, and the index of the next argument."""
    flags, width, prec, _ = m.groups()
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
    return bad, argi
