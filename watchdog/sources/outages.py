"""The monitor's periodic log summary: which targets are down, why, and for how long, in one line."""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping

from ..logs import Episode, span

_ORDER = ("scrape", "health", "canary")  # the first failing one says best why a target is down
# The kinds of a GPU exporter's episodes: its scrape failed, or it sent samples out of bounds.
EXPORTER, EXPORTER_BOUNDS = "exporter", "exporter_bounds"


def outage_summary(episodes: Mapping[Hashable, Episode], now: float, targets: Collection[str]) -> str:
    """`2 of 8 targets down: a (scrape: connection refused, 5m12s), b (canary: timeout after 10s, 1m00s)`,
    then each GPU exporter whose scrape fails. Keys are (kind, target name) or (EXPORTER, exporter name)."""
    by_target: dict[str, dict[str, Episode]] = {}
    exporters: dict[str, Episode] = {}
    bounds = []
    for key, ep in episodes.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            continue
        kind, name = key
        if kind in _ORDER:
            by_target.setdefault(name, {})[kind] = ep
        elif kind == EXPORTER:
            exporters[name] = ep
        elif kind in ("bounds", EXPORTER_BOUNDS):
            bounds.append(str(name) if kind == "bounds" else _exporter(name))
    parts = []
    for name in targets:
        kinds = by_target.get(name)
        if kinds:
            kind = next(k for k in _ORDER if k in kinds)
            since = min(ep.since for ep in kinds.values())
            parts.append(f"{name} ({kind}: {_error(kinds[kind])}, {span(now - since)})")
    text = f"{len(parts)} of {len(targets)} targets down" + (": " + ", ".join(parts) if parts else "")
    for name, ep in sorted(exporters.items()):
        text += f"; {_exporter(name)} scrape: {_error(ep)}, {span(now - ep.since)}"
    if bounds:
        text += "; samples out of bounds: " + ", ".join(sorted(bounds))
    return text


def _exporter(name: str) -> str:
    """How the summary names a GPU exporter: `dcgm-exporter` for the one `gpus.dcgm_url` configures."""
    return f"{name}-exporter"


def _error(ep: Episode) -> str:
    if "error" in ep.extra:
        return str(ep.extra["error"])
    return ep.message
