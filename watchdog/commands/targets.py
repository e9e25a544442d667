"""`targets`: scrape, health-probe and canary every target once, and print a table of their state."""

from __future__ import annotations

import asyncio
import time
from typing import TextIO

from ..config.model import Config
from ..discovery.providers import with_discovered
from ..sources.monitor import Monitor, MonitorOptions


async def scrape_once(config: Config) -> Monitor:
    """A monitor of the config's targets (discovered ones too) after one scrape, health probe and canary of
    each."""
    config = await asyncio.to_thread(with_discovered, config)
    monitor = Monitor(config, MonitorOptions(keep_all=True))
    try:
        now = time.time()
        jobs = []
        for name in monitor.targets:
            jobs += [
                monitor.scrape(name, now),
                monitor.probe_health(name, now),
                monitor.probe_canary(name, now),
            ]
        await asyncio.gather(*jobs)
    finally:
        await monitor.aclose()
    return monitor


def _fmt_probe(ok: bool | None, latency: float) -> str:
    if ok is None:
        return "-"
    return f"{'ok' if ok else 'FAIL'} {latency * 1000:.0f}ms"


def _errors(by_source: dict[str, str | None]) -> str:
    """Each distinct error once, after the sources that saw it: `scrape, health: connection refused`."""
    seen: dict[str, list[str]] = {}
    for source, error in by_source.items():
        if error:
            seen.setdefault(error, []).append(source)
    return "; ".join(f"{', '.join(sources)}: {error}" for error, sources in seen.items())


def print_targets(config: Config, out: TextIO) -> bool:
    """Scrape every target once and print a table of their state; whether all of them are up."""
    monitor = asyncio.run(scrape_once(config))
    rows = [("TARGET", "URL", "UP", "SAMPLES", "SCRAPE", "HEALTH", "CANARY", "ERROR")]
    all_up = True
    for rt in monitor.targets.values():
        st = rt.scrape.status
        canary = rt.canary.status if rt.canary else None
        errors = _errors(
            {
                "scrape": st.last_error,
                "health": rt.health.status.last_error,
                "canary": canary.last_error if canary else None,
            }
        )
        all_up = all_up and st.up and bool(rt.health.status.ok) and (canary is None or bool(canary.ok))
        rows.append(
            (
                rt.config.name,
                rt.config.url,
                "1" if st.up else "0",
                str(st.samples),
                f"{st.last_duration * 1000:.0f}ms",
                _fmt_probe(rt.health.status.ok, rt.health.status.latency),
                _fmt_probe(canary.ok, canary.latency) if canary else "off",
                errors or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1], file=out)
    return all_up
