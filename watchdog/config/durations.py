"""Prometheus duration syntax (`1h30m`, `500ms`) and byte sizes (`16MiB`)."""

from __future__ import annotations

import re

_UNITS: dict[str, float] = {
    "y": 365 * 86400.0,
    "w": 7 * 86400.0,
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}
_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_SIZE = re.compile(r"^(\d+)\s*(B|KB|KiB|MB|MiB|GB|GiB|TB|TiB)?$")
_SIZE_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}


def parse_duration(text: str) -> float:
    """Parse a Prometheus duration into seconds; raise ValueError on bad syntax."""
    if text == "0":
        return 0.0
    m = _DURATION.match(text)
    if not text or m is None or not any(m.groups()):
        raise ValueError(f"not a valid duration string: {text!r} (use e.g. 15s, 1m30s, 500ms)")
    total = 0.0
    for amount, unit in zip(m.groups(), ("y", "w", "d", "h", "m", "s", "ms"), strict=True):
        if amount is not None:
            total += int(amount) * _UNITS[unit]
    return total


def format_duration(seconds: float) -> str:
    """Render seconds in Prometheus duration syntax, the inverse of parse_duration."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    out = []
    for unit in ("y", "w", "d", "h", "m", "s", "ms"):
        size = round(_UNITS[unit] * 1000)
        if ms >= size:
            out.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(out)


def parse_size(text: str) -> int:
    """Parse a byte size like `16MiB` or `512KB` (both base 2, as Prometheus does)."""
    m = _SIZE.match(text.strip())
    if m is None:
        raise ValueError(f"not a valid size: {text!r} (use e.g. 16MiB, 512KiB, 1GB)")
    unit = (m.group(2) or "B").replace("i", "")
    return int(m.group(1)) * _SIZE_UNITS[unit]
