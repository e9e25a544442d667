"""The soak's two-minute version (bench/soak.py, same code path): the bundled rules and default actions, in
enforce mode, watch the shared healthy vLLM under realistic agent traffic through the gateway, and nothing
fires.

Two minutes on the rules' clock, in one minute: the soak's time scale of 2 halves every window, offset and
`for:` of the bundled rules, so each rule's window fills and its `for:` passes as in two minutes at full
scale; the agents think and idle half as long, so requests come at least as fast (vLLM answers no faster,
and the scrape, evaluation and canary intervals stay). It runs against the shared `vllm_server` (a
watch-only target: a restart an alert routed would be refused, and the refusal is an audit row, which fails
the test as an action would). That server runs one sequence at a time, so the soak sends 3 agents, with
think time: at most 2 requests wait in vLLM, far below VLLMQueueSaturated's 10, and the minutes-long windows
of the latency rules cannot fill in two minutes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.vllm_server import VllmServer
from vllm_watchdog.config.model import bundled_rules_dir
from vllm_watchdog.ruler.files import history_needed, load_rule_files

pytestmark = pytest.mark.vllm

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCALE = 2.0  # the rules' and the agents' clock runs this much faster (bench/soak.py --time-scale)


def soak_module() -> Any:
    """bench/soak.py (a script, with its sibling _soak_traffic.py on the path)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import soak

    return soak


def test_two_minutes_of_agent_traffic_fire_nothing(vllm_server: VllmServer, tmp_path: Path) -> None:
    soak = soak_module()
    opts = soak.Options(
        duration=120.0 / SCALE,
        warmup=30.0 / SCALE,
        sample_interval=5.0 / SCALE,
        time_scale=SCALE,
        agents=3,
        vllm_url=vllm_server.url,
        ready_timeout=120.0,
        workdir=tmp_path,
        pauses=False,  # the shared vLLM is not in dev mode; bench/soak.py pauses its own
        loopers=False,  # their breakers are right actions; this test wants no action at all
    )
    report = soak.run_soak(opts)
    soak.print_report(report)  # shown by pytest when the test fails
    context = f"see {tmp_path / 'watchdog.log'}"

    assert report["actions"] == [], (report["actions"], context)
    fired_critical = [
        a for a in report["alerts"] if a["severity"] == "critical" and (a["fired"] or a["polled_firing"])
    ]
    assert fired_critical == [], (report["alert_episodes"], context)
    polls = report["alert_polls"]
    assert polls["polls"] >= 30 and polls["errors"] == 0, polls  # alerts were sampled all along (every 1 s)
    requests = report["requests"]
    assert requests["ok"] > 0, requests
    assert requests["errors"] == 0, requests["by_kind"]
    # The mix: agent i starts with kind i (coder, research, json), however slow the server; the coding agents
    # re-run their tests, the traffic that once found a false alarm.
    mix = requests["sessions"]
    assert {"coder", "research", "json"} <= set(mix), mix
    assert (
        requests["by_kind"].get("coder/json", {}).get("ok", 0)
        + requests["by_kind"].get("coder/stream", {}).get("ok", 0)
        > 0
    ), requests["by_kind"]
    assert report["verdict"]["pass"], report["verdict"]

    res = report["resources"]
    assert len(res["samples"]) >= 20, res["samples"]  # one every 2.5 s for a minute
    assert res["cpu_seconds"] > 0
    assert 0 < res["rss_end_mb"] < 3 * res["rss_warm_mb"], res  # generous: no runaway growth


def test_the_time_scale_divides_every_clock_duration_of_the_bundled_rules_and_nothing_else(
    tmp_path: Path,
) -> None:
    soak_module()  # bench/ on the path
    from _soak_scale import write_scaled_rules

    duration = re.compile(r"\b(?:\d+(?:ms|[smhdwy]))+\b")
    for name in ("vllm.rules.yml", "gateway.rules.yml"):
        source = bundled_rules_dir() / name
        full = load_rule_files([str(source)])
        fast = load_rule_files([str(write_scaled_rules(source, tmp_path / name, SCALE))])
        pairs = [
            (a, b) for g, h in zip(full, fast, strict=True) for a, b in zip(g.rules, h.rules, strict=True)
        ]
        assert pairs
        for a, b in pairs:
            assert (b.name, b.for_, b.keep_firing_for) == (a.name, a.for_ / SCALE, a.keep_firing_for / SCALE)
            assert history_needed(b.expr) == pytest.approx(history_needed(a.expr) / SCALE), (a.expr, b.expr)
            # thresholds, matchers and everything else as they were
            assert duration.sub("D", b.expr) == duration.sub("D", a.expr), (a.expr, b.expr)
            assert (b.labels, b.annotations) == (a.labels, a.annotations)
