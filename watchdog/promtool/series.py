"""Prometheus' series notation for tests: `name{l="v"}` and expanding values like `1+2x3 _x2 stale`."""

from __future__ import annotations

import math
import re

from ..store import STALE_NAN, Labels

SeriesValues = list[float | None]
"""One entry per interval step; None is a missing sample (`_`)."""

_SPACE = " \t\n\r"
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"[0-9]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?")
_IDENT = re.compile(r"[A-Za-z0-9_:]+")
# The fractional part is one optional group after the digits: written `[0-9]+\.?[0-9]*`, the two digit runs
# could split a run of n digits n ways, and a long one that fails to match took seconds (20 kB: 52 s).
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
}


class NotationError(ValueError):
    """A series or value sequence does not follow the notation; `position` is a 0-based offset."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} (at character {position + 1})")
        self.message = message
        self.position = position


def _is_alnum(ch: str) -> bool:
    return ch == "_" or ("a" <= ch <= "z") or ("A" <= ch <= "Z") or ("0" <= ch <= "9")


def go_number(text: str) -> float:
    """A number as Prometheus' parser reads it: Go ParseInt with base 0 first, then ParseFloat."""
    if text.isdigit():
        # A leading zero means octal to Go's ParseInt; invalid octal falls through to decimal.
        if len(text) > 1 and text[0] == "0" and all(c in "01234567" for c in text):
            value = int(text, 8)
        else:
            value = int(text)
        if value < 2**63:
            return float(value)
    low = text.lower()
    if low in ("inf", "+inf"):
        return math.inf
    if low == "nan":
        return math.nan
    if not _DECIMAL.fullmatch(text):
        raise ValueError(f"error parsing number: invalid syntax: {text!r}")
    return float(text)


def unquote(text: str, pos: int = 0) -> tuple[str, int]:
    """Read a Go/PromQL quoted string ("...", '...' or `...`) at `pos`; return (value, end offset)."""
    quote = text[pos]
    end = pos + 1
    if quote == "`":
        close = text.find("`", end)
        if close < 0:
            raise NotationError("unterminated raw string", pos)
        return text[end:close], close + 1
    out: list[str] = []
    while end < len(text):
        ch = text[end]
        if ch == quote:
            return "".join(out), end + 1
        if ch == "\n":
            break
        if ch != "\\":
            out.append(ch)
            end += 1
            continue
        esc = text[end + 1 : end + 2]
        if esc in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[esc])
            end += 2
        elif esc == quote:
            out.append(quote)
            end += 2
        elif esc and esc in "xuU01234567":
            width, base, start = {"x": (2, 16, 2), "u": (4, 16, 2), "U": (8, 16, 2)}.get(esc, (3, 8, 1))
            digits = text[end + start : end + start + width]
            try:
                if len(digits) != width:
                    raise ValueError(digits)
                code = int(digits, base)
                out.append(chr(code))
            except ValueError:
                raise NotationError(f"invalid escape sequence \\{esc}", end) from None
            end += start + width
        else:
            raise NotationError(f"unknown escape sequence \\{esc}", end)
    raise NotationError("unterminated quoted string", pos)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _SPACE:
        pos += 1
    return pos


def parse_metric_prefix(text: str, pos: int = 0) -> tuple[dict[str, str], int]:
    """Read `name{label="value", ...}` (name and braces both optional) from `pos`; return labels and end."""
    labels: dict[str, str] = {}
    pos = _skip_space(text, pos)
    m = _NAME.match(text, pos)
    if m is not None:
        labels["__name__"] = m.group(0)
        pos = m.end()
    if pos < len(text) and text[pos] == "{":
        pos = _skip_space(text, pos + 1)
        while True:
            if pos < len(text) and text[pos] == "}":
                pos += 1
                break
            lm = _LABEL.match(text, pos)
            if lm is None:
                raise NotationError('unexpected character in label set, expected identifier or "}"', pos)
            pos = _skip_space(text, lm.end())
            if not text.startswith("=", pos) or text.startswith("=~", pos):
                raise NotationError('unexpected character in label set, expected "="', pos)
            pos = _skip_space(text, pos + 1)
            if pos >= len(text) or text[pos] not in "\"'`":
                raise NotationError("unexpected character in label set, expected string", pos)
            value, pos = unquote(text, pos)
            labels[lm.group(0)] = value
            pos = _skip_space(text, pos)
            if text.startswith(",", pos):
                pos = _skip_space(text, pos + 1)
            elif not text.startswith("}", pos):
                raise NotationError('unexpected character in label set, expected "," or "}"', pos)
    return labels, pos


def to_labels(labels: dict[str, str]) -> Labels:
    """Sorted Labels; empty values dropped as storage drops them."""
    return tuple(sorted((k, v) for k, v in labels.items() if v != ""))


def parse_metric(text: str) -> Labels:
    """Parse a whole metric in series notation, e.g. `up{job="x"}`; `{}` and "" are the empty set."""
    labels, pos = parse_metric_prefix(text)
    pos = _skip_space(text, pos)
    if pos != len(text):
        raise NotationError(f"unexpected {text[pos:]!r} after the metric", pos)
    return to_labels(labels)


def _tokens(text: str, base: int) -> list[tuple[str, str, int]]:
    """Lex a value sequence into (kind, text, position) with kinds SPACE + - x _ NUM ID."""
    out: list[tuple[str, str, int]] = []
    pos = 0
    while pos < len(text):
        ch = text[pos]
        if ch in _SPACE:
            end = _skip_space(text, pos)
            out.append(("SPACE", text[pos:end], base + pos))
            pos = end
        elif ch in "+-x_":
            out.append((ch, ch, base + pos))
            pos += 1
        elif ch.isdigit() or (ch == "." and text[pos + 1 : pos + 2].isdigit()):
            m = _NUMBER.match(text, pos)
            assert m is not None
            end = m.end()
            nxt = text[end : end + 1]
            if nxt and nxt != "x" and _is_alnum(nxt):
                raise NotationError(f"bad number syntax: {text[pos : end + 1]!r}", base + pos)
            out.append(("NUM", m.group(0), base + pos))
            pos = end
        elif ch.isalpha() and ch.isascii():
            m = _IDENT.match(text, pos)
            assert m is not None
            word = m.group(0)
            kind = "NUM" if word.lower() in ("inf", "nan") else "ID"
            out.append((kind, word, base + pos))
            pos = m.end()
        else:
            raise NotationError(f"unexpected character in series sequence: {ch!r}", base + pos)
    return out


def parse_values(text: str, base: int = 0) -> SeriesValues:
    """Expand a value sequence: `1 2`, `a+bxN`, `a-bxN`, `axN`, `_`, `_xN`, `stale`, Inf/NaN, 1e3."""
    toks = _tokens(text, base)
    toks.append(("EOF", "", base + len(text)))
    return _ValueParser(toks).values()


class _ValueParser:
    """The value sequence's tokens, read one item (a value, or a run of them) at a time."""

    def __init__(self, toks: list[tuple[str, str, int]]) -> None:
        self.toks = toks
        self.i = 0

    def values(self) -> SeriesValues:
        """Every item's values, in order."""
        toks, values = self.toks, []
        after_space = True  # promtool writes a space between the metric and its values
        while toks[self.i][0] != "EOF":
            if toks[self.i][0] == "SPACE":
                self.i += 1
                after_space = True
                continue
            if not after_space:
                tok = toks[self.i]
                raise NotationError(f"unexpected {tok[1]!r} in series values, expected space", tok[2])
            after_space = False
            values.extend(self.item())
        return values

    def item(self) -> SeriesValues:
        """One item: `_`, `_xN`, a value, `axN` or `a+bxN` (a being a number or `stale`)."""
        if self.toks[self.i][0] == "_":
            self.i += 1
            return [None] * self.count() if self.skip("x") else [None]
        start = self.stale() if self.toks[self.i][0] == "ID" else self.number()
        if self.skip("x"):
            return [start] * (self.count() + 1)
        if self.toks[self.i][0] not in "+-":
            return [start]
        step = self.number()
        self.expect("x", "'x'")
        values: SeriesValues = []
        value = start
        for _ in range(self.count() + 1):
            values.append(value)
            value += step  # repeated addition, as Prometheus does (rounding accumulates)
        return values

    def skip(self, kind: str) -> bool:
        """Whether the next token is `kind`; if so, past it."""
        if self.toks[self.i][0] != kind:
            return False
        self.i += 1
        return True

    def expect(self, kind: str, what: str) -> tuple[str, str, int]:
        """The next token, which must be `kind` (NotationError naming `what` otherwise)."""
        tok = self.toks[self.i]
        if tok[0] != kind:
            shown = "end of input" if tok[0] == "EOF" else repr(tok[1])
            raise NotationError(f"unexpected {shown} in series values, expected {what}", tok[2])
        self.i += 1
        return tok

    def count(self) -> int:
        """A repetition count."""
        tok = self.expect("NUM", "repetition count")
        if not tok[1].isdigit():
            raise NotationError(f"invalid repetition in series values: {tok[1]!r}", tok[2])
        return int(tok[1])

    def stale(self) -> float:
        """`stale`, as the staleness marker."""
        tok = self.expect("ID", "number or 'stale'")
        if tok[1] != "stale":
            raise NotationError(f"unexpected {tok[1]!r} in series values, expected number or 'stale'", tok[2])
        return STALE_NAN

    def number(self) -> float:
        """A number, with an optional sign token before it."""
        tok = self.toks[self.i]
        sign = 1.0
        if tok[0] in "+-":
            sign = -1.0 if tok[0] == "-" else 1.0
            self.expect(tok[0], "sign")
        tok = self.expect("NUM", "number")
        try:
            return sign * go_number(tok[1])
        except ValueError as exc:
            raise NotationError(str(exc), tok[2]) from None


def parse_series(series: str, values: str) -> tuple[Labels, SeriesValues]:
    """Parse an input series: its metric and its expanded values."""
    labels, pos = parse_metric_prefix(series)
    if _skip_space(series, pos) != len(series):
        raise NotationError(f"unexpected {series[pos:].strip()!r} after the metric", pos)
    if not labels:
        raise NotationError("a series needs a metric name or labels", 0)
    return to_labels(labels), parse_values(values)
