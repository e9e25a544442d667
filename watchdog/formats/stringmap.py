"""The string-map check of decoded JSON: an object whose keys and values are all strings (labels,
annotations)."""

from __future__ import annotations


def string_map(value: object) -> dict[str, str] | None:
    """A copy of `value` if it is a dict of strings to strings; None if it is anything else."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return None
    return dict(value)
