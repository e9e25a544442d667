"""Prometheus' template functions (v2.42): humanize*, toTime, title, match, stripPort, args, graphLink, ..."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable
from urllib.parse import quote_plus

from ..config.durations import parse_duration
from ..formats.gostrconv import format_float, go_quote, parse_float
from ..goregex import RegexError, compile_go
from .builtins import A, Func, FuncError, S
from .govalues import HTML, ArgsMap, GoTime, go_type


def to_float(v: object) -> float:
    """Prometheus' convertToFloat: float64, ints and strings (strconv.ParseFloat)."""
    if isinstance(v, float):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str) and not isinstance(v, HTML):
        try:
            return parse_float(v)
        except ValueError as e:
            raise FuncError(str(e)) from None
    raise FuncError(f"can't convert {go_type(v)} to float")


def _g4(v: float) -> str:
    return format_float(v, "g", 4)


def _scaled(v: float, prefixes: str, step: float, up: bool) -> str:
    prefix = ""
    for p in prefixes.split():
        if (abs(v) < step) if up else (abs(v) >= 1):
            break
        prefix = p
        v = v / step if up else v * step
    return _g4(v) + prefix


def humanize(x: object) -> str:
    """1234567 → 1.235M; 0.00123 → 1.23m."""
    v = to_float(x)
    if v == 0 or math.isnan(v) or math.isinf(v):
        return _g4(v)
    if abs(v) >= 1:
        return _scaled(v, "k M G T P E Z Y", 1000.0, True)
    return _scaled(v, "m u n p f a z y", 1000.0, False)


def humanize1024(x: object) -> str:
    """1048576 → 1Mi."""
    v = to_float(x)
    if abs(v) <= 1 or math.isnan(v) or math.isinf(v):
        return _g4(v)
    return _scaled(v, "ki Mi Gi Ti Pi Ei Zi Yi", 1024.0, True)


def humanize_duration(x: object) -> str:
    """90 → 1m 30s; 0.25 → 250ms."""
    v = to_float(x)
    if math.isnan(v) or math.isinf(v):
        return _g4(v)
    if v == 0:
        return _g4(v) + "s"
    if abs(v) < 1:
        return _scaled(v, "m u n p f a z y", 1000.0, False) + "s"
    sign = "-" if v < 0 else ""
    v = abs(v)
    d = int(v) if v < 2**63 else -(2**63)  # Go's int64(v); out of range gives MinInt64 on amd64

    def div(a: int, b: int) -> int:  # Go's truncating division
        return -(-a // b) if a < 0 else a // b

    seconds, minutes = d - 60 * div(d, 60), div(d, 60) - 60 * div(div(d, 60), 60)
    hours, days = div(d, 3600) - 24 * div(div(d, 3600), 24), div(d, 86400)
    if days:
        return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
    if hours:
        return f"{sign}{hours}h {minutes}m {seconds}s"
    if minutes:
        return f"{sign}{minutes}m {seconds}s"
    return f"{sign}{_g4(v)}s"


def to_time(x: object) -> GoTime:
    """Seconds since the epoch to a UTC time with millisecond precision, as model.Time keeps it."""
    v = to_float(x)
    if math.isnan(v) or math.isinf(v):
        raise FuncError("value is NaN or Inf")
    ns = v * 1e9
    if ns > 2.0**63 or ns < -(2.0**63):
        raise FuncError(
            f"{format_float(v)} cannot be represented as a nanoseconds timestamp since it overflows int64"
        )
    n = int(ns)
    return GoTime(n // 1_000_000 if n >= 0 else -(-n // 1_000_000))


def humanize_timestamp(x: object) -> str:
    """1234567890 → 2009-02-13 23:31:30 +0000 UTC."""
    v = to_float(x)
    if math.isnan(v) or math.isinf(v):
        return _g4(v)
    return str(to_time(v))


def _is_separator(r: str) -> bool:
    if r <= "\x7f":
        return not (r.isalnum() or r == "_")
    if r.isalpha() or r.isdigit():
        return False
    return r.isspace()


def _title(s: str) -> str:
    """strings.Title: upper-case the first letter of each word, leave the rest alone."""
    out, prev = [], " "
    for ch in s:
        t = ch.title() if _is_separator(prev) else ch
        out.append(t if len(t) == 1 else ch)
        prev = ch
    return "".join(out)


def _case(s: str, upper: bool) -> str:
    out = []
    for ch in s:
        t = ch.upper() if upper else ch.lower()
        out.append(t if len(t) == 1 else ch)
    return "".join(out)


def split_host_port(hp: str) -> tuple[str, str] | None:
    """net.SplitHostPort; None where Go returns an error."""
    i = hp.rfind(":")
    if i < 0:
        return None
    j = k = 0
    if hp.startswith("["):
        end = hp.find("]")
        if end < 0 or end + 1 != i:
            return None
        host, j, k = hp[1:end], 1, end + 1
    else:
        host = hp[:i]
        if ":" in host:
            return None
    if "[" in hp[j:] or "]" in hp[k:]:
        return None
    return host, hp[i + 1 :]


def _is_ip(host: str) -> bool:
    if "%" in host:
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def strip_port(hp: str) -> str:
    """host:port → host; anything SplitHostPort rejects is returned as is."""
    split = split_host_port(hp)
    return hp if split is None else split[0]


def strip_domain(hp: str) -> str:
    """host.example.com:9100 → host:9100; IP addresses are left alone."""
    split = split_host_port(hp)
    host, port = (hp, "") if split is None else split
    if _is_ip(host):
        return hp
    host = host.split(".")[0]
    if port:
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return host


def _match(pattern: str, text: str) -> bool:
    """regexp.MatchString: an unanchored search."""
    try:
        return compile_go(pattern).match_string(text)
    except RegexError as e:
        raise FuncError(str(e)) from None


def _re_replace_all(pattern: str, repl: str, text: str) -> str:
    """regexp.MustCompile(pattern).ReplaceAllString(text, repl)."""
    try:
        return compile_go(pattern).replace_all_string(text, repl)
    except RegexError as e:
        raise FuncError(str(e)) from None


def _parse_duration(d: str) -> float:
    if d == "":
        raise FuncError("empty duration string")
    try:
        return parse_duration(d)
    except ValueError:
        raise FuncError(f"not a valid duration string: {go_quote(d)}") from None


def _graph_link(tab: int) -> Callable[[str], str]:
    return lambda expr: f"/graph?g0.expr={quote_plus(expr, safe='')}&g0.tab={tab}"


PROMETHEUS: dict[str, Func] = {
    "humanize": Func((A,), humanize),
    "humanize1024": Func((A,), humanize1024),
    "humanizeDuration": Func((A,), humanize_duration),
    "humanizePercentage": Func((A,), lambda x: _g4(to_float(x) * 100) + "%"),
    "humanizeTimestamp": Func((A,), humanize_timestamp),
    "toTime": Func((A,), to_time),
    "toUpper": Func((S,), lambda s: _case(s, True)),
    "toLower": Func((S,), lambda s: _case(s, False)),
    "title": Func((S,), _title),
    "reReplaceAll": Func((S, S, S), _re_replace_all),
    "match": Func((S, S), _match),
    "stripPort": Func((S,), strip_port),
    "stripDomain": Func((S,), strip_domain),
    "safeHtml": Func((S,), HTML),
    "args": Func((), lambda *a: ArgsMap({f"arg{i}": v for i, v in enumerate(a)}), A),
    "graphLink": Func((S,), _graph_link(0)),
    "tableLink": Func((S,), _graph_link(1)),
    "parseDuration": Func((S,), _parse_duration),
}
