"""The daemon's known-answer wiring on a real Monitor: jobs per canary-checked target, the series in the store
under the target's labels and on /metrics, baselines kept across a reload, events as audit rows."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.integrity.fake_engine import URL, FakeEngine
from tests.support.clock import T0
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.integrity.verdict import Verdict
from vllm_watchdog.service.integritywiring import IntegrityWiring, audit_event
from vllm_watchdog.sources.monitor import Monitor, MonitorOptions
from vllm_watchdog.sources.storeneeds import NO_RULES
from vllm_watchdog.store import is_stale, make_labels

pytestmark = pytest.mark.anyio
CONFIG = (
    f"targets:\n  - {{name: t0, url: '{URL}'}}\n  - {{name: quiet, url: 'http://192.0.2.11:8000', canary: false}}\n"
    "integrity: {max_tokens_per_minute: 100000}\n"
)


async def test_checks_feed_the_store_and_metrics_and_survive_a_reload() -> None:
    engine = FakeEngine()
    config = parse_config(CONFIG, "/etc/w.yml")
    mon = Monitor(
        config,
        MonitorOptions(
            client_factory=lambda *a: httpx.AsyncClient(transport=httpx.MockTransport(engine.handler))
        ),
    )
    heard: list[tuple[str, bool | None]] = []
    store = ActionStore(None)

    def on_verdict(target: str, verdict: Verdict, now: float) -> None:
        heard.append((target, verdict.ok))

    wiring = IntegrityWiring(config, mon, on_verdict, audit_event(store, lambda: T0))
    assert [job[0] for job in wiring.jobs()] == ["integrity:t0"] and wiring.jobs()[0][2] == 60.0
    rt = mon.targets["t0"]
    assert rt.canary is not None
    await wiring.check("t0", T0)
    assert engine.requests == []  # no /health passed yet: nothing sent
    rt.health.status.ok = rt.canary.status.ok = True
    await wiring.check("t0", T0 + 60)  # learns
    await wiring.check("t0", T0 + 120)
    labels = rt.labels
    ok = mon.store.get(make_labels("vllm_watchdog_known_answer_ok", labels))
    assert list(ok.vals) == [1.0] and list(ok.ts) == [int((T0 + 120) * 1000)]
    info = {
        dict(s.labels)["state"]: s.vals[-1]
        for s in mon.store.select("vllm_watchdog_known_answer_baseline_info")
    }
    assert info["learnt"] == 1.0 and is_stale(info["learning"])  # the learning series ended
    assert heard == [("t0", None), ("t0", True)]  # the skipped check, then the first check that could tell
    registry = CollectorRegistry(auto_describe=False)
    registry.register(wiring.collector())
    text = generate_latest(registry).decode()
    assert 'vllm_watchdog_known_answer_ok{instance="192.0.2.10:8000",job="vllm",target="t0"} 1.0' in text
    assert (
        'vllm_watchdog_known_answer_checks_total{instance="192.0.2.10:8000",job="vllm",outcome="skipped",target="t0"} 1.0'
        in text
    )
    rows = store.history(limit=10)
    assert [(r.action, r.trigger, r.target) for r in rows] == [("known-answers", "baseline_learnt", "t0")]
    paused = rt.state.endpoints["paused"]  # the monitor's engine state: paused on purpose
    paused.available, paused.value, paused.answered_at = True, True, T0 + 125
    sent = len(engine.requests)
    skipped = await wiring.answers.check(rt.config, T0 + 125)
    assert "paused on purpose" in skipped.reason and len(engine.requests) == sent  # no request would wake it
    paused.value = False
    baseline = wiring.answers.status("t0").baseline
    reloaded = parse_config(CONFIG.replace("100000", "90000"), "/etc/w.yml")
    mon.apply(reloaded, NO_RULES, now=T0 + 130)
    wiring.apply(reloaded)
    assert wiring.answers.status("t0").baseline is baseline
    assert wiring.answers.config.max_tokens_per_minute == 90000
