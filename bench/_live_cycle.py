"""The daemon's per-second work on the live payload, in-process and in CPU time: for bench/scrape.py --cycle.

N targets' live payloads (bench/_live_targets.py, every counter moving) are ingested through the scraper's
own code once a simulated second for as much history as the bundled rules need, then each cycle does what
the daemon does every second: one scrape of every target (ingest, not the HTTP), the store's collection and
one evaluation of the bundled rule groups with the alert state machine. CPU time (process_time) is robust to
a loaded machine where wall-clock ratios are not. With `profile`, cProfile over the cycles says which
functions the time goes to.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from pathlib import Path

from _live_targets import LivePayload

from vllm_watchdog.config.model import bundled_rules_dir
from vllm_watchdog.promql.engine import Engine, vector_query
from vllm_watchdog.ruler.files import load_rule_files, store_needs
from vllm_watchdog.ruler.groups import RuleManager, RuleManagerOptions
from vllm_watchdog.sources.scrape import ScrapeTarget
from vllm_watchdog.sources.storeneeds import ALWAYS_KEPT
from vllm_watchdog.store import SampleStore, make_labels

PER_TARGET = ("up", "vllm_watchdog_target_info", "vllm_watchdog_health_up", "vllm_watchdog_canary_success")


def run(fixture: Path, n: int, history: int, cycles: int, profile: bool) -> dict[str, float]:
    """Median CPU ms per cycle of ingest, gc and rule evaluation; prints a cProfile top list if asked."""
    groups = load_rule_files([str(p) for p in sorted(bundled_rules_dir().glob("*.rules.yml"))])
    needs = store_needs(groups, 300.0)
    keep = None if needs.names is None else (needs.names | ALWAYS_KEPT).__contains__
    store = SampleStore(retention=needs.max_lookback + 60)
    payload, t0 = LivePayload(fixture.read_text()), 1_800_000_000.0
    targets = [
        ScrapeTarget(
            url="http://127.0.0.1:1/metrics",
            job="vllm",
            instance=f"127.0.0.1:{8000 + i}",
            extra_labels={"target": f"vllm-{i}"},
            store=store,
            timeout=1.0,
            sample_limit=20_000,
            body_size_limit=1 << 24,
            keep_name=keep,
        )
        for i in range(n)
    ]
    scales = sorted({0.5 + (i % 10) / 10 for i in range(n)})

    def render(second: int) -> dict[float, str]:
        return {s: payload.render(float(second), s).decode() for s in scales}

    def scrape(second: int, bodies: dict[float, str]) -> None:
        t_ms = int((t0 + second) * 1000)
        for i, target in enumerate(targets):
            target.ingest(bodies[0.5 + (i % 10) / 10], t_ms)
            for name in PER_TARGET:
                store.append(make_labels(name, target.target_labels), t_ms, 1.0)

    for second in range(history):
        scrape(second, render(second))
    options = RuleManagerOptions(vector_query(Engine(store)), store, default_interval=1.0)
    manager = RuleManager(groups, options)
    parts: dict[str, list[float]] = {"ingest": [], "gc": [], "rules": []}
    prof = cProfile.Profile(time.process_time) if profile else None  # CPU time: the machine may be loaded
    for c in range(cycles):
        second = history + c
        bodies = render(second)  # the fake targets' work: not counted
        t = time.process_time()
        scrape(second, bodies)
        parts["ingest"].append(time.process_time() - t)
        t = time.process_time()
        if second % 15 == 0:  # the daemon collects every 15 s (GC_INTERVAL): its cost spread over 15 cycles
            store.gc(t0 + second)
        parts["gc"].append(time.process_time() - t)
        if prof is not None:
            prof.enable()
        t = time.process_time()
        manager.evaluate_all(t0 + second)
        parts["rules"].append(time.process_time() - t)
        if prof is not None:
            prof.disable()
    out = {k: 1000 * (statistics.mean if k == "gc" else statistics.median)(v) for k, v in parts.items()}
    costs = ", ".join(f"{k} {v:.2f} ms" for k, v in out.items())
    print(f"CPU per cycle, {n} targets, {store.series_count} series, {history} s of history, "
          f"median of {cycles} (gc: mean): {costs}")  # fmt: skip
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return out
