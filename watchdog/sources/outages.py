"""The monitor's periodic log summary: which targets are down, why, and for how long, in one line."""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping

from ..logs import Episode, span

_ORDER = ("scrape", "health", "canary")  # the first failing one says best why a target is down


def outage_summary(episodes: Mapping[Hashable, Episode], now: float, targets: Collection[str]) -> str:
    """`2 of 8 targets down: a (scrape: connection refused, 5m12s), b (canary: timeout after 10s, 1m00s)`,
    then the dcgm-exporter if its scrape fails. Keys are (kind, target), target None for the exporter."""
    by_target: dict[str | None, dict[str, Episode]] = {}
    bounds = []
    for key, ep in episodes.items():
        if isinstance(key, tuple) and len(key) == 2 and key[0] in _ORDER:
            by_target.setdefault(key[1], {})[key[0]] = ep
        elif isinstance(key, tuple) and len(key) == 2 and key[0] == "bounds":
            bounds.append(str(key[1] or "dcgm-exporter"))
    parts = []
    for name in targets:
        kinds = by_target.get(name)
        if kinds:
            kind = next(k for k in _ORDER if k in kinds)
            since = min(ep.since for ep in kinds.values())
            parts.append(f"{name} ({kind}: {_error(kinds[kind])}, {span(now - since)})")
    text = f"{len(parts)} of {len(targets)} targets down" + (": " + ", ".join(parts) if parts else "")
    dcgm = by_target.get(None, {})
    if dcgm:
        kind = next(k for k in _ORDER if k in dcgm)
        text += f"; dcgm-exporter {kind}: {_error(dcgm[kind])}, {span(now - dcgm[kind].since)}"
    if bounds:
        text += "; samples out of bounds: " + ", ".join(sorted(bounds))
    return text


def _error(ep: Episode) -> str:
    if "error" in ep.extra:
        return str(ep.extra["error"])
    return ep.message
