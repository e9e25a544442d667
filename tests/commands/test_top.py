"""`vllm-watchdog top`: the frame rendered from recorded API JSON, and `--once` against a real watchdog."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.support.apitargets import targets
from tests.support.configs import AUTH, FAST, target, write_config
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import ROOT, free_port
from tests.support.watchdogproc import poll, start_watchdog
from vllm_watchdog.commands.top import Snapshot, increase, render, spec_acceptance, token_rate

NOW = 1_700_000_100.0
FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.32.0-metrics.txt"


def _counter(start: float, per_second: float, n: int = 31) -> list[tuple[float, float]]:
    return [(NOW - 30 + i, start + per_second * i) for i in range(n)]


def snapshot(**over: Any) -> Snapshot:
    """API answers as a running watchdog gives them (shapes copied from /api/v1/*)."""
    vllm = {"instance": "vllm-0", "job": "vllm", "model_name": "tiny-llama"}
    doc: dict[str, Any] = {
        "url": "http://127.0.0.1:9460",
        "targets": [
            {
                "labels": {"instance": "vllm-0", "job": "vllm"},
                "scrapePool": "vllm",
                "health": "up",
                "watchdog": {
                    "name": "vllm-0",
                    "url": "http://127.0.0.1:8000",
                    "healthProbe": {"up": True, "latency": 0.002, "lastError": None},
                    "canary": {"success": False, "latency": 3.0, "lastError": "timeout after 3s"},
                },
            }
        ],
        "alerts": [
            {
                "labels": {"alertname": "VLLMQueueSaturated", "instance": "vllm-0", "severity": "warning"},
                "state": "firing",
                "activeAt": "2023-11-14T22:14:40Z",  # NOW - 20 s
                "value": "2.8e+01",
            },
            {
                "labels": {"alertname": "VLLMEngineHung", "instance": "vllm-0", "severity": "critical"},
                "state": "pending",
                "activeAt": "2023-11-14T22:14:55Z",
                "value": "0e+00",
            },
        ],
        "actions": {
            "paused": {"paused": False},
            "history": [
                {
                    "action": "throttle-gateway",
                    "type": "throttle",
                    "trigger": "alert",
                    "labels": {"alertname": "VLLMQueueSaturated"},
                    "outcome": "succeeded",
                    "reason": "in-flight cap 32 -> 8",
                    "started_at": NOW - 10,
                },
                {
                    "action": "graceful-restart",
                    "type": "restart",
                    "trigger": "alert",
                    "labels": {"alertname": "VLLMEngineHung"},
                    "outcome": "running",
                    "reason": "",
                    "started_at": NOW - 2,
                },
            ],
        },
        "gateway": {
            "target": "vllm-0",
            "listen": "127.0.0.1:8080",
            "limit": 8,
            "ceiling": 32,
            "in_flight": 8,
            "draining": False,
            "breakers": {"agent-loop": {"seconds_left": 95.2, "reason": "alert GatewaySessionToolCallLoop"}},
        },
        "series": {
            "vllm:num_requests_running": [(vllm, [(NOW - 1, 4.0)])],
            "vllm:num_requests_waiting": [(vllm, [(NOW - 2, 28.0), (NOW - 1, 4.0)])],
            "vllm:kv_cache_usage_perc": [(vllm, [(NOW - 1, 0.125)])],
            "vllm:generation_tokens_total": [(vllm, _counter(1000.0, 50.0))],
            "vllm:spec_decode_num_accepted_tokens_total": [(vllm, _counter(0.0, 9.0))],
            "vllm:spec_decode_num_draft_tokens_total": [(vllm, _counter(0.0, 10.0))],
            "vllm_watchdog_gateway_queue_length": [
                ({"target": "vllm-0", "priority": "interactive"}, [(NOW - 1, 20.0)]),
                ({"target": "vllm-0", "priority": "batch"}, [(NOW - 1, 3.0)]),
            ],
        },
    }
    doc.update(over)
    return Snapshot(**doc)


def test_frame_shows_targets_gateway_alerts_actions_and_breakers() -> None:
    frame = render(snapshot(), NOW)
    lines = frame.splitlines()
    row = next(ln.split() for ln in lines if ln.startswith("vllm-0"))
    # TARGET UP HEALTH(ok 2ms) CANARY(FAIL) RUN WAIT KV GEN SPEC ANSWERS(- : an API without known answers)
    assert row == ["vllm-0", "up", "ok", "2ms", "FAIL", "4", "4", "12.5%", "50", "0.90", "-"], row
    assert "in-flight/cap 8/8 (ceiling 32)  queue 23  draining no" in frame
    assert any("breaker open" in ln and "session agent-loop" in ln and "95s left" in ln for ln in lines)
    assert "ALERTS  1 firing, 1 pending" in frame
    assert any(ln.split()[:2] == ["FIRING", "VLLMQueueSaturated{instance=vllm-0}"] for ln in lines)
    assert "active 20s" in next(ln for ln in lines if "VLLMQueueSaturated{" in ln)
    actions = [ln.split() for ln in lines if "throttle-gateway" in ln or "graceful-restart" in ln]
    assert actions[0][1:4] == ["throttle-gateway", "throttle", "succeeded"] and "32" in actions[0]
    assert actions[1][1:4] == ["graceful-restart", "restart", "running"]
    assert "\x1b[" not in frame  # no colour unless asked


def test_colour_only_when_asked_and_time_comes_from_the_caller() -> None:
    coloured = render(snapshot(), NOW, color=True)
    assert "\x1b[31mFAIL" in coloured and "\x1b[0m" in coloured
    later = render(snapshot(), NOW + 100)
    assert "active 2m" in later  # the age moves with the injected clock, nothing else does
    assert "GEN TOK/S" in later and "-" in next(ln for ln in later.splitlines() if ln.startswith("vllm-0"))


def test_missing_pieces_render_as_dashes_and_notes() -> None:
    bare = snapshot(gateway=None, alerts=[], actions={"history": []}, series={})
    frame = render(bare, NOW)
    row = next(ln.split() for ln in frame.splitlines() if ln.startswith("vllm-0"))
    assert row[5:] == ["-", "-", "-", "-", "-", "-"]
    assert "GATEWAY  none configured" in frame
    assert "ALERTS  0 firing, 0 pending" in frame and "none yet" in frame


def _with_answers(**own: Any) -> Snapshot:
    """The snapshot with one more target whose `watchdog` object carries these known-answer fields."""
    base = snapshot()
    extra = {
        "labels": {"instance": "vllm-1", "job": "vllm"},
        "health": "up",
        "watchdog": {"name": "vllm-1", **own},
    }
    return snapshot(targets=[*base.targets, extra])


def test_known_answers_column_shows_learning_ok_diverged_quarantined_and_off() -> None:
    def cell(**own: Any) -> str:
        frame = render(_with_answers(**own), NOW)
        return next(ln for ln in frame.splitlines() if ln.startswith("vllm-1")).split("  ")[-1].strip()

    learning = {"state": "learning", "divergence": None, "tolerance": 0.01}
    ok = {"state": "ok", "divergence": 0.0021, "tolerance": 0.01}
    wrong = {"state": "diverged", "divergence": 0.3127, "tolerance": 0.0128}
    assert cell(knownAnswers=learning, quarantined=False) == "learning"
    assert cell(knownAnswers=ok, quarantined=False) == "ok 0.0021/0.01"
    assert cell(knownAnswers=wrong, quarantined=False) == "DIVERGED 0.313/0.0128"
    assert cell(knownAnswers=wrong, quarantined=True) == "QUARANTINED"
    assert cell(knownAnswers={"state": "unknown"}, quarantined=False) == "unknown"
    assert cell(knownAnswers=None, quarantined=False) == "off"  # not checked (no canary)
    coloured = render(_with_answers(knownAnswers=wrong, quarantined=False), NOW, color=True)
    assert "\x1b[31mDIVERGED 0.313/0.0128" in coloured


def test_counter_windows_handle_resets_and_empty_drafts() -> None:
    # 10/s for 10 s, the server restarts (counter back to 0) and counts 5 more
    samples = [(NOW - 20 + i, 10.0 * i) for i in range(11)] + [(NOW - 9, 0.0), (NOW - 8, 5.0)]
    assert increase([samples], NOW) == (105.0, 12.0)
    assert increase([[(NOW - 100, 1.0), (NOW - 1, 2.0)]], NOW) is None  # one point in the window
    snap = snapshot()
    flat = {
        "vllm:spec_decode_num_draft_tokens_total": [({"instance": "vllm-0"}, [(NOW - 5, 7.0), (NOW, 7.0)])]
    }
    assert spec_acceptance(snapshot(series=flat), "vllm-0", NOW) is None  # no drafts: no ratio
    assert spec_acceptance(snap, "vllm-0", NOW) == 0.9
    assert token_rate(snap, "other", NOW) is None


def _top(url: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "vllm_watchdog", "top", "--once", "--url", url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_once_against_a_running_watchdog(
    tmp_path: Path, fault: FaultServer, cleanup: list[Callable[[], None]]
) -> None:
    """A real watchdog with its gateway, scraping a server that answers with a real vLLM 0.32 body."""
    fault.vllm_like(FIXTURE.read_text(), model="tiny-llama")  # 1 running, 7 waiting
    port, gport = free_port(), free_port()
    api = f"http://127.0.0.1:{port}"
    (tmp_path / "q.rules.yml").write_text(
        "groups:\n  - name: q\n    rules:\n"
        "      - alert: Backlog\n        expr: vllm:num_requests_waiting > 5\n"
        "        labels: {severity: warning}\n"
    )
    cfg = write_config(
        tmp_path,
        target(fault.url, canary={"enabled": True, "interval": "1s", "timeout": "2s"}),
        port=port,
        global_settings={**FAST, "keep_unreferenced": True},
        rest=f"""
rule_files: [q.rules.yml]
gateway: {{listen: 127.0.0.1:{gport}, max_in_flight: 16, sessions: {{breaker_duration: 7m}}}}
actions:
  squeeze: {{type: throttle, limit: 4}}
routes:
  - {{match: {{alertname: Backlog}}, actions: [squeeze]}}
""",
    )
    log = tmp_path / "watchdog.log"
    wd = start_watchdog(cfg, log)
    cleanup.append(lambda: (wd.terminate(), wd.wait(20)))
    poll(api + "/api/v1/actions", lambda j: j["data"]["history"], 60, "the throttle action", log)
    resp = httpx.post(
        api + "/api/v1/gateway/breakers",
        json={"session": "looper", "duration": "10m"},
        headers=AUTH,
        timeout=5,
    )
    assert resp.status_code == 200, resp.text
    default = httpx.post(  # no duration: the configured sessions.breaker_duration
        api + "/api/v1/gateway/breakers",
        json={"session": "agent-9"},
        headers=AUTH,
        timeout=5,
    )
    assert default.status_code == 200 and default.json()["seconds"] == 420, default.text
    poll(api + "/api/v1/targets", lambda j: targets(j)[0]["canary"]["success"], 30, "a canary", log)

    done = _top(api)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    row = next(ln.split() for ln in lines if ln.startswith("vllm-0"))
    assert row[:2] == ["vllm-0", "up"] and row[4:5] == ["ok"], row
    assert row[6:9] == ["1", "7", "0.4%"], row  # the real body's running, waiting and KV usage
    assert "in-flight/cap 0/4 (ceiling 16)" in done.stdout
    assert any("breaker open" in ln and "session looper" in ln for ln in lines), done.stdout
    firing = f"Backlog{{instance={fault.url.removeprefix('http://')},target=vllm-0}}"  # Prometheus' instance
    assert any(ln.split()[:2] == ["FIRING", firing] for ln in lines), done.stdout
    assert any(ln.split()[1:4] == ["squeeze", "throttle", "succeeded"] for ln in lines), done.stdout

    wd.terminate()
    wd.wait(20)
    gone = _top(api)
    assert gone.returncode == 4 and "cannot" not in gone.stdout and api in gone.stderr
