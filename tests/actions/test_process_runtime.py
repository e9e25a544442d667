"""Tests of the process runtime with real cheap children: tiny Python HTTP servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.clock import Clock
from tests.support.vllm_server import free_port
from vllm_watchdog.actions.pipeline.supervisor import respawn, retire_child
from vllm_watchdog.actions.runtimes.args import set_args
from vllm_watchdog.actions.runtimes.exits import ExitStatus
from vllm_watchdog.actions.runtimes.process import EXIT_UNKNOWN, MARKER_ENV, ProcessRuntime
from vllm_watchdog.actions.runtimes.procfs import read_stat
from vllm_watchdog.actions.runtimes.runtime import Launch
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.errors import ActionError

pytestmark = pytest.mark.anyio
WAIT = 60.0  # bound on waiting for a child to answer or exit; never asserted on

CHILD = r"""
import http.server, json, os, signal, subprocess, sys
args = sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1] if name in args else None
print("child", os.getpid(), "up", flush=True)
if opt("--exit") is not None:
    sys.exit(int(opt("--exit")))
if "--ignore-term" in args:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
if opt("--engine-pid-file"):  # like vLLM's engine core: a second process in the same session
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(opt("--engine-pid-file"), "w").write(str(engine.pid))
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"pid": os.getpid(), "args": args, "env": os.environ.get("WATCHDOG_TEST_VAR")})
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *_):
        pass
http.server.HTTPServer(("127.0.0.1", int(opt("--port"))), Health).serve_forever()
"""


@pytest.fixture
def child_script(tmp_path: Path) -> Path:
    path = tmp_path / "child.py"
    path.write_text(CHILD)
    return path


@pytest.fixture
async def runtimes() -> AsyncIterator[list[ProcessRuntime]]:
    """Every runtime a test makes; their children are stopped at the end, also on failure."""
    made: list[ProcessRuntime] = []
    yield made
    for runtime in reversed(made):
        await runtime.stop(2.0)


@pytest.fixture
def make(tmp_path: Path, child_script: Path, runtimes: list[ProcessRuntime]) -> Callable[..., ProcessRuntime]:
    def factory(
        *extra: str, port: int | None = None, command: list[str] | None = None, **kw: object
    ) -> ProcessRuntime:
        cmd = command or [sys.executable, str(child_script), "--port", str(port or free_port()), *extra]
        options: dict[str, object] = {
            "env": {"WATCHDOG_TEST_VAR": "yes"},
            "state_dir": str(tmp_path / "state"),
            "log_path": str(tmp_path / "child.log"),
        }
        options.update(kw)
        runtime = ProcessRuntime("vllm-0", cmd, **options)  # type: ignore[arg-type]
        runtimes.append(runtime)
        return runtime

    return factory


async def health(port: int) -> dict[str, object]:
    """The child's /health answer, waiting (bounded) until it serves."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    async with httpx.AsyncClient(trust_env=False) as client:
        while True:
            try:
                response = await client.get(f"http://127.0.0.1:{port}/health", timeout=2)
                if response.status_code == 200:
                    answer: dict[str, object] = response.json()
                    return answer
            except httpx.HTTPError:
                pass
            if loop.time() > deadline:
                raise AssertionError(f"nothing answered on 127.0.0.1:{port}")
            await asyncio.sleep(0.05)


async def until(predicate: Callable[[], object]) -> None:
    """Wait (bounded) until predicate() is true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition never became true")
        await asyncio.sleep(0.05)


def alive(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and not stat.gone


def marked_leaders(state_dir: Path) -> list[int]:
    """Live session leaders started for this state directory (there must never be two)."""
    marker = f"{MARKER_ENV}={(state_dir / 'process-vllm-0.json').resolve()}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = read_stat(int(name))
        if stat is None or stat.gone or stat.session != stat.pid:
            continue
        try:
            if marker in Path("/proc", name, "environ").read_bytes().split(b"\0"):
                out.append(stat.pid)
        except OSError:
            continue
    return out


def state(tmp_path: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((tmp_path / "state" / "process-vllm-0.json").read_text())
    return loaded


async def test_start_serves_and_stop_takes_the_whole_session(
    tmp_path: Path, make: Callable[..., ProcessRuntime]
) -> None:
    port = free_port()
    clock = Clock()
    engine_file = tmp_path / "engine.pid"
    runtime = make("--engine-pid-file", str(engine_file), port=port, clock=clock)
    assert not await runtime.is_running()
    assert await runtime.started_at() is None
    assert await runtime.ensure_running() is True
    answer = await health(port)
    assert answer["env"] == "yes"  # the configured environment reaches the child
    await until(engine_file.exists)
    engine = int(engine_file.read_text())
    assert await runtime.is_running()
    assert await runtime.started_at() == clock.now
    assert answer["pid"] == state(tmp_path)["child"]["pid"]  # type: ignore[index]
    await runtime.start()  # running: no-op
    assert marked_leaders(tmp_path / "state") == [answer["pid"]]

    await runtime.stop(5.0)
    assert not await runtime.is_running()
    assert not alive(int(answer["pid"]))  # type: ignore[call-overload]
    assert not alive(engine)  # vLLM's engine processes go with it
    assert runtime.exit_code() is None  # stopped by us, not died
    assert state(tmp_path)["child"] is None
    await runtime.stop(5.0)  # stopped: no-op
    assert "up" in (tmp_path / "child.log").read_text()


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # the dropped runtime's Popen is still running
async def test_restarted_watchdog_adopts_the_running_child(
    tmp_path: Path, make: Callable[..., ProcessRuntime]
) -> None:
    port = free_port()
    first = make(port=port, clock=Clock(1000.0))
    assert await first.ensure_running() is True
    pid = (await health(port))["pid"]
    # The watchdog dies (kill -9): nothing is stopped, the runtime object is simply gone.
    second = make(port=port, clock=Clock(5000.0))
    assert await second.is_running()
    assert await second.ensure_running() is False  # adopted, not started again
    assert (await health(port))["pid"] == pid
    assert marked_leaders(tmp_path / "state") == [pid]
    assert await second.started_at() == 1000.0  # when it really started, from the state file
    assert second.exit_code() is None
    # The adopted child dies: its status is lost with its first parent, but the death is reported.
    os.kill(int(pid), signal.SIGKILL)  # type: ignore[call-overload]
    await until(lambda: second.exit_code() is not None)
    assert second.exit_code() == EXIT_UNKNOWN
    await second.start()
    assert (await health(port))["pid"] != pid
    assert second.exit_code() is None
    await second.stop(5.0)
    assert marked_leaders(tmp_path / "state") == []


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_child_started_just_before_a_crash_is_found_by_its_marker(
    tmp_path: Path, make: Callable[..., ProcessRuntime]
) -> None:
    port = free_port()
    first = make(port=port)
    await first.ensure_running()
    pid = (await health(port))["pid"]
    path = tmp_path / "state" / "process-vllm-0.json"
    raw = json.loads(path.read_text())
    raw["child"] = None  # the crash came between fork and the state write
    path.write_text(json.dumps(raw))
    second = make(port=port)
    assert await second.ensure_running() is False
    assert (await health(port))["pid"] == pid
    assert state(tmp_path)["child"]["pid"] == pid  # type: ignore[index]


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process that is not the watchdog's, in a session of its own."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


async def test_reused_pid_is_not_adopted_or_signalled(
    tmp_path: Path, make: Callable[..., ProcessRuntime], stranger: subprocess.Popen[bytes]
) -> None:
    stat = read_stat(stranger.pid)
    assert stat is not None
    path = tmp_path / "state" / "process-vllm-0.json"
    path.parent.mkdir()
    port = free_port()
    launch = json.loads((await make(port=port).launch()).to_json())
    # The state file names the stranger's pid, but with another start time: the pid was reused.
    record = {"pid": stranger.pid, "start_ticks": stat.start_ticks - 1, "started_at": 1.0, "argv": ["x"]}
    raw = {"version": 1, "target": "vllm-0", "configured": launch, "launch": launch, "previous": None}
    path.write_text(json.dumps({**raw, "child": record}))
    runtime = make(port=port)
    assert not await runtime.is_running()
    assert await runtime.started_at() is None
    await runtime.stop(1.0)  # must not touch the stranger
    assert await runtime.ensure_running() is True
    assert (await health(port))["pid"] != stranger.pid
    await runtime.stop(5.0)
    assert stranger.poll() is None  # never signalled


async def test_replace_then_rollback_brings_the_old_launch_back(
    tmp_path: Path, make: Callable[..., ProcessRuntime]
) -> None:
    old_port, new_port = free_port(), free_port()
    runtime = make("--mark", "old", port=old_port)
    await runtime.ensure_running()
    old = await runtime.launch()
    assert (await health(old_port))["args"] == list(old.args[2:])
    assert not await runtime.has_previous()

    new = old.with_args(set_args(old.args, {"--port": str(new_port), "--mark": "new"}))
    await runtime.replace(new, stop_timeout=5.0)
    assert (await health(new_port))["args"] == list(new.args[2:])
    assert await runtime.launch() == new
    assert await runtime.has_previous()
    assert state(tmp_path)["previous"]["args"] == list(old.args)  # type: ignore[index]

    await runtime.rollback(stop_timeout=5.0)
    answer = await health(old_port)
    assert answer["args"] == list(old.args[2:])
    assert answer["env"] == "yes"
    assert await runtime.launch() == old
    assert not await runtime.has_previous()
    assert marked_leaders(tmp_path / "state") == [answer["pid"]]
    with pytest.raises(ActionError, match="no previous launch"):
        await runtime.rollback(stop_timeout=1.0)


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_replacement_and_kept_launch_outlive_a_watchdog_restart(
    tmp_path: Path, make: Callable[..., ProcessRuntime]
) -> None:
    old_port, new_port = free_port(), free_port()
    first = make(port=old_port)
    await first.ensure_running()
    old = await first.launch()
    new = old.with_args(set_args(old.args, {"--port": str(new_port)}))
    await first.replace(new, stop_timeout=5.0)
    pid = (await health(new_port))["pid"]

    second = make(port=old_port)  # same config as before the replace
    assert await second.launch() == new
    assert await second.has_previous()
    assert await second.ensure_running() is False
    # A repeated replace keeps the first kept launch: the known-good one.
    newer = old.with_args(set_args(old.args, {"--port": str(free_port())}))
    await second.replace(newer, stop_timeout=5.0)
    assert not alive(int(pid))  # type: ignore[call-overload]
    await second.rollback(stop_timeout=5.0)
    assert (await health(old_port))["args"] == list(old.args[2:])

    await second.replace(new, stop_timeout=5.0)
    await second.commit()
    assert not await second.has_previous()
    await second.stop(5.0)
    third = make(port=old_port)
    assert await third.launch() == new  # the committed relaunch survives restarts
    fourth = make(port=free_port())  # ...until the operator changes the configured command
    assert (await fourth.launch()).args != new.args


async def test_child_that_exits_on_its_own_reports_its_exit_code(
    tmp_path: Path, make: Callable[..., ProcessRuntime]
) -> None:
    runtime = make("--exit", "3")
    assert await runtime.ensure_running() is True
    await until(lambda: runtime.exit_code() is not None)
    assert runtime.exit_code() == 3
    assert not await runtime.is_running()
    assert await runtime.started_at() is None

    port = free_port()
    killed = make(port=port)
    await killed.ensure_running()
    pid = int((await health(port))["pid"])  # type: ignore[call-overload]
    assert killed.exit_code() is None
    os.kill(pid, signal.SIGKILL)
    await until(lambda: killed.exit_code() is not None)
    assert killed.exit_code() == -signal.SIGKILL
    await killed.start()  # the executor decides to restart it
    assert (await health(port))["pid"] != pid
    assert killed.exit_code() is None
    assert (tmp_path / "child.log").read_text().count("up") == 3  # appended, start after start


async def test_dead_leader_leaves_no_engine_behind(
    tmp_path: Path, make: Callable[..., ProcessRuntime]
) -> None:
    port = free_port()
    engine_file = tmp_path / "engine.pid"
    runtime = make("--engine-pid-file", str(engine_file), port=port)
    await runtime.ensure_running()
    pid = int((await health(port))["pid"])  # type: ignore[call-overload]
    await until(engine_file.exists)
    engine = int(engine_file.read_text())
    os.kill(pid, signal.SIGKILL)  # the API server dies; its engine process lives on, holding the GPU
    await until(lambda: not alive(pid))
    assert alive(engine)
    engine_file.unlink()
    await runtime.start()
    assert not alive(engine)
    await health(port)


async def test_sigterm_is_followed_by_sigkill_after_the_timeout(make: Callable[..., ProcessRuntime]) -> None:
    port = free_port()
    runtime = make("--ignore-term", port=port)
    await runtime.ensure_running()
    pid = int((await health(port))["pid"])  # type: ignore[call-overload]
    await runtime.stop(0.5)
    assert not alive(pid)
    assert not await runtime.is_running()


async def test_a_sigstopped_engine_is_continued_so_it_acts_on_sigterm(
    tmp_path: Path, make: Callable[..., ProcessRuntime], caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    engine_file = tmp_path / "engine.pid"
    runtime = make("--engine-pid-file", str(engine_file), port=port)
    await runtime.ensure_running()
    await health(port)
    await until(engine_file.exists)
    engine = int(engine_file.read_text())
    os.kill(engine, signal.SIGSTOP)  # a frozen EngineCore, as the hung-engine demo makes one
    with caplog.at_level(logging.WARNING, logger="vllm_watchdog"):
        await runtime.stop(60.0)  # without SIGCONT it would sit out all 60 s, then SIGKILL
    assert not alive(engine)
    assert not [r for r in caplog.records if "ignored SIGTERM" in r.getMessage()]


async def test_failures_are_action_errors(tmp_path: Path, make: Callable[..., ProcessRuntime]) -> None:
    missing = make(command=[str(tmp_path / "no-such-vllm"), "--port", "1"])
    with pytest.raises(ActionError, match="cannot start"):
        await missing.ensure_running()
    assert not await missing.is_running()
    runtime = make()
    with pytest.raises(ActionError, match="docker"):
        await runtime.replace(Launch("docker", ("x",)), stop_timeout=1.0)
    with pytest.raises(ValueError, match="needs a command"):
        ProcessRuntime("vllm-0", [], env={}, state_dir=None, log_path=None)


async def test_without_state_dir_and_log_path(make: Callable[..., ProcessRuntime]) -> None:
    port = free_port()
    runtime = make(port=port, state_dir=None, log_path=None)
    await runtime.start()
    await health(port)
    await runtime.stop(5.0)
    assert not await runtime.is_running()


async def test_unreadable_state_file_is_ignored(tmp_path: Path, make: Callable[..., ProcessRuntime]) -> None:
    path = tmp_path / "state" / "process-vllm-0.json"
    path.parent.mkdir()
    path.write_text("{not json")
    port = free_port()
    runtime = make(port=port)
    assert await runtime.ensure_running() is True
    await health(port)
    assert oct(path.stat().st_mode & 0o777) == "0o600"  # argv may hold an API key


async def test_retire_stops_the_child_and_forgets_it(
    tmp_path: Path, make: Callable[..., ProcessRuntime]
) -> None:
    port = free_port()
    runtime = make(port=port)
    assert await runtime.ensure_running()
    pid = (await health(port))["pid"]
    assert await runtime.retire(5.0) == pid
    await until(lambda: not alive(int(str(pid))))
    assert not (tmp_path / "state" / "process-vllm-0.json").exists()  # a target of that name starts afresh
    assert await runtime.retire(5.0) is None  # nothing left: a no-op


async def test_a_removed_targets_child_is_stopped_unless_actions_may_not_touch_it(
    tmp_path: Path, make: Callable[..., ProcessRuntime], caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    store = ActionStore(None)
    port = free_port()
    runtime = make(port=port)
    await runtime.ensure_running()
    pid = int(str((await health(port))["pid"]))
    with caplog.at_level(logging.ERROR):
        await retire_child("vllm-0", runtime, store, clock, dry_run=True, unrecordable=False)
        store.set_paused(True, "maintenance", clock())
        await retire_child("vllm-0", runtime, store, clock, dry_run=False, unrecordable=False)
        store.set_paused(False, "", clock())
        await retire_child("vllm-0", runtime, store, clock, dry_run=False, unrecordable=True)
    assert alive(pid) and store.history() == []  # left running, and the log says nothing supervises it
    why = [r.__dict__["why"] for r in caplog.records if "nothing supervises it" in r.getMessage()]
    assert why == ["dry_run is on", "actions are paused", "state_dir is not writable"]
    await retire_child("vllm-0", runtime, store, clock, dry_run=False, unrecordable=False)
    assert not alive(pid)
    (row,) = store.history()
    assert (row.action, row.type, row.target, row.trigger, row.outcome) == (
        "retire",
        "stop",
        "vllm-0",
        "reload",
        "succeeded",
    )
    assert f"its vLLM process {pid} was stopped" in row.reason


DEATH = (
    "ERROR 11-28 07:12:01 [core.py:1512] EngineCore encountered a fatal error.\n"
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
    "for the root cause.\n"
    "INFO 11-28 07:12:02 [launcher.py:110] Shutting down FastAPI HTTP server.\n"
)


async def test_an_exit_0_after_an_engine_death_is_a_crash_and_respawned(
    tmp_path: Path, make: Callable[..., ProcessRuntime]
) -> None:
    """vLLM #48966: the engine died and the server exited 0. The run's own log says it was a crash; a later
    run that exits 0 cleanly is not blamed for the lines of the one before (same log file)."""
    target = parse_config("targets: [{name: vllm-0, url: 'http://127.0.0.1:1'}]", "c.yml", env={}).targets[0]
    say = f"import sys; sys.stdout.write({DEATH!r})"
    dead = make(command=[sys.executable, "-c", say])
    await dead.ensure_running()
    await until(lambda: dead.exit_code() is not None)
    status = await dead.exit_status()
    assert status == ExitStatus(0, "EngineDeadError") and status.crashed
    assert status.describe() == 'exited with status 0 after "EngineDeadError" (a crash)'
    job = await respawn(target, dead)
    assert job is not None and (job.labels["exit_code"], job.labels["crash"]) == ("0", "true")

    clean = make(command=[sys.executable, "-c", "print('INFO shutting down')"])
    await clean.ensure_running()
    await until(lambda: clean.exit_code() is not None)
    status = await clean.exit_status()
    assert status == ExitStatus(0) and not status.crashed
    job = await respawn(target, clean)  # the watchdog owns the child: started again all the same
    assert job is not None and job.labels["crash"] == "false"
    assert await respawn(target, make()) is None  # never started: nothing exited
