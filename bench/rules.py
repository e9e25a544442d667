"""Benchmark: one evaluation cycle of the bundled rules over 1, 10 and 100 targets' worth of real series.

Usage: python bench/rules.py [--targets 1,10,100] [--cycles 20] [--static]

Each target is the real vLLM 0.32 /metrics payload (tests/fixtures/vllm-0.32.0-metrics.txt) ingested
through the scraper's own code once per second for as much history as the rules need (counters
advance, so rates and histogram quantiles are not trivially empty), plus the health and canary probe
series. Then the bundled rule groups are evaluated by the embedded engine and the alert state machine,
exactly as the daemon does each evaluation_interval. Between two cycles every target is scraped once more
and the store collected, as in the daemon (not timed: the cycle is the evaluation alone); --static skips
that and evaluates the same samples at later times, as this benchmark did before. Prints the median and p95
per-cycle cost (wall and CPU time: the CPU time says more on a loaded machine) and the wall time's ratio to
a 1 s evaluation interval (the goal is well below 1: evaluation shares one core with scraping).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from vllm_watchdog.config.model import bundled_rules_dir
from vllm_watchdog.promql.engine import Engine, vector_query
from vllm_watchdog.ruler.files import load_rule_files, store_needs
from vllm_watchdog.ruler.groups import RuleManager, RuleManagerOptions
from vllm_watchdog.sources.scrape import ScrapeTarget
from vllm_watchdog.sources.storeneeds import ALWAYS_KEPT
from vllm_watchdog.store import SampleStore, make_labels

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-0.32.0-metrics.txt"
_NUMBER = re.compile(r" ([0-9.eE+-]+)$", re.M)


def _advance(text: str, step: int) -> str:
    """The payload with every counter-like value grown by `step` (gauges grow too; harmless here)."""
    return _NUMBER.sub(lambda m: f" {float(m.group(1)) + step}", text)


# Written beside each body: a scrape's up, and the watchdog's per-target series (probes, self feed).
PER_TARGET = ("up", "vllm_watchdog_target_info", "vllm_watchdog_health_up", "vllm_watchdog_canary_success")


def build(n_targets: int, history: int, t0: float) -> tuple[SampleStore, float, Callable[[float], None]]:
    """A store holding `history` seconds of every target's needed series; returns it, the last time, and
    what scrapes every target once more at a given time."""
    groups = load_rule_files([str(p) for p in sorted(bundled_rules_dir().glob("*.rules.yml"))])
    needs = store_needs(groups, 300.0)
    keep = None if needs.names is None else needs.names | ALWAYS_KEPT
    store = SampleStore(retention=needs.max_lookback + 60)
    text = FIXTURE.read_text()
    bodies: dict[int, str] = {}  # values change every 15 s
    targets = [
        ScrapeTarget(
            url="http://127.0.0.1:1/metrics",
            job="vllm",
            instance=f"127.0.0.1:{8000 + i}",  # the labels the monitor gives a target on its own port
            extra_labels={"target": f"vllm-{i}"},
            store=store,
            timeout=1.0,
            sample_limit=20_000,
            body_size_limit=1 << 24,
            keep_name=None if keep is None else keep.__contains__,
        )
        for i in range(n_targets)
    ]

    def scrape(now: float) -> None:
        step = round(now - t0) // 15 * 15
        body = bodies.get(step)
        if body is None:
            body = bodies[step] = _advance(text, step)
        t_ms = int(now * 1000)
        for target in targets:
            target.ingest(body, t_ms)
            labels = target.target_labels
            for name in PER_TARGET:
                store.append(make_labels(name, labels), t_ms, 1.0)

    for second in range(history):
        scrape(t0 + second)
    return store, t0 + history - 1, scrape


def bench(n_targets: int, cycles: int, static: bool) -> None:
    """Print per-cycle evaluation cost for n_targets."""
    groups = load_rule_files([str(p) for p in sorted(bundled_rules_dir().glob("*.rules.yml"))])
    history = int(store_needs(groups, 300.0).max_lookback) + 5
    t0 = 1_800_000_000.0
    started = time.perf_counter()
    store, now, scrape = build(n_targets, history, t0)
    built = time.perf_counter() - started
    engine = Engine(store)
    manager = RuleManager(groups, RuleManagerOptions(vector_query(engine), store, default_interval=1.0))
    walls, cpus = [], []
    for i in range(cycles):
        at = now + i * 1.0
        if i and not static:
            scrape(at)
            store.gc(at)
        start, cpu = time.perf_counter(), time.process_time()
        manager.evaluate_all(at)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    median, cpu_median = statistics.median(walls), statistics.median(cpus)
    p95 = sorted(walls)[min(len(walls) - 1, int(len(walls) * 0.95))]
    n_rules = sum(len(g.rules) for g in groups)
    print(
        f"targets={n_targets:4d} series={store.series_count:6d} rules={n_rules} "
        f"cycle median={median * 1000:8.2f} ms p95={p95 * 1000:8.2f} ms cpu={cpu_median * 1000:8.2f} ms "
        f"ratio to 1s interval={median:.4f} (store built in {built:.1f}s)"
    )


def main() -> None:
    """Parse arguments and run."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="1,10,100")
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--static", action="store_true", help="no scrape between cycles (the old benchmark)")
    args = ap.parse_args()
    for n in (int(x) for x in args.targets.split(",")):
        bench(n, args.cycles, args.static)


if __name__ == "__main__":
    main()
