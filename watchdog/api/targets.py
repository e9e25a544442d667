"""`GET /api/v1/targets` in Prometheus 2.42's shape: each scrape target (vLLM servers, GPU exporters)
as an active target, plus the watchdog's own view of a vLLM target (probes, canary, the discovery that found
it, its known answers and quarantine) under `watchdog`. A discovered target's `discoveredLabels` are what its
discovery found (`__meta_*` among them), as Prometheus shows them.

The known answers and the quarantine are read from the sample store, where the known-answer check writes
`vllm_watchdog_known_answer_*` under the target's labels and the own feed writes
`vllm_watchdog_target_quarantined{target}` (while a rule reads it: the bundled rules do)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from ..config.durations import format_duration
from ..formats.rfc3339 import MICROSECONDS, format_rfc3339, micros
from ..sources.monitor import Monitor
from ..sources.scrape import ScrapeStatus, ScrapeTarget
from ..store import Labels, SampleStore, is_stale

KNOWN_ANSWER = "vllm_watchdog_known_answer_"
QUARANTINED = "vllm_watchdog_target_quarantined"


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


def _of_target(name: str, labels: dict[str, str]) -> Callable[[Labels], bool]:
    """Whether a series is about the target: its `target` label names it, or, without one, its job and
    instance are the target's."""
    job, instance = labels.get("job"), labels.get("instance")

    def keep(series: Labels) -> bool:
        own = dict(series)
        if "target" in own:
            return own["target"] == name
        return own.get("job") == job and own.get("instance") == instance

    return keep


def _newest(store: SampleStore, name: str, keep: Callable[[Labels], bool]) -> tuple[Labels, float] | None:
    """The labels and value of the newest live sample among the series of `name` that `keep` accepts."""
    best: tuple[int, Labels, float] | None = None
    for series in store.select(name, keep):
        if not series.ts or is_stale(series.vals[-1]):
            continue
        if best is None or series.ts[-1] > best[0]:
            best = (series.ts[-1], series.labels, series.vals[-1])
    return None if best is None else (best[1], best[2])


def known_answers_json(store: SampleStore, name: str, labels: dict[str, str]) -> dict[str, Any] | None:
    """The target's known-answer state from its `vllm_watchdog_known_answer_*` series; None where it is not
    checked. `state`: learning (no baseline yet), ok, diverged, or unknown (the last check could not tell)."""
    keep = _of_target(name, labels)
    baseline = _newest(store, KNOWN_ANSWER + "baseline_info", keep)
    if baseline is None:
        return None

    def value(suffix: str) -> float | None:
        found = _newest(store, KNOWN_ANSWER + suffix, keep)
        return None if found is None or not math.isfinite(found[1]) else found[1]

    ok, learnt = value("ok"), dict(baseline[0]).get("state", "")
    if ok is None:
        state = "learning" if learnt == "learning" else "unknown"
    else:
        state = "ok" if ok == 1 else "diverged"
    mismatches, last = value("greedy_mismatches"), value("last_check_timestamp_seconds")
    return {
        "state": state,
        "baseline": learnt,
        "identity": dict(baseline[0]).get("identity", ""),
        "divergence": value("divergence"),
        "tolerance": value("tolerance"),
        "greedyMismatches": None if mismatches is None else int(mismatches),
        "lastCheck": None if last is None else format_rfc3339(micros(last), MICROSECONDS),
    }


def quarantined(store: SampleStore, name: str) -> bool:
    """Whether the target is quarantined, by its newest `vllm_watchdog_target_quarantined` sample."""
    found = _newest(store, QUARANTINED, lambda series: dict(series).get("target") == name)
    return found is not None and found[1] == 1


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
            "knownAnswers": known_answers_json(monitor.store, rt.config.name, rt.labels),
            "quarantined": quarantined(monitor.store, rt.config.name),
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
