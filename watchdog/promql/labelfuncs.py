"""label_replace() and label_join() on sorted Labels tuples, with Go (RE2) regex and $-expansion semantics."""

from __future__ import annotations

import re
from typing import NoReturn

from ..goregex import GoRegex, RegexError, compile_anchored
from ..store import Labels
from .values import QueryError

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
# The longest label value label_replace() or label_join() may write: four times what a scrape keeps by
# default, so that joins of scraped values fit; unbounded, nested replacements grew a label to 240 MB.
MAX_LABEL_VALUE = 4096
# A replacement whose expansion could pass this many characters is refused without being expanded.
_MAX_EXPANSION = 1 << 20


def is_valid_label_name(name: str) -> bool:
    """Prometheus' label name rule: [a-zA-Z_][a-zA-Z0-9_]*."""
    return _LABEL_NAME.match(name) is not None


def _set_label(labels: Labels, name: str, value: str) -> Labels:
    """Labels with `name` set to value (removed when value is empty), still sorted."""
    kept = [(k, v) for k, v in labels if k != name]
    if value:
        kept.append((name, value))
        kept.sort()
    return tuple(kept)


def check_label_replace(dst: str, regex: str) -> GoRegex:
    """Validate label_replace()'s arguments like Prometheus (regex first); raise QueryError."""
    try:
        compiled = compile_anchored(regex)
    except RegexError:
        raise QueryError(f"invalid regular expression in label_replace(): {regex}") from None
    if not is_valid_label_name(dst):
        raise QueryError(f"invalid destination label name in label_replace(): {dst}")
    return compiled


def label_replace(labels: Labels, dst: str, replacement: str, src: str, regex: str) -> Labels:
    """Set dst to the expanded replacement if regex fully matches src's value (missing label = '')."""
    compiled = check_label_replace(dst, regex)
    value = dict(labels).get(src, "")
    match = compiled.find_string_submatch(value)
    if match is None:
        return labels
    # Each $-reference expands to part of the value: this bounds the expansion before it is made.
    if len(replacement) + replacement.count("$") * len(value) > _MAX_EXPANSION:
        _too_long("label_replace", dst)
    expanded = compiled.expand_string(replacement, match)
    if len(expanded) > MAX_LABEL_VALUE:
        _too_long("label_replace", dst)
    return _set_label(labels, dst, expanded)


def _too_long(function: str, dst: str) -> NoReturn:
    message = f"{function}(): the value of label {dst!r} would be longer than {MAX_LABEL_VALUE} characters"
    raise QueryError(message)


def check_label_join(dst: str, srcs: list[str] | tuple[str, ...]) -> None:
    """Validate label_join()'s label names like Prometheus (sources first); raise QueryError."""
    for src in srcs:
        if not is_valid_label_name(src):
            raise QueryError(f"invalid source label name in label_join(): {src}")
    if not is_valid_label_name(dst):
        raise QueryError(f"invalid destination label name in label_join(): {dst}")


def label_join(labels: Labels, dst: str, sep: str, srcs: list[str] | tuple[str, ...]) -> Labels:
    """Set dst to the source labels' values joined by sep (an empty result removes dst)."""
    check_label_join(dst, srcs)
    values = dict(labels)
    parts = [values.get(src, "") for src in srcs]
    if sum(map(len, parts)) + len(sep) * (len(parts) - 1) > MAX_LABEL_VALUE:
        _too_long("label_join", dst)
    return _set_label(labels, dst, sep.join(parts))
