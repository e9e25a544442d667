"""`vllm-watchdog incident list|show`: a bundle read from the config's state_dir and printed for a person,
with the action's outcome from the audit log; a damaged bundle still prints what it can, a hostile one breaks
nothing else, and nothing in a bundle reaches the terminal as a control sequence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.fake_nvml import FakeNvml
from tests.support.incidents import hostile_bundle
from vllm_watchdog.actions.incidents.bundle import Bundles
from vllm_watchdog.actions.incidents.summary import Headline, headline, summary
from vllm_watchdog.actions.store.actionstore import ACTIONS_DB, ActionStore
from vllm_watchdog.cli import main
from vllm_watchdog.safetext import shown
from vllm_watchdog.sources.nvmlsnapshot import snapshot

ID = "20231114T221320Z-vllm-0-1"
FRAMES = [
    {"name": "wait", "file": "/usr/lib/python3.11/threading.py", "line": 327},
    {"name": "get", "file": "/usr/lib/python3.11/queue.py", "line": 171},
    {"name": "_process_input_queue", "file": "/venv/site-packages/vllm/v1/engine/core.py", "line": 720},
    {"name": "run_busy_loop", "file": "/venv/site-packages/vllm/v1/engine/core.py", "line": 707},
    {"name": "run_engine_core", "file": "/venv/site-packages/vllm/v1/engine/core.py", "line": 690},
    {"name": "run", "file": "/usr/lib/python3.11/multiprocessing/process.py", "line": 108},
]


def _files() -> dict[str, bytes]:
    nv = FakeNvml(gpus=1)
    nv.gpus[0].name, nv.gpus[0].retired_pages, nv.gpus[0].clock_reasons = "NVIDIA H200", None, 0x40
    gpu = snapshot(nv) | {"last_xid": {"0": 79}}
    manifest = {
        "id": ID,
        "created": "2023-11-14T22:13:20+00:00",
        "created_at": 1_700_000_000.0,
        "target": {"name": "vllm-0", "mode": "process"},
        "action": {
            "name": "restart",
            "type": "restart",
            "trigger": "alert",
            "action_id": 1,
            "plan": "restart",
        },
        "alert": {"alertname": "VLLMEngineHung", "target": "vllm-0"},
        "firing": [
            {"labels": {"alertname": "VLLMEngineHung"}},
            {"labels": {"alertname": "VLLMEngineStalled"}},
        ],
        "budget": 5.0,
        "collection_seconds": 0.8,
        "parts": [
            {"name": "stacks", "status": "ok", "seconds": 0.5},
            {"name": "gpu", "status": "ok", "seconds": 0.1},
            {"name": "kernel", "status": "failed", "seconds": 0.1, "error": "dmesg exited 1: not permitted"},
        ],
        "vllm": {"version": "0.32.0", "command": ["python", "-m", "vllm.entrypoints.openai.api_server"]},
        "facts": {"log": {"source": "/state/vllm-vllm-0.log", "lines": 30}},
    }
    processes = [
        {"pid": 10, "name": "python", "state": "S (sleeping)", "wchan": "ep_poll", "threads": 40, "fds": 90},
        {
            "pid": 11,
            "name": "VLLM::EngineCor",
            "state": "T (stopped)",
            "wchan": "do_signal_stop",
            "kernel_stack": ["[<0>] do_signal_stop+0x16f/0x210", "[<0>] get_signal+0x22d/0x840"],
            "threads": 7,
            "rss_bytes": 512 * 1024 * 1024,
            "fds": 30,
            "cmdline": ["VLLM::EngineCore"],
        },
    ]
    stacks = [
        {"pid": 10, "error": "Permission denied"},
        {
            "pid": 11,
            "threads": [{"os_thread_id": 11, "name": "MainThread", "frames": FRAMES, "owns_gil": True}],
        },
    ]
    stacks[1]["threads"].append({"os_thread_id": 12, "name": "", "frames": []})  # type: ignore[attr-defined]
    return {
        "manifest.json": json.dumps(manifest).encode(),
        "processes.json": json.dumps(processes).encode(),
        "stacks.json": json.dumps(stacks).encode(),
        "gpu.json": json.dumps(gpu).encode(),
        "kernel.txt": b"[ 9.1] NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.\n",
        "log.txt": "".join(f"INFO line {i}\n" for i in range(30)).encode(),
    }


def test_the_summary_says_what_fired_what_was_done_where_threads_were_and_what_the_gpu_said() -> None:
    text = summary(_files(), frames=3, log_lines=2)
    assert 'VLLMEngineHung {alertname="VLLMEngineHung", target="vllm-0"}' in text
    assert "firing about this target then: VLLMEngineHung, VLLMEngineStalled" in text
    assert "vLLM 0.32.0" in text and "command: python -m vllm.entrypoints.openai.api_server" in text
    assert "kernel     failed   0.1s: dmesg exited 1: not permitted" in text
    assert (
        "pid 11 VLLM::EngineCore: T (stopped), wchan do_signal_stop, 7 threads, rss 512 MiB, 30 fds" in text
    )
    assert "kernel: do_signal_stop+0x16f/0x210 < get_signal+0x22d/0x840" in text
    assert "thread 11 MainThread (idle, holds the GIL)" in text
    engine = text.split("thread 11 MainThread")[1].splitlines()[1:4]
    assert [line.strip() for line in engine] == [
        "wait (/usr/lib/python3.11/threading.py:327)",
        "get (/usr/lib/python3.11/queue.py:171)",
        "_process_input_queue (vllm/v1/engine/core.py:720)",  # innermost first, 3 of them
    ]
    assert "(+1 threads without Python frames)" in text and "no Python stacks: Permission denied" in text
    gpu = next(line for line in text.splitlines() if line.strip().startswith("gpu 0"))
    assert "NVIDIA H200" in gpu and "clock reasons: hw_thermal_slowdown" in gpu
    assert "retired pages: Not Supported" in gpu and "last XID 79" in gpu and "remapped rows 0/0" in gpu
    assert "kernel log: 1 NVIDIA driver lines" in text and "NVRM: Xid" in text
    assert text.endswith("  INFO line 28\n  INFO line 29\n")
    assert "log (last 2 of 30 lines kept, from /state/vllm-vllm-0.log)" in text


def test_a_damaged_bundle_prints_what_it_can() -> None:
    files = _files()
    files["stacks.json"] = b"{not json"
    files["gpu.json"] = b"[]"
    text = summary(files)
    assert "pid 11 VLLM::EngineCore" in text and "thread 11" not in text
    assert summary({"log.txt": b"x"}) == "no readable manifest.json in this bundle\n"


def test_list_and_show_read_the_state_dir_and_the_audit_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    store = ActionStore(str(state / ACTIONS_DB))
    row = store.begin("restart", "restart", "vllm-0", "alert", {}, False, 1_700_000_000.0)
    store.step(row, "stop", 1_700_000_001.0)
    store.finish(row, "succeeded", 1_700_000_050.0, "restarted and ready")
    store.close()
    Bundles(str(state)).write(ID, _files(), 1_700_000_000.0)
    cfg = tmp_path / "watchdog.yml"
    cfg.write_text(f"state_dir: {state}\n")
    assert main(["incident", "list", "--config", str(cfg)]) == 0
    listed = capsys.readouterr().out
    assert ID in listed and "2023-11-14 22:13:20" in listed and "VLLMEngineHung" in listed
    assert main(["incident", "show", ID, "--config", str(cfg), "--frames", "1"]) == 0
    shown = capsys.readouterr().out
    assert "outcome: succeeded: restarted and ready" in shown and "steps: stop" in shown
    assert "      wait (/usr/lib/python3.11/threading.py:327)" in shown and "queue.py" not in shown
    assert main(["incident", "show", "nope", "--config", str(cfg)]) == 1
    assert "no incident 'nope'" in capsys.readouterr().err
    assert main(["incident", "show", "--config", str(cfg)]) == 2
    cfg.write_text("listen: 127.0.0.1:9460\n")
    assert main(["incident", "list", "--config", str(cfg)]) == 2
    assert "no state_dir" in capsys.readouterr().err


ESCAPES = {
    "target": {"name": "vllm-0\x1b]0;owned\x07\x1b[2J", "mode": "docker"},  # set the title, clear the screen
    "alert": {"alertname": "Hung\x9b31m", "job": "\x1bP+q\x1b\\"},  # a one-byte C1 CSI; a DCS query
    "action": {"name": "restart\u202e", "action_id": 10**30, "plan": ["not", "text"]},  # bidi; no audit row
    "parts": [{"name": {"x": 1}, "status": "ok"}],
}


def _controls(text: str) -> set[str]:
    return {c for c in text if not c.isprintable() and c not in "\n\t"}


def test_shown_writes_every_control_but_newline_and_tab_as_a_question_mark() -> None:
    assert shown("a\tb") == "a\tb"
    assert shown("\x1b[31mred\x07\x9b0m\x7f\u202e\u2028\ud800\n") == "?[31mred??0m?????"


def test_a_manifest_field_of_the_wrong_type_lists_as_unknown() -> None:
    doc = {"created_at": "soon", "target": ["x"], "action": {"name": 7, "action_id": 10**30}, "parts": {}}
    assert headline(doc) == Headline()
    good = {"created_at": 1.5, "action": {"action_id": 3, "name": "restart"}, "parts": [{"name": "gpu"}, 1]}
    assert headline(good) == Headline(created_at=1.5, action="restart", action_id=3, parts={"gpu": "None"})


def _config(tmp_path: Path) -> str:
    cfg = tmp_path / "watchdog.yml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\n")
    return str(cfg)


def test_a_manifest_nested_200k_deep_is_listed_as_unreadable_beside_the_good_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Bundles(str(tmp_path / "state")).write(ID, _files(), 1_700_000_000.0)
    deep = {"manifest.json": b"[" * 200_000 + b"]" * 200_000}  # 516 bytes gzipped
    hostile_bundle(tmp_path / "state", "deep-1", deep)
    assert main(["incident", "list", "--config", _config(tmp_path)]) == 0  # was a RecursionError
    listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert set(listed) == {ID, "deep-1"} and "VLLMEngineHung" in listed[ID]
    assert "unreadable: incident 'deep-1': manifest.json: nested deeper than 32 levels" in listed["deep-1"]
    assert main(["incident", "show", "deep-1", "--config", _config(tmp_path)]) == 0
    assert "no readable manifest.json" in capsys.readouterr().out


def test_nothing_in_a_bundle_reaches_the_terminal_as_a_control_sequence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {"manifest.json": json.dumps(ESCAPES).encode(), "log.txt": b"tail \x1b]52;c;ZXZpbA==\x07\n"}
    hostile_bundle(tmp_path / "state", "esc-1", files)
    assert main(["incident", "list", "--config", _config(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert not _controls(listed) and "vllm-0?]0;owned??[2J" in listed
    assert main(["incident", "show", "esc-1", "--config", _config(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert not _controls(out)
    assert "vllm-0?]0;owned??[2J" in out and "Hung?31m" in out and "tail ?]52;c;ZXZpbA==?" in out
