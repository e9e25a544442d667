"""The function map: text/template's built-ins and Prometheus' template functions (v2.42)."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote_plus, urlsplit

from ..config.durations import parse_duration
from ..goregex import RegexError, compile_go
from .gofmt import sprint, sprintf, sprintln
from .gostrconv import format_float, go_quote, parse_float
from .govalues import HTML, AlertData, ArgsMap, GoTime, go_type


class FuncError(ValueError):
    """A function returned an error; the executor reports it as 'error calling NAME: ...'."""


@dataclass(frozen=True)
class Func:
    """A callable with Go parameter kinds: 'string' (exactly string) or 'any' (interface{})."""

    params: tuple[str, ...]
    impl: Callable[..., object]
    variadic: str | None = None


UNSUPPORTED = {
    name: "it needs a PromQL query at render time, which alert templates here do not run"
    for name in ("query", "first", "label", "value", "strvalue", "sortByLabel")
}


def truth(v: object) -> bool:
    """Go template truth: false for zero values, empty strings and maps, and nil."""
    if v is None:
        return False
    if isinstance(v, (str, dict)):
        return len(v) > 0
    if isinstance(v, (bool, int, float)):
        return v != 0  # NaN != 0, so NaN is true, as in Go
    return True


def _kind(v: object) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    return "invalid"


def _eq(a: object, *rest: object) -> bool:
    if not rest:
        raise FuncError("missing argument for comparison")
    k1 = _kind(a)
    for b in rest:
        k2 = _kind(b)
        if k1 != k2:
            if a is not None and b is not None:
                raise FuncError("incompatible types for comparison")
        elif k1 == "invalid":
            raise FuncError("invalid type for comparison")
        elif a == b:
            return True
    return False


def _lt(a: object, b: object) -> bool:
    k1, k2 = _kind(a), _kind(b)
    if "invalid" in (k1, k2):
        raise FuncError("invalid type for comparison")
    if k1 != k2:
        raise FuncError("incompatible types for comparison")
    if k1 == "bool":
        raise FuncError("invalid type for comparison")
    return bool(a < b)  # type: ignore[operator]


def _le(a: object, b: object) -> bool:
    return _lt(a, b) or _eq(a, b)


def _length(v: object) -> int:
    if v is None:
        raise FuncError("len of nil pointer")
    if isinstance(v, str):
        return len(v.encode("utf-8", "surrogateescape"))
    if isinstance(v, dict):
        return len(v)
    raise FuncError(f"len of type {go_type(v)}")


def _int_index(i: object, size: int) -> int:
    if i is None:
        raise FuncError("cannot index slice/array with nil")
    if not isinstance(i, int) or isinstance(i, bool):
        raise FuncError(f"cannot index slice/array with type {go_type(i)}")
    if i < 0 or i > size:
        raise FuncError(f"index out of range: {i}")
    return i


def _index(item: object, *keys: object) -> object:
    if item is None:
        raise FuncError("index of untyped nil")
    for key in keys:
        if isinstance(item, dict):
            if key is None:
                raise FuncError("value is nil; should be of type string")
            if not isinstance(key, str) or isinstance(key, HTML):
                raise FuncError(f"value has type {go_type(key)}; should be string")
            item = item.get(key, None if isinstance(item, ArgsMap) else "")
        elif isinstance(item, str):
            data = item.encode("utf-8", "surrogateescape")
            x = _int_index(key, len(data))
            if x == len(data):
                raise FuncError(f"index out of range: {x}")
            item = data[x]
        else:
            raise FuncError(f"can't index item of type {go_type(item)}")
    return item


def _slice(item: object, *idx: object) -> object:
    if not isinstance(item, str):
        raise FuncError(f"can't slice item of type {go_type(item)}")
    if len(idx) > 2:
        raise FuncError("cannot 3-index slice a string")
    data = item.encode("utf-8", "surrogateescape")
    bounds = [0, len(data)]
    for n, i in enumerate(idx):
        bounds[n] = _int_index(i, len(data))
    if bounds[0] > bounds[1]:
        raise FuncError(f"invalid slice index: {bounds[0]} > {bounds[1]}")
    return type(item)(data[bounds[0] : bounds[1]].decode("utf-8", "replace"))


def _eval_args(args: tuple[object, ...]) -> str:
    if len(args) == 1 and type(args[0]) is str:
        return args[0]
    return sprint(list(args))


_HTML_ESC = {'"': "&#34;", "'": "&#39;", "&": "&amp;", "<": "&lt;", ">": "&gt;", "\0": "\ufffd"}
_JS_ESC = {
    "\\": "\\\\",
    "'": "\\'",
    '"': '\\"',
    "<": "\\u003C",
    ">": "\\u003E",
    "&": "\\u0026",
    "=": "\\u003D",
}


def _js(*args: object) -> str:
    out = []
    for ch in _eval_args(args):
        if ch in _JS_ESC:
            out.append(_JS_ESC[ch])
        elif ch < " ":
            out.append(f"\\u00{ord(ch):02X}")
        elif ord(ch) >= 0x80 and not ch.isprintable():
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return "".join(out)


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


def _ne(a: object, b: object) -> bool:
    return not _eq(a, b)


def _graph_link(tab: int) -> Callable[[str], str]:
    return lambda expr: f"/graph?g0.expr={quote_plus(expr, safe='')}&g0.tab={tab}"


A, S = "any", "string"
BUILTINS: dict[str, Func] = {
    "and": Func((A,), lambda *a: a[-1], A),  # short-circuit evaluation lives in the executor
    "or": Func((A,), lambda *a: a[-1], A),
    "not": Func((A,), lambda v: not truth(v)),
    "len": Func((A,), _length),
    "index": Func((A,), _index, A),
    "slice": Func((A,), _slice, A),
    "print": Func((), lambda *a: sprint(list(a)), A),
    "println": Func((), lambda *a: sprintln(list(a)), A),
    "printf": Func((S,), lambda f, *a: sprintf(f, list(a)), A),
    "html": Func((), lambda *a: "".join(_HTML_ESC.get(c, c) for c in _eval_args(a)), A),
    "js": Func((), _js, A),
    "urlquery": Func((), lambda *a: quote_plus(_eval_args(a), safe=""), A),
    "eq": Func((A,), _eq, A),
    "ne": Func((A, A), _ne),
    "lt": Func((A, A), _lt),
    "le": Func((A, A), _le),
    "gt": Func((A, A), lambda a, b: not _le(a, b)),
    "ge": Func((A, A), lambda a, b: not _lt(a, b)),
}
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
NAMES = frozenset({*BUILTINS, *PROMETHEUS, "externalURL", "pathPrefix"})


def function_map(external_url: str) -> dict[str, Func]:
    """All functions, with externalURL and pathPrefix bound to this render's URL."""
    path = urlsplit(external_url).path
    return {
        **BUILTINS,
        **PROMETHEUS,
        "externalURL": Func((), lambda: external_url),
        "pathPrefix": Func((), lambda: path),
    }


__all__ = ["NAMES", "UNSUPPORTED", "AlertData", "FuncError", "function_map", "truth"]
