"""Benchmark: one evaluation cycle of the bundled rules over 1, 10 and 100 targets' worth of real series.

Usage: python bench/rules.py [--targets 1,10,100] [--cycles 20]

Each target is the real vLLM 0.32 /metrics payload (tests/fixtures/vllm-0.32.0-metrics.txt) ingested
through the scraper's own code once per second for as much history as the rules need (counters
advance, so rates and histogram quantiles are not trivially empty), plus the health and canary probe
series. Then the bundled rule groups are evaluated by the embedded engine and the alert state machine,
exactly as the daemon does each evaluation_interval. Prints the median and p95 per-cycle cost and its
ratio to a 1 s evaluation interval (the goal is well below 1: evaluation shares one core with scraping).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

from vllm_watchdog.config.model import bundled_rules_dir
from vllm_watchdog.promql.engine import Engine, vector_query
from vllm_watchdog.ruler.files import load_rule_files, store_needs
from vllm_watchdog.ruler.groups import RuleManager
from vllm_watchdog.sources.monitor import ALWAYS_KEPT
from vllm_watchdog.sources.scrape import ScrapeTarget
from vllm_watchdog.store import SampleStore, make_labels

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-0.32.0-metrics.txt"
_NUMBER = re.compile(r" ([0-9.eE+-]+)$", re.M)


def _advance(text: str, step: int) -> str:
    """The payload with every counter-like value grown by `step` (gauges grow too; harmless here)."""
    return _NUMBER.sub(lambda m: f" {float(m.group(1)) + step}", text)


def build(n_targets: int, history: int, t0: float) -> tuple[SampleStore, float]:
    """A store holding `history` seconds of every target's needed series; returns it and the last time."""
    groups = load_rule_files([str(p) for p in sorted(bundled_rules_dir().glob("*.rules.yml"))])
    needs = store_needs(groups, 300.0)
    keep = None if needs.names is None else needs.names | ALWAYS_KEPT
    store = SampleStore(retention=needs.max_lookback + 60)
    body = FIXTURE.read_text()
    bodies = [_advance(body, i) for i in range(0, history, 15)]  # values change every 15 s
    targets = [
        ScrapeTarget(
            url="http://127.0.0.1:1/metrics",
            job="vllm",
            instance=f"vllm-{i}",
            store=store,
            client=None,  # type: ignore[arg-type]  # ingest() never touches the client
            timeout=1.0,
            sample_limit=20_000,
            body_size_limit=1 << 24,
            keep_name=None if keep is None else keep.__contains__,
        )
        for i in range(n_targets)
    ]
    now = t0
    for second in range(history):
        now = t0 + second
        t_ms = int(now * 1000)
        for i, target in enumerate(targets):
            target.ingest(bodies[second // 15], t_ms)
            labels = {"job": "vllm", "instance": f"vllm-{i}"}
            for name in ("up", "vllm_watchdog_health_up", "vllm_watchdog_canary_success"):
                store.append(make_labels(name, labels), t_ms, 1.0)
    return store, now


def bench(n_targets: int, cycles: int) -> None:
    """Print per-cycle evaluation cost for n_targets."""
    groups = load_rule_files([str(p) for p in sorted(bundled_rules_dir().glob("*.rules.yml"))])
    history = int(store_needs(groups, 300.0).max_lookback) + 5
    t0 = 1_800_000_000.0
    started = time.perf_counter()
    store, now = build(n_targets, history, t0)
    built = time.perf_counter() - started
    engine = Engine(store)
    manager = RuleManager(groups, vector_query(engine), store, default_interval=1.0)
    times = []
    for i in range(cycles):
        at = now + i * 1.0
        start = time.perf_counter()
        manager.evaluate_all(at)
        times.append(time.perf_counter() - start)
    times.sort()
    median = statistics.median(times)
    p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
    n_rules = sum(len(g.rules) for g in groups)
    print(
        f"targets={n_targets:4d} series={store.series_count:6d} rules={n_rules} "
        f"cycle median={median * 1000:8.2f} ms p95={p95 * 1000:8.2f} ms "
        f"ratio to 1s interval={median:.4f} (store built in {built:.1f}s)"
    )


def main() -> None:
    """Parse arguments and run."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="1,10,100")
    ap.add_argument("--cycles", type=int, default=20)
    args = ap.parse_args()
    for n in (int(x) for x in args.targets.split(",")):
        bench(n, args.cycles)


if __name__ == "__main__":
    main()
