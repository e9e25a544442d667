"""`GET /api/v1/targets` in Prometheus 2.42's shape: each scrape target (vLLM servers, GPU exporters)
as an active target, plus the watchdog's own view of a vLLM target (probes, canary, the discovery that found
it) under `watchdog`. A discovered target's `discoveredLabels` are what its discovery found (`__meta_*`
among them), as Prometheus shows them."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ..config.durations import format_duration
from ..formats.rfc3339 import MICROSECONDS, format_rfc3339, micros
from ..sources.monitor import Monitor
from ..sources.scrape import ScrapeStatus, ScrapeTarget


def _micros(t: float | None) -> int | None:
    return None if t is None else micros(t)


def _health(st: ScrapeStatus) -> str:
    if st.scrapes == 0:
        return "unknown"
    return "up" if st.up else "down"


def _target(
    scrape: ScrapeTarget, pool: str, labels: dict[str, str], interval: str, timeout: str
) -> dict[str, Any]:
    st = scrape.status
    url = urlsplit(scrape.url)
    return {
        "discoveredLabels": {
            "__address__": url.netloc,
            "__metrics_path__": url.path or "/metrics",
            "__scheme__": url.scheme,
            "__scrape_interval__": interval,
            "__scrape_timeout__": timeout,
            "job": pool,
        },
        "labels": labels,
        "scrapePool": pool,
        "scrapeUrl": scrape.url,
        "globalUrl": scrape.url,
        "lastError": st.last_error or "",
        "lastScrape": format_rfc3339(_micros(st.last_scrape), MICROSECONDS),
        "lastScrapeDuration": st.last_duration,
        "health": _health(st),
        "scrapeInterval": interval,
        "scrapeTimeout": timeout,
    }


def targets_json(monitor: Monitor, scrape_pool: str = "", state: str = "") -> dict[str, Any]:
    """`data` of /api/v1/targets: active targets by pool, filtered by `scrapePool` and `state`."""
    g = monitor.config.global_
    interval, timeout = format_duration(g.scrape_interval), format_duration(g.scrape_timeout)
    state = state.lower()
    out: list[tuple[str, dict[str, Any]]] = []
    for rt in monitor.targets.values():
        pool = rt.labels.get("job", "vllm")
        entry = _target(rt.scrape, pool, dict(sorted(rt.labels.items())), interval, timeout)
        found = rt.config.discovered
        if found is not None:
            entry["discoveredLabels"] = dict(sorted({**entry["discoveredLabels"], **found.labels}.items()))
        h = rt.health.status
        canary = rt.canary.status if rt.canary is not None else None
        entry["watchdog"] = {  # what Prometheus has no field for
            "name": rt.config.name,
            "url": rt.config.url,
            "container": rt.config.container,
            "discovery": None
            if found is None
            else {"mechanism": found.mechanism, "config": found.config, "source": found.source},
            "samples": rt.scrape.status.samples,
            "healthProbe": {"up": h.ok, "latency": h.latency, "lastError": h.last_error},
            "canary": None
            if canary is None
            else {"success": canary.ok, "latency": canary.latency, "lastError": canary.last_error},
        }
        out.append((pool, entry))
    for exporter in monitor.exporters.values():  # the GPU exporters, each in its job's pool
        labels = {**exporter.extra_labels, "instance": exporter.instance, "job": exporter.job}
        out.append(
            (exporter.job, _target(exporter, exporter.job, dict(sorted(labels.items())), interval, timeout))
        )
    active = [e for pool, e in sorted(out, key=lambda pe: pe[0]) if scrape_pool in ("", pool)]
    # Both lists are always there; a `state` filter empties the other one.
    return {
        "activeTargets": active if state in ("", "any", "active") else [],
        "droppedTargets": [],  # no relabelling drops targets here
    }
