"""Rule files on a faster clock, for bench/soak.py's --time-scale: every duration a rule reads by the clock
(its `for:` and `keep_firing_for:`, range windows, subquery ranges and steps, offsets, a group's interval)
divided by the scale. Thresholds stay: a request takes as long as vLLM takes, whatever the scale, so a latency
limit (`> 120` seconds in flight, a p95 over 5 s) means what it meant.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from vllm_watchdog.config.durations import format_duration, parse_duration

_DURATION = r"(?:\d+(?:ms|[smhdwy]))+"
# A string literal (skipped: a label value may hold brackets), a range or subquery, or an offset.
_TOKEN = re.compile(
    rf"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)"""
    rf"|\[\s*(?P<range>{_DURATION})\s*(?::\s*(?P<step>{_DURATION})?\s*)?\]"
    rf"|\boffset\s+(?P<sign>-?)\s*(?P<offset>{_DURATION})"
)


def scaled(text: str, scale: float) -> str:
    """A Prometheus duration divided by `scale` (at least 1 ms)."""
    return format_duration(max(parse_duration(text) / scale, 0.001))


def scaled_expr(expr: str, scale: float) -> str:
    """A PromQL expression with its ranges, subquery steps and offsets divided by `scale`."""

    def one(m: re.Match[str]) -> str:
        if m["string"] is not None:
            return m[0]
        if m["offset"] is not None:
            return f"offset {m['sign']}{scaled(m['offset'], scale)}"
        step = m["step"]
        sub = "" if m[0].find(":") < 0 else f":{scaled(step, scale) if step else ''}"
        return f"[{scaled(m['range'], scale)}{sub}]"

    return _TOKEN.sub(one, expr)


def scaled_rules(doc: dict[str, Any], scale: float) -> dict[str, Any]:
    """A parsed rule file with every clock duration divided by `scale`."""
    groups = []
    for group in doc.get("groups") or []:
        g = dict(group)
        if "interval" in g:
            g["interval"] = scaled(str(g["interval"]), scale)
        rules = []
        for rule in g.get("rules") or []:
            r = dict(rule, expr=scaled_expr(str(rule["expr"]), scale))
            for key in ("for", "keep_firing_for"):
                if key in r:
                    r[key] = scaled(str(r[key]), scale)
            rules.append(r)
        g["rules"] = rules
        groups.append(g)
    return {**doc, "groups": groups}


def write_scaled_rules(source: Path, dest: Path, scale: float) -> Path:
    """Write `source` (a rule file) to `dest` on a clock `scale` times faster; dest."""
    doc = yaml.safe_load(source.read_text())
    dest.write_text(yaml.safe_dump(scaled_rules(doc, scale), sort_keys=False, allow_unicode=True))
    return dest
