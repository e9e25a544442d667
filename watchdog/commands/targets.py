"""`targets`: scrape, health-probe and canary every target once, check its known answers against the baseline
the daemon learnt (or the pinned one: a verify, which never learns), and print a table of their state."""

from __future__ import annotations

import asyncio
import time
from typing import TextIO

from ..config.model import Config
from ..discovery.providers import with_discovered
from ..integrity.checker import IntegrityOptions, KnownAnswers, Readiness
from ..integrity.verdict import Verdict
from ..sources.monitor import Monitor, MonitorOptions

Answers = dict[str, tuple[str, str | None]]
"""Per target name: its known-answer cell, and why it could not tell (None if it could)."""


async def _probe_all(monitor: Monitor) -> None:
    now = time.time()
    jobs = []
    for name in monitor.targets:
        jobs += [monitor.scrape(name, now), monitor.probe_health(name, now), monitor.probe_canary(name, now)]
    await asyncio.gather(*jobs)


async def scrape_once(config: Config) -> Monitor:
    """A monitor of the config's targets (discovered ones too) after one scrape, health probe and canary of
    each."""
    config = await asyncio.to_thread(with_discovered, config)
    monitor = Monitor(config, MonitorOptions(keep_all=True))
    try:
        await _probe_all(monitor)
    finally:
        await monitor.aclose()
    return monitor


async def survey(config: Config) -> tuple[Monitor, Answers]:
    """scrape_once(), and the known answers of the targets the daemon checks."""
    config = await asyncio.to_thread(with_discovered, config)
    monitor = Monitor(config, MonitorOptions(keep_all=True))
    try:
        await _probe_all(monitor)
        answers = await check_answers(config, monitor, time.time())
    finally:
        await monitor.aclose()
    return monitor, answers


async def check_answers(config: Config, monitor: Monitor, now: float) -> Answers:
    """Verify the known answers of every target the daemon checks (canary on, `integrity.enabled`) whose
    /health passes and whose engine is neither paused nor asleep (a request would wake it), one at a time,
    each within `integrity.timeout`."""
    names = (
        [n for n, rt in monitor.targets.items() if rt.canary is not None] if config.integrity.enabled else []
    )
    options = IntegrityOptions(
        client=lambda target: monitor.targets[target.name].client,
        readiness=lambda name, at: Readiness(),
        state_dir=config.state_dir,
    )
    checker = KnownAnswers(config.integrity, options)
    checker.apply(config.integrity, names)
    out: Answers = {}
    for name in names:
        rt = monitor.targets[name]
        await monitor.probe_state(name, now)
        paused = monitor.engine_state(name, now)
        if not rt.health.status.ok or paused:
            out[name] = (f"skipped: {paused}" if paused else "-", None)
            continue
        verdict = await checker.verify(rt.config, now)
        out[name] = answer_cell(verdict, checker.status(name).baseline is None)
    return out


def answer_cell(verdict: Verdict, no_baseline: bool) -> tuple[str, str | None]:
    """A verdict as its table cell (divergence/tolerance in nats), and why it could not tell."""
    gap = f"{verdict.divergence:.3g}/{verdict.tolerance:.3g}"
    if verdict.ok is None:
        return ("no baseline", None) if no_baseline else ("unknown", verdict.reason)
    return (f"ok {gap}", None) if verdict.ok else (f"DIVERGED {gap}", None)


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
    """Scrape every target once and print a table of their state; whether all of them are up (and none
    answers its known-answer prompts wrong)."""
    monitor, answers = asyncio.run(survey(config))
    rows = [("TARGET", "URL", "UP", "SAMPLES", "SCRAPE", "HEALTH", "CANARY", "ANSWERS", "ERROR")]
    all_up = True
    for rt in monitor.targets.values():
        st = rt.scrape.status
        canary = rt.canary.status if rt.canary else None
        answer, unsure = answers.get(rt.config.name, ("off", None))
        errors = _errors(
            {
                "scrape": st.last_error,
                "health": rt.health.status.last_error,
                "canary": canary.last_error if canary else None,
                "answers": unsure,
            }
        )
        all_up = all_up and st.up and bool(rt.health.status.ok) and (canary is None or bool(canary.ok))
        all_up = all_up and not answer.startswith("DIVERGED")
        rows.append(
            (
                rt.config.name,
                rt.config.url,
                "1" if st.up else "0",
                str(st.samples),
                f"{st.last_duration * 1000:.0f}ms",
                _fmt_probe(rt.health.status.ok, rt.health.status.latency),
                _fmt_probe(canary.ok, canary.latency) if canary else "off",
                answer,
                errors or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1], file=out)
    return all_up
