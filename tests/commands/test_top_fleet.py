"""`vllm-watchdog top --fleet`: the frame rendered from recorded /api/v1/fleet JSON (members, holds, what a
member published shown bounded and printable), a watchdog in no fleet, and exit 4 when etcd behind the API
cannot be read. The same view against real watchdogs is in tests/fleet/test_fleet_watchdogs.py."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

from tests.support.faultserver import FaultServer
from vllm_watchdog.commands.top import run_top
from vllm_watchdog.commands.topfleet import FleetSnapshot, render_fleet
from vllm_watchdog.exitcodes import EXIT_OK, EXIT_UNREACHABLE
from vllm_watchdog.fleet.members import MAX_SHOWN

NOW = 1_700_000_100.0


def fleet(**over: Any) -> dict[str, Any]:
    """/api/v1/fleet's data as a watchdog in a fleet answers it (shape copied from FleetBudget.group)."""
    doc: dict[str, Any] = {
        "enabled": True,
        "group": "llama-70b",
        "member": "gpu-1:9460",
        "max_disrupted": "1",
        "correlated_share": 0.5,
        "refusal": "",
        "lease": 7587869433434581,
        "holds": [{"alertname": "VLLMEngineHung", "members": ["gpu-1:9460", "gpu-2:9460"], "live": 3}],
        "members": [
            {
                "member": "gpu-1:9460",
                "since": NOW - 2,
                "targets": ["vllm-0"],
                "alerts": ["VLLMEngineHung (vllm-0)"],
                "running": {},
                "waiting": {},
            },
            {
                "member": "gpu-2:9460",
                "since": NOW - 1,
                "targets": ["vllm-0", "vllm-1"],
                "alerts": ["VLLMEngineHung (vllm-1)"],
                "running": {"vllm-0": "restart"},
                "waiting": {"vllm-1": "restart"},
            },
            {"member": "gpu-3:9460", "since": NOW - 3, "targets": ["vllm-0"], "alerts": [], "running": {}},
        ],
    }
    return doc | over


def test_the_frame_shows_the_group_its_holds_and_one_row_per_member() -> None:
    text = render_fleet(FleetSnapshot("http://127.0.0.1:9460", fleet()), NOW)
    lines = text.splitlines()
    assert lines[0] == "vllm-watchdog top --fleet  http://127.0.0.1:9460  22:15:00Z"
    assert lines[2] == (
        "GROUP  llama-70b  3 live members  max_disrupted 1  correlated_share 50%  etcd ok (read by gpu-1:9460)"
    )
    assert lines[3] == (
        "HOLD  VLLMEngineHung fired by 2 of 3 live members (gpu-1:9460, gpu-2:9460): "
        "no disruptive action starts in the group"
    )
    rows = {line.split()[0]: line for line in lines[5:]}
    assert rows["MEMBER"].split("  ")[0] == "MEMBER" and "WAITING FOR A SLOT" in rows["MEMBER"]
    assert "vllm-0, vllm-1" in rows["gpu-2:9460"] and "vllm-0: restart" in rows["gpu-2:9460"]
    assert "vllm-1: restart" in rows["gpu-2:9460"] and rows["gpu-2:9460"].endswith("1s ago")
    assert rows["gpu-3:9460"].split()[1:] == ["vllm-0", "-", "-", "-", "3s", "ago"]
    assert "\x1b" not in text
    coloured = render_fleet(FleetSnapshot("http://127.0.0.1:9460", fleet()), NOW, color=True)
    assert "\x1b[31mHOLD  VLLMEngineHung" in coloured


def test_what_members_published_is_shown_printable_and_bounded() -> None:
    hostile = {
        "member": "evil\x1b[2J",
        "since": "yesterday",
        "targets": ["t" * 10_000],
        "alerts": {"nested": ["\x07" * 3]},
        "running": 7,
    }
    doc = fleet(members=[hostile, "not a member", {"member": "quiet"}], holds=[{"alertname": "X"}, 3])
    text = render_fleet(FleetSnapshot("u", doc), NOW)
    assert "\x1b" not in text and "\x07" not in text
    assert "evil?[2J" in text and "nested: ???" in text
    assert max(len(cell) for line in text.splitlines() for cell in line.split()) <= MAX_SHOWN
    assert "HOLD  X fired by 0 of ? live members" in text


def test_a_watchdog_in_no_fleet_and_one_whose_etcd_is_down() -> None:
    text = render_fleet(FleetSnapshot("u", {"enabled": False}), NOW)
    assert "this watchdog is in no fleet" in text
    down = fleet(refusal="fleet: etcd cannot be relied on: no etcd endpoint answered", members=[], holds=[])
    text = render_fleet(FleetSnapshot("u", down), NOW)
    assert "etcd: fleet: etcd cannot be relied on: no etcd endpoint answered" in text
    assert "no live member in etcd" in text and "correlated_share 50%" in text
    off = render_fleet(FleetSnapshot("u", fleet(correlated_share=None)), NOW)
    assert "correlated_share off" in off


def test_run_top_fleet_prints_frames_and_exits_4_when_etcd_cannot_be_read(
    fault: FaultServer, capsys: pytest.CaptureFixture[str]
) -> None:
    fault.set("/api/v1/fleet", {"status": "success", "data": fleet()})
    out = io.StringIO()
    status = run_top(fault.url, interval=1.0, once=True, out=out, fleet=True, clock=lambda: NOW)
    assert status == EXIT_OK and "HOLD  VLLMEngineHung" in out.getvalue()
    error = {
        "status": "error",
        "errorType": "unavailable",
        "error": "etcd cannot be read: no etcd endpoint answered",
    }
    fault.set("/api/v1/fleet", error, status=503)
    assert run_top(fault.url, interval=1.0, once=True, out=sys.stdout, fleet=True) == EXIT_UNREACHABLE
    assert "etcd cannot be read: no etcd endpoint answered" in capsys.readouterr().err
