"""Frozen dataclasses (the gateway's config and snapshots) to JSON and back, for the control channel.

Only what these dataclasses hold is supported: nested dataclasses, str/int/float/bool/None, tuples (of one
type or `...`), mappings with string keys, and `X | None`. Anything else is a TypeError: the channel never
carries an object it could not rebuild exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union

T = TypeVar("T")


def encode(value: object) -> Any:
    """A JSON-able form of a dataclass tree (tuples become lists; non-finite floats become strings)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "inf", "-inf", "nan": JSON has no such numbers
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"cannot encode {type(value).__name__}")


def decode(cls: type[T], data: object) -> T:
    """Rebuild a dataclass of type `cls` from encode()'s output; TypeError/ValueError if it does not fit."""
    result: T = _build(cls, data)
    return result


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(tp: Any, data: object) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if data is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _build(option, data)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise TypeError("; ".join(errors) or f"no option of {tp} fits")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(data, dict):
            raise TypeError(f"{tp.__name__}: expected an object")
        hints = _hints(tp)
        names = {f.name for f in dataclasses.fields(tp) if f.init}
        unknown = set(data) - names
        if unknown:
            raise TypeError(f"{tp.__name__}: unknown fields {sorted(unknown)}")
        return tp(**{k: _build(hints[k], v) for k, v in data.items()})
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(data, list):
            raise TypeError("expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in data)
        if len(args) != len(data):
            raise TypeError(f"expected {len(args)} items")
        return tuple(_build(a, v) for a, v in zip(args, data, strict=True))
    if origin in (Mapping, dict) or tp in (Mapping, dict):
        args = typing.get_args(tp) or (str, Any)
        if not isinstance(data, dict):
            raise TypeError("expected an object")
        return {str(k): _build(args[1], v) for k, v in data.items()}
    return _scalar(tp, data)


def _scalar(tp: Any, data: object) -> Any:
    if tp is Any:
        return data
    if tp is float:
        if isinstance(data, str) and data in ("inf", "-inf", "nan"):
            return float(data)
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return float(data)
        raise TypeError("expected a number")
    if tp is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        raise TypeError("expected an integer")
    if tp in (str, bool):
        if type(data) is tp:
            return data
        raise TypeError(f"expected a {tp.__name__}")
    if tp is type(None):
        if data is None:
            return None
        raise TypeError("expected null")
    raise TypeError(f"cannot decode into {tp}")
