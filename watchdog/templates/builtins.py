"""text/template's built-in functions (and, index, printf, eq, ...) and the Func type every function has."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote_plus

from .gofmt import sprint, sprintf, sprintln
from .govalues import HTML, ArgsMap, go_type


class FuncError(ValueError):
    """A function returned an error; the executor reports it as 'error calling NAME: ...'."""


@dataclass(frozen=True)
class Func:
    """A callable with Go parameter kinds: 'string' (exactly string) or 'any' (interface{})."""

    params: tuple[str, ...]
    impl: Callable[..., object]
    variadic: str | None = None


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


def _ne(a: object, b: object) -> bool:
    return not _eq(a, b)


A, S = "any", "string"  # the parameter kinds of a Func
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
