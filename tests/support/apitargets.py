"""Reading `GET /api/v1/targets` (Prometheus' shape) in tests: the vLLM targets, flattened to what tests check."""

from __future__ import annotations

from datetime import datetime
from typing import Any

NEVER = "0001-01-01T00:00:00Z"


def _unix(text: str) -> float | None:
    return None if text == NEVER else datetime.fromisoformat(text).timestamp()


def targets(answer: Any) -> list[dict[str, Any]]:
    """The vLLM targets of an answer, in config order: name, url, up, last_scrape (unix seconds, None before the
    first), last_error, samples, health and canary (the watchdog's probes; canary None when off)."""
    out = []
    for t in answer["data"]["activeTargets"]:
        if "watchdog" not in t:  # the dcgm-exporter
            continue
        own = t["watchdog"]
        probe, canary = own["healthProbe"], own["canary"]
        out.append(
            {
                "name": own["name"],
                "url": own["url"],
                "up": t["health"] == "up",
                "last_scrape": _unix(t["lastScrape"]),
                "last_error": t["lastError"],
                "samples": own["samples"],
                "health": {"up": probe["up"], "latency": probe["latency"], "last_error": probe["lastError"]},
                "canary": None
                if canary is None
                else {
                    "success": canary["success"],
                    "latency": canary["latency"],
                    "last_error": canary["lastError"],
                },
            }
        )
    return out
