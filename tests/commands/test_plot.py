"""`replay --plot`: a real watchdog records a short incident (queue backs up, throttle, recovery, canary
failures); the timeline built from the recording holds the metric lines, the alert span and the audited
action, and the PNG is written. The data is checked, not the pixels."""

from __future__ import annotations

import math
import re
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.apitargets import targets
from tests.support.configs import target, write_config
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import ROOT, free_port
from tests.support.watchdogproc import poll
from vllm_watchdog.commands.plot import (
    PANELS,
    ActionMark,
    AlertSpan,
    PlotError,
    alert_spans,
    build_timeline,
)
from vllm_watchdog.commands.plotpng import action_entries, render_png
from vllm_watchdog.commands.replay import Transition
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.ruler.files import parse_rule_file

pytestmark = pytest.mark.spread  # each test records its own run: any worker may run any of them

SPEC_BODY = (ROOT / "tests" / "fixtures" / "vllm-0.32.0-specdecode-metrics.txt").read_text()
RULES = """groups:
  - name: q
    rules:
      - alert: Backlog
        expr: vllm:num_requests_waiting > 5
        for: 2s
        labels: {severity: warning}
"""


def body(step: int, waiting: int) -> str:
    """The real vLLM 0.32 spec-decode body, with the queue and counters moved as a server would move them."""
    values = {
        "vllm:num_requests_waiting": waiting,
        "vllm:num_requests_running": 4 if waiting else 1,
        "vllm:generation_tokens_total": 192 + 40 * step,
        "vllm:spec_decode_num_draft_tokens_total": 139 + 20 * step,
        "vllm:spec_decode_num_accepted_tokens_total": 128 + 5 * step,  # 25% of new drafts accepted
    }
    text = SPEC_BODY
    for name, v in values.items():
        text = re.sub(rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", rf"\g<1> {float(v)}", text, flags=re.M)
    return text


@pytest.fixture
def recording(
    tmp_path: Path, fault: FaultServer, cleanup: list[Callable[[], None]]
) -> tuple[Path, Path, Path]:
    """(config, recording, state_dir) of a run: backlog -> throttle -> recovery, then 3 s of canary failures."""
    port, gport = free_port(), free_port()
    api = f"http://127.0.0.1:{port}"
    (tmp_path / "q.rules.yml").write_text(RULES)
    cfg = write_config(
        tmp_path,
        target(fault.url, canary={"enabled": True, "interval": "1s", "timeout": "2s"}),
        port=port,
        token=None,
        rest=f"""
rule_files: [q.rules.yml]
gateway: {{listen: 127.0.0.1:{gport}, max_in_flight: 16}}
actions:
  squeeze: {{type: throttle, limit: 4}}
routes:
  - {{match: {{alertname: Backlog}}, actions: [squeeze]}}
""",
    )
    step = 0

    def serve(waiting: int) -> None:
        nonlocal step
        step += 1
        fault.set("/metrics", body(step, waiting))

    fault.vllm_like(body(0, 9), model="tiny-llama")
    rec, log = tmp_path / "scrape.log", tmp_path / "watchdog.log"
    with log.open("ab") as out:
        wd = subprocess.Popen(
            [sys.executable, "-m", "vllm_watchdog", "run", "--config", str(cfg), "--record", str(rec)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    cleanup.append(lambda: (wd.kill(), wd.wait(10)))

    def moving(until: Callable[[object], bool], url: str, waiting: int, what: str) -> None:
        for _ in range(60):  # at most 60 polls of 1 s, the counters moving each time
            serve(waiting)
            try:
                poll(url, until, 1.0, what, log)
                return
            except AssertionError:
                continue
        raise AssertionError(f"{what} not within 60s; watchdog log: {log.read_text()[-2000:]}")

    moving(lambda j: bool(j["data"]["history"]), api + "/api/v1/actions", 9, "the throttle")
    moving(lambda j: not j["data"]["alerts"], api + "/api/v1/alerts", 0, "the backlog resolving")
    fault.set("/v1/completions", b"boom", status=500)
    moving(
        lambda j: targets(j)[0]["canary"]["success"] is False, api + "/api/v1/targets", 0, "canary failing"
    )
    time.sleep(3)  # a few failed canaries (1 s apart) to mark
    fault.vllm_like(body(step + 1, 0), model="tiny-llama")
    moving(lambda j: targets(j)[0]["canary"]["success"] is True, api + "/api/v1/targets", 0, "canary back")
    wd.send_signal(signal.SIGTERM)
    assert wd.wait(20) == 0
    return cfg, rec, tmp_path / "state"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header (and proof that it is a PNG)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_timeline_of_a_recorded_incident(recording: tuple[Path, Path, Path], tmp_path: Path) -> None:
    cfg, rec, state = recording
    config = parse_config(cfg.read_text(), str(cfg))
    groups = tuple(parse_rule_file(RULES, str(cfg.parent / "q.rules.yml")))
    tl, _ = build_timeline(config, groups, str(rec), audit=str(state))

    waiting = tl.series["requests"]["waiting"][1]
    assert 9.0 in waiting and 0.0 in waiting
    acceptance = [v for v in tl.series["spec"]["acceptance"][1] if not math.isnan(v)]
    assert acceptance and all(abs(v - 0.25) < 1e-9 for v in acceptance)  # 5 accepted of 20 drafted
    assert any(v > 0 for v in tl.series["tokens"]["generated"][1] if not math.isnan(v))
    failed = tl.series["canary"]["failed"]
    assert failed[1].count(0.0) >= 2  # the canary failures are there to mark

    # A scrape that a loaded machine lets time out goes stale and may cut a span short (then a second one
    # starts): the first span that fired is the one to check, and the last one ended.
    fired = [s for s in tl.spans if s.alertname == "Backlog" and s.firing_at is not None]
    assert fired and fired[-1].ended_at is not None, tl.spans
    span, ended_at = fired[0], fired[-1].ended_at
    assert span.firing_at is not None
    assert span.firing_at - span.pending_at == pytest.approx(2.0, abs=0.01)  # `for: 2s`
    (mark,) = tl.actions
    assert (mark.action, mark.type, mark.outcome, mark.alertname) == (
        "squeeze",
        "throttle",
        "succeeded",
        "Backlog",
    )
    assert span.firing_at - 1.5 <= mark.started_at <= ended_at  # the live alert and the replayed one agree
    assert "in-flight cap 16 -> 4" in mark.reason

    out = tmp_path / "timeline.png"
    shown = render_png(tl, str(out), title="test")
    assert shown[:5] == [p.key for p in PANELS[:5]]
    width, height = png_size(out)
    assert (width, height) >= (900, 700) and out.stat().st_size > 20_000


def test_the_gateway_is_recorded_and_drawn(recording: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """`run --record` logs the gateway's series too (job vllm-watchdog-gateway): the cap and the throttle."""
    cfg, rec, state = recording
    config = parse_config(cfg.read_text(), str(cfg))
    groups = tuple(parse_rule_file(RULES, str(cfg.parent / "q.rules.yml")))
    tl, _ = build_timeline(config, groups, str(rec), audit=str(state))
    cap = [v for v in tl.series["gateway"]["cap"][1] if not math.isnan(v)]
    assert cap and cap[0] == 16 and 4 in cap  # the ceiling, then the throttle's limit
    assert all(v == 0 for v in tl.series["gateway"]["in flight"][1] if not math.isnan(v))  # no requests sent
    assert "gateway" in render_png(tl, str(tmp_path / "gw.png"))


def test_cli_replay_plot_and_its_errors(recording: tuple[Path, Path, Path], tmp_path: Path) -> None:
    cfg, rec, state = recording
    out = tmp_path / "cli.png"
    base = [sys.executable, "-m", "vllm_watchdog", "replay", "--config", str(cfg), "--input", str(rec)]
    done = subprocess.run([*base, "--plot", str(out), "--audit", str(state)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert re.search(r"firing\s+Backlog\{", done.stdout) and f"plot: {out}" in done.stdout
    assert png_size(out)[0] >= 900

    no_plot = subprocess.run([*base, "--audit", str(state)], capture_output=True, text=True)
    assert no_plot.returncode == 2 and "--plot" in no_plot.stderr
    missing = subprocess.run(
        [*base, "--plot", str(out), "--audit", str(tmp_path / "nowhere")], capture_output=True, text=True
    )
    assert missing.returncode == 1 and "no audit log" in missing.stderr


def test_without_matplotlib_the_error_names_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from vllm_watchdog.commands.plot import Timeline, PlotError\n"
        "from vllm_watchdog.commands.plotpng import render_png\n"
        "try:\n    render_png(Timeline(0.0, 1.0), sys.argv[1])\n"
        "except PlotError as e:\n    print(e); sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "x.png")], capture_output=True, text=True
    )
    assert done.returncode == 3 and "vllm-watchdog[plot]" in done.stdout
    assert not (tmp_path / "x.png").exists()
    assert issubclass(PlotError, Exception)


def test_alert_spans_from_transitions() -> None:
    labels = (("alertname", "A"), ("instance", "v"))

    def tr(t: float, state: str, name: str = "A") -> Transition:
        return Transition(t, "g", name, labels, state, 1.0)

    spans = alert_spans(
        [
            tr(10, "pending"),
            tr(12, "firing"),
            tr(20, "resolved"),
            tr(30, "pending"),
            tr(31, "inactive"),  # pending that never fired
            tr(40, "firing", "B"),  # no `for`: firing at once, still firing at the end
        ]
    )
    assert spans == [
        AlertSpan("A", labels, 10, 12, 20),
        AlertSpan("A", labels, 30, None, 31),
        AlertSpan("B", labels, 40, 40, None),
    ]


def test_repeated_actions_share_a_numbered_entry_and_skips_are_not_drawn() -> None:
    def mark(t: float, action: str, outcome: str = "succeeded", trigger: str = "alert") -> ActionMark:
        return ActionMark(t, t + 1, action, "throttle_session", "v", trigger, outcome, "why", "Loop")

    marks = [
        mark(100, "breaker"),
        mark(160, "breaker"),  # the alert is re-sent every minute: same entry
        mark(170, "draft", "skipped"),  # rails said no: not drawn
        mark(200, "draft", "succeeded", "restore"),
        mark(400, "breaker"),  # long after: a new entry
    ]
    entries = action_entries(marks, x0=50)
    assert [(e.number, e.at, len(e.marks)) for e in entries] == [(1, 50, 2), (2, 150, 1), (3, 350, 1)]
    assert entries[0].text == "1  +50s  breaker (x2) [alert Loop] succeeded: why"
    assert "[restore after Loop resolved]" in entries[1].text
