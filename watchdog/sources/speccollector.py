"""The speculation estimate of every target as series: one snapshot per scrape read from the sample store,
fed to its `SpecGoodput`, and the estimate built at collection time (the self feed writes it to the store for
the rules; /metrics shows it)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric

from ..store import SampleStore, Series
from .selffeed import OwnCollector, Want, everything
from .specgoodput import Estimate, Snapshot, SpecGoodput

LOOKBACK_MS = 300_000  # a counter older than this is not the target's current value
COUNTERS = {
    "steps": "vllm:iteration_tokens_total_count",
    "step_tokens": "vllm:iteration_tokens_total_sum",
    "generated": "vllm:generation_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
}
RUNNING = "vllm:num_requests_running"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
NEEDED = frozenset({*COUNTERS.values(), RUNNING, PER_POS})
"""The vLLM series the estimate reads (the store keeps them: the bundled recording rules read them too)."""
MAX_TARGETS = 4096

Targets = Callable[[], Iterable[tuple[str, Mapping[str, str]]]]
"""The watched targets: name, and the job and instance their vLLM series carry."""


ByName = Mapping[str, list[Series]]


def grouped(store: SampleStore) -> dict[tuple[str, str], dict[str, list[Series]]]:
    """The series the estimate reads, by their (job, instance) and name: one pass over them per collection,
    not one per target (that was O(targets x series) each second)."""
    out: dict[tuple[str, str], dict[str, list[Series]]] = {}
    for name in NEEDED:
        for series in store.select(name):
            labels = dict(series.labels)
            key = (labels.get("job", ""), labels.get("instance", ""))
            out.setdefault(key, {}).setdefault(name, []).append(series)
    return out


def snapshot(store: SampleStore, job: str, instance: str) -> Snapshot | None:
    """The newest scrape of one target's counters (summed over engines), None if any is missing."""
    return snapshot_of(grouped(store).get((job, instance), {}))


def snapshot_of(mine: ByName) -> Snapshot | None:
    """The newest scrape of the counters among one target's series (summed over engines); None if any is
    missing."""
    newest, values = 0, {}
    for key, name in {**COUNTERS, "running": RUNNING}.items():
        total, seen = 0.0, False
        for series in mine.get(name, ()):
            got = series.ts and series.at(series.ts[-1], LOOKBACK_MS)
            if got:
                newest, total, seen = max(newest, got[0]), total + got[1], True
        if not seen and key in ("steps", "step_tokens", "generated", "running"):
            return None
        values[key] = total
    per_pos: dict[int, float] = {}
    for series in mine.get(PER_POS, ()):
        got = series.ts and series.at(series.ts[-1], LOOKBACK_MS)
        pos = dict(series.labels).get("position", "")
        if got and pos.isdigit():
            per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + got[1]
    positions = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos, default=-1) + 1))
    if any(math.isnan(v) for v in values.values()):
        return None
    return Snapshot(newest / 1000.0, per_pos=positions, **values)


class SpecGoodputCollector(OwnCollector):
    """vllm_watchdog_spec_*: the estimate of each target that drafts (docs/rules.md)."""

    def __init__(self, store: SampleStore, targets: Targets) -> None:
        self.store = store
        self.targets = targets
        self.estimators: dict[str, SpecGoodput] = {}

    def collect(self, want: Want = everything) -> Iterator[Metric]:
        """Take each target's newest snapshot and build the families."""
        if not any(want(n) for n in _FAMILIES):
            return
        estimates: list[tuple[dict[str, str], Estimate]] = []
        names = set()
        by_target = grouped(self.store)
        for name, labels in list(self.targets())[:MAX_TARGETS]:
            names.add(name)
            job, instance = labels.get("job", ""), labels.get("instance", "")
            snap = snapshot_of(by_target.get((job, instance), {}))
            est = self.estimators.setdefault(name, SpecGoodput())
            if snap is not None:
                est.observe(snap)
            got = est.estimate()
            if got is not None:
                estimates.append(({"job": job, "instance": instance, "target": name}, got))
        for gone in set(self.estimators) - names:
            del self.estimators[gone]
        yield from families(estimates)


_FAMILIES = (
    "vllm_watchdog_spec_speedup",
    "vllm_watchdog_spec_best_k",
    "vllm_watchdog_spec_current_k",
    "vllm_watchdog_spec_step_seconds",
    "vllm_watchdog_spec_goodput_tokens_per_second",
    "vllm_watchdog_spec_schedule_gain",
)


def families(estimates: list[tuple[dict[str, str], Estimate]]) -> Iterator[Metric]:
    """The families of these estimates (each labelled with its target's job, instance and target)."""
    keys = ["job", "instance", "target"]
    by = [*keys, "batch_size"]
    speedup = GaugeMetricFamily(
        _FAMILIES[0], "Estimated speedup of k draft tokens at a batch-size range.", labels=[*by, "k"]
    )
    best = GaugeMetricFamily(_FAMILIES[1], "The k the schedule gives a batch-size range.", labels=by)
    current = GaugeMetricFamily(_FAMILIES[2], "Draft tokens per request-step, as a k.", labels=by)
    step = GaugeMetricFamily(_FAMILIES[3], "Measured seconds per engine step.", labels=by)
    goodput = GaugeMetricFamily(_FAMILIES[4], "Measured generated tokens per second.", labels=by)
    gain = GaugeMetricFamily(
        _FAMILIES[5], "Estimated goodput of the schedule over what runs.", labels=[*keys, "schedule"]
    )
    for labels, est in estimates:
        base = [labels[k] for k in keys]
        for r in est.ranges:
            where = [*base, r.label]
            for k, value in enumerate(r.speedup):
                speedup.add_metric([*where, str(k)], value)
            best.add_metric(where, est.best[r.index])
            current.add_metric(where, r.current_k)
            step.add_metric(where, r.step_seconds)
            goodput.add_metric(where, r.tokens_per_second)
        gain.add_metric([*base, est.schedule_text], est.gain)
    yield from (speedup, best, current, step, goodput, gain)
