"""JSON from untrusted sources (API bodies, incident bundles) parsed to a bounded depth and valid Unicode
throughout, and text that may hold a lone surrogate made encodable.

`json.loads` accepts a lone surrogate (`"\\ud800"`), which no UTF-8 encoder does: stored in the action log, it
made every later `GET /api/v1/actions` answer 500, across restarts. And it recurses once per nesting level, so
a body nested 100k deep ended in RecursionError (a 516-byte incident bundle so broke every listing).
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 32  # an Alertmanager webhook nests 4 levels, a silence 3, an incident manifest 3
_SURROGATE = re.compile("[\ud800-\udfff]")

# A field's place in the value, as a linked list: (parent, key); formatted only for an error message.
_Path = tuple[Any, str | int] | None


def printable(text: str) -> str:
    """`text` with each lone surrogate written as U+FFFD, so that it can be encoded (logged, answered)."""
    return _SURROGATE.sub("\ufffd", text)


def _valid(text: str) -> bool:
    return text.isascii() or _SURROGATE.search(text) is None


def _field(path: _Path, root: str) -> str:
    keys: list[str | int] = []
    while path is not None:
        path, key = path
        keys.append(key)
    out = ""
    for key in reversed(keys):
        out += f"[{key}]" if isinstance(key, int) else f".{printable(key)}" if out else printable(key)
    return out or root


def check(value: Any, max_depth: int = MAX_DEPTH, root: str = "body") -> None:
    """ValueError naming the field (from `root`) if `value` nests deeper than `max_depth` or holds invalid
    Unicode."""
    stack: list[tuple[Any, _Path, int]] = [(value, None, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            if not _valid(item):
                raise ValueError(
                    f"{_field(path, root)}: not valid Unicode (a lone surrogate such as \\ud800)"
                )
            continue
        if not isinstance(item, dict | list):
            continue
        if depth >= max_depth:
            raise ValueError(f"{_field(path, root)}: nested deeper than {max_depth} levels")
        if isinstance(item, list):
            stack.extend((v, (path, i), depth + 1) for i, v in enumerate(item))
            continue
        for key, v in item.items():
            if not _valid(key):
                raise ValueError(
                    f"{_field(path, root)}: a name is not valid Unicode (a lone surrogate such as \\ud800)"
                )
            stack.append((v, (path, key), depth + 1))


def parse(raw: bytes, max_depth: int = MAX_DEPTH, root: str = "body") -> Any:
    """The JSON value of `raw` (a request body, a bundle file: `root` names it); ValueError naming the field
    if it is not JSON, nests deeper than `max_depth`, or holds a string that is not valid Unicode."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError(f"{root}: nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{root} is not JSON: {printable(str(exc))}") from None
    check(value, max_depth, root)
    return value
