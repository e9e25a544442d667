from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest

from tests.support.clock import T0
from tests.support.configs import watchdog_yaml
from tests.support.faultserver import FaultServer
from vllm_watchdog.cli import main
from vllm_watchdog.commands.replay import Replayer, run_replay
from vllm_watchdog.config.model import Config, parse_config
from vllm_watchdog.notifiers.alert import OutgoingAlert
from vllm_watchdog.ruler.files import RuleGroup, parse_rule_file
from vllm_watchdog.scrapelog import ScrapeLog, iter_records
from vllm_watchdog.sources.scrape import ScrapeTarget
from vllm_watchdog.store import SampleStore, is_stale, make_labels

RULES = """
groups:
  - name: vllm
    rules:
      - alert: QueueHigh
        expr: vllm:num_requests_waiting > 5
        for: 5s
        labels: {severity: warning}
      - alert: TargetDown
        expr: up == 0
        for: 2s
      - alert: CanaryFailing
        expr: vllm_watchdog_canary_success == 0
"""


def config(tmp_path: Path) -> Config:
    text = watchdog_yaml(token=None)  # the fast intervals alone
    path = tmp_path / "c.yml"
    path.write_text(text)
    return parse_config(text, str(path))


def groups() -> tuple[RuleGroup, ...]:
    return tuple(parse_rule_file(RULES, "rules.yml"))


def body(waiting: float) -> str:
    return (
        "# HELP vllm:num_requests_waiting Requests waiting.\n# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
        # a legacy name, aliased on ingest exactly as live scraping does
        f'vllm:gpu_cache_usage_perc{{model_name="m"}} {waiting / 100}\n'
    )


def record_synthetic(path: str) -> None:
    """60 s of one target: a queue builds up (t=10..29), then the target is down (t=40..49)."""
    log = ScrapeLog(path, clock=lambda: T0)
    for i in range(60):
        t = T0 + i + 0.25
        if 40 <= i < 50:
            log.record_scrape(
                t=t, job="vllm", instance="v0", labels={"env": "lab"}, body=None, error="refused"
            )
        else:
            waiting = 9 if 10 <= i < 30 else 1
            log.record_scrape(t=t, job="vllm", instance="v0", labels={"env": "lab"}, body=body(waiting))
        ok = not 20 <= i < 23
        log.record_probe(
            t=t, probe="canary", job="vllm", instance="v0", labels={"env": "lab"}, ok=ok, latency=0.1
        )
        log.flush()
    log.close()


def timeline(text: str) -> list[tuple[str, str]]:
    """(state, alertname) per timeline line."""
    out = []
    for line in text.splitlines():
        if line.startswith("20"):
            _, state, alert = line.split()[:3]
            out.append((state, alert.split("{")[0]))
    return out


def test_synthetic_recording_fires_and_resolves(tmp_path: Path) -> None:
    rec = str(tmp_path / "rec")
    record_synthetic(rec)
    out = io.StringIO()
    assert run_replay(config(tmp_path), groups(), rec, out) == 0
    text = out.getvalue()
    events = timeline(text)
    assert [e for e in events if e[1] == "QueueHigh"] == [
        ("pending", "QueueHigh"),
        ("firing", "QueueHigh"),
        ("resolved", "QueueHigh"),
    ]
    assert [e for e in events if e[1] == "CanaryFailing"] == [
        ("firing", "CanaryFailing"),
        ("resolved", "CanaryFailing"),
    ]
    assert [e[0] for e in events if e[1] == "TargetDown"] == ["pending", "firing", "resolved"]
    line = next(x for x in text.splitlines() if "firing    QueueHigh" in x)
    labels = 'env="lab",instance="v0",job="vllm",model_name="m",severity="warning",target="v0"'
    assert f"QueueHigh{{{labels}}} value=9" in line
    assert "[rules.yml;vllm]" in line
    assert "replayed 60 probe, 60 scrape over 2023-11-14T22:13:20.250Z .. 2023-11-14T22:14:19.250Z" in text
    assert "QueueHigh: 1 pending, 1 firing, 1 resolved" in text and "active at the end: none" in text


def test_simulated_clock_honours_for_and_the_evaluation_interval(tmp_path: Path) -> None:
    rec = str(tmp_path / "rec")
    record_synthetic(rec)
    rp = Replayer(config(tmp_path), groups())
    records = list(iter_records(rec))
    rp.start(records[0].t)
    for r in records:
        rp.advance(r.t)
        rp.ingest(r)
    rp.advance(records[-1].t, inclusive=True)
    queue = {tr.state: tr.t for tr in rp.transitions if tr.alertname == "QueueHigh"}
    assert T0 + 10.25 <= queue["pending"] < T0 + 11.25  # the first evaluation after the queue is seen
    assert queue["firing"] - queue["pending"] == pytest.approx(5.0)
    assert T0 + 30.25 <= queue["resolved"] < T0 + 31.25
    down = {tr.state: tr.t for tr in rp.transitions if tr.alertname == "TargetDown"}
    assert down["firing"] - down["pending"] == pytest.approx(2.0)
    assert rp.stats.evaluations in (59, 60)  # one a second over 59 s, depending on the phase
    times = [tr.t for tr in rp.transitions]
    assert times == sorted(times) and all(round((t - times[0]) % 1.0, 6) in (0.0, 1.0) for t in times)


def test_window_and_dispatch_seam(tmp_path: Path) -> None:
    rec = str(tmp_path / "rec")
    record_synthetic(rec)
    sent: list[tuple[float, list[OutgoingAlert]]] = []
    out = io.StringIO()
    code = run_replay(
        config(tmp_path),
        groups(),
        rec,
        out,
        start=T0 + 35,
        end=T0 + 45,
        dispatch=lambda t, alerts: sent.append((t, alerts)),
    )
    assert code == 0
    states = timeline(out.getvalue())
    assert ("resolved", "QueueHigh") not in states  # it resolved before the window
    assert ("pending", "TargetDown") in states and ("firing", "TargetDown") in states
    assert all(T0 + 35 <= t <= T0 + 45 for t, _ in sent)
    assert any(
        a.labels["alertname"] == "TargetDown" and a.state == "firing" for _, alerts in sent for a in alerts
    )


def test_unreadable_recording_exits_1(tmp_path: Path) -> None:
    err = io.StringIO()
    assert run_replay(config(tmp_path), groups(), str(tmp_path / "none"), io.StringIO(), err=err) == 1
    assert "no scrape log segments" in err.getvalue()


def bits(v: float) -> bytes:
    return struct.pack("<d", v)


def snapshot(store: SampleStore) -> dict[object, list[tuple[int, bytes]]]:
    return {s.labels: [(t, bits(v)) for t, v in zip(s.ts, s.vals, strict=True)] for s in store.select(None)}


@pytest.mark.anyio
async def test_replay_rebuilds_the_store_a_live_scraper_built(
    tmp_path: Path, fault: FaultServer, vllm_payload: str
) -> None:
    """Scrape the fault server live while recording; the replayed store equals the live one, staleness and up included."""
    rec = str(tmp_path / "rec")
    log = ScrapeLog(rec, clock=lambda: T0)
    live = SampleStore(3600)
    payloads = [vllm_payload, vllm_payload.replace("vllm:num_requests_waiting{", "vllm:gone{"), vllm_payload]
    target = ScrapeTarget(
        url=fault.url + "/metrics",
        job="vllm",
        instance="127.0.0.1:8000",
        store=live,
        timeout=1.0,
        sample_limit=100_000,
        body_size_limit=1 << 22,
        extra_labels={"env": "lab", "target": "vllm-0"},  # as the monitor labels a target
        recorder=log,
    )
    for i, payload in enumerate(payloads):
        fault.set("/metrics", payload)
        await target.scrape(T0 + i)
    fault.set("/metrics", "broken{", status=200)
    await target.scrape(T0 + 3)  # a parse error: recorded as a body, judged again on replay
    fault.set("/metrics", b"", status=503)
    await target.scrape(T0 + 4)
    fault.set("/metrics", "a 1\n")
    await target.scrape(T0 + 5)
    target.forget(T0 + 6)
    log.close()
    rp = Replayer(config(tmp_path), ())
    for r in iter_records(rec):
        rp.ingest(r)
    ours, theirs = snapshot(rp.store), snapshot(live)
    info = make_labels(
        "vllm_watchdog_target_info", {"job": "vllm", "instance": "127.0.0.1:8000", "target": "vllm-0"}
    )
    assert len(ours.pop(info)) == 6  # the self feed's, which the live scraper alone does not write
    assert (
        len(ours) > 400 and ours == theirs
    )  # scrape_duration_seconds too: the recorded duration is replayed
    up = next(v for k, v in ours.items() if ("__name__", "up") in k)  # type: ignore[operator]
    assert [struct.unpack("<d", b)[0] for _, b in up[:6]] == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert is_stale(struct.unpack("<d", up[6][1])[0])  # forget() on reload


def test_cli_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = str(tmp_path / "rec")
    record_synthetic(rec)
    (tmp_path / "rules.yml").write_text(RULES)
    cfg = tmp_path / "c.yml"
    cfg.write_text("global: {evaluation_interval: 1s}\nrule_files: [rules.yml]\n")
    assert main(["replay", "--config", str(cfg), "--input", rec]) == 0
    assert ("firing", "QueueHigh") in timeline(capsys.readouterr().out)


def test_a_recording_from_before_the_target_label_gets_it(tmp_path: Path) -> None:
    """job "vllm" and the target's name as instance, as recorded before: the name becomes `target` too."""
    rec = str(tmp_path / "rec")
    record_synthetic(rec)
    rp = Replayer(config(tmp_path), ())
    for r in iter_records(rec):
        rp.ingest(r)
    labels = {"job": "vllm", "instance": "v0", "target": "v0"}
    assert [s.labels for s in rp.store.select("vllm:num_requests_waiting")] == [
        make_labels("vllm:num_requests_waiting", {**labels, "env": "lab", "model_name": "m"})
    ]
    assert [s.labels for s in rp.store.select("vllm_watchdog_canary_success")] == [
        make_labels("vllm_watchdog_canary_success", {**labels, "env": "lab"})
    ]
    assert [s.labels for s in rp.store.select("vllm_watchdog_target_info")] == [
        make_labels("vllm_watchdog_target_info", labels)
    ]
