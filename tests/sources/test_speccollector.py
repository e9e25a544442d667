"""The speculation estimate read from the sample store, as vLLM 0.32's /metrics fills it."""

from __future__ import annotations

from pathlib import Path

from vllm_watchdog.sources.exposition import parse
from vllm_watchdog.sources.speccollector import SpecGoodputCollector, snapshot
from vllm_watchdog.store import SampleStore, make_labels

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-0.32.0-specdecode-metrics.txt"
TARGET = {"job": "vllm", "instance": "127.0.0.1:8000"}


def _load(store: SampleStore, text: str, t_ms: int, scale: float = 1.0, running: float | None = None) -> None:
    for name, labels, raw, _ in parse(text):
        if name.startswith("vllm:") and not name.endswith("_created"):
            value = raw
            if name == "vllm:num_requests_running" and running is not None:
                value = running
            elif name.endswith(("_total", "_count", "_sum")):
                value = raw * scale
            store.append(make_labels(name, {**labels, **TARGET}), t_ms, value)


def test_a_snapshot_reads_vllms_spec_decode_counters() -> None:
    store = SampleStore(3600)
    _load(store, FIXTURE.read_text(), 5_000)
    snap = snapshot(store, **TARGET)
    assert snap is not None
    assert (snap.t, snap.running, snap.drafts, snap.draft_tokens, snap.accepted) == (5.0, 0, 39, 139, 128)
    assert snap.per_pos == (38, 32, 31, 27)
    assert snap.steps > 0 and snap.step_tokens > snap.steps and snap.generated > 0
    assert snapshot(store, job="vllm", instance="elsewhere:1") is None


def test_the_collector_exports_the_estimate_by_batch_size() -> None:
    """Two batch sizes at two step costs: the collector labels each range and k, and the schedule."""
    store = SampleStore(3600)
    text = FIXTURE.read_text()
    collector = SpecGoodputCollector(store, lambda: [("main", TARGET)])
    scale = 1.0
    for i in range(1, 80):  # 40 scrapes at batch 1, then 40 at batch 16, the counters growing
        scale += 1.0 if i <= 40 else 0.5  # steps grow half as fast at 16: each step costs twice the time
        _load(store, text, i * 1000, scale, running=1 if i <= 40 else 16)
        families = {f.name: f for f in collector.collect()}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples
    }
    speedups = {dict(k)["batch_size"] for (n, k) in samples if n == "vllm_watchdog_spec_speedup"}
    assert speedups == {"1", "16-31"}
    gain = [dict(k) for (n, k) in samples if n == "vllm_watchdog_spec_schedule_gain"]
    assert gain and gain[0]["target"] == "main" and gain[0]["schedule"].startswith("1-")
    assert all(dict(k)["instance"] == TARGET["instance"] for (_, k) in samples)
