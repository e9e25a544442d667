"""The process runtime: a vLLM the watchdog launches itself, supervised across watchdog restarts.

The child runs in its own session (`start_new_session`), so a watchdog killed with -9 leaves vLLM
serving. `state_dir/process-<target>.json` (written atomically, mode 0600) records the child's pid and
start time (from /proc/<pid>/stat: a reused pid has another start time), its argv, the launch spec and
the launch kept for rollback. A restarted watchdog reads it and adopts the child instead of starting a
second one. The child also carries VLLM_WATCHDOG_PROCESS=<state file> in its environment, so a child
started just before a crash, and not yet recorded, is still found.

The server is the child's whole session: vLLM's engine-core processes are signalled and waited for
with it, so a stop frees the GPU and the port before the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ActionError
from .runtime import Launch

log = logging.getLogger(__name__)

MARKER_ENV = "VLLM_WATCHDOG_PROCESS"
EXIT_UNKNOWN = 255  # exit_code() of an adopted child that died: it did, but its status is lost
_KILL_WAIT = 10.0  # after SIGKILL: the kernel frees a process in milliseconds, unless it is stuck in D state
_POLL = 0.05
_STATE_VERSION = 1


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the runtime needs."""

    pid: int
    state: str  # R, S, D, Z (zombie), X (dead), ...
    session: int
    start_ticks: int  # clock ticks after boot: with the pid, identifies one process

    @property
    def gone(self) -> bool:
        """Exited (a zombie waiting to be reaped counts as exited)."""
        return self.state in ("Z", "X")


def read_stat(pid: int, proc: str = "/proc") -> ProcStat | None:
    """The process's stat fields, or None if there is no such process."""
    try:
        text = Path(proc, str(pid), "stat").read_text()
    except (OSError, ValueError):
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ")".
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return ProcStat(pid, fields[0], int(fields[3]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def _all_stats(proc: str = "/proc") -> list[ProcStat]:
    out = []
    with contextlib.suppress(OSError):
        for name in os.listdir(proc):
            if name.isdigit() and (stat := read_stat(int(name), proc)) is not None:
                out.append(stat)
    return out


@dataclass
class _Child:
    pid: int
    start_ticks: int
    started_at: float
    argv: tuple[str, ...]
    popen: subprocess.Popen[bytes] | None = None  # None: adopted from an earlier watchdog

    def record(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "started_at": self.started_at,
            "argv": self.argv,
        }

    def alive(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            return False
        stat = read_stat(self.pid)
        return stat is not None and stat.start_ticks == self.start_ticks and not stat.gone

    def members(self) -> list[ProcStat]:
        """Live processes of the child's session; empty if the session id now belongs to someone else."""
        leader = read_stat(self.pid)
        if leader is not None and leader.start_ticks != self.start_ticks:
            return []  # the pid (and so the session id) was reused: nothing there is ours
        return [
            s
            for s in _all_stats()
            if s.session == self.pid and not s.gone and s.start_ticks >= self.start_ticks
        ]


class ProcessRuntime:
    """Runtime for a vLLM child process the watchdog starts, stops, relaunches and adopts after a restart."""

    kind = "process"

    def __init__(
        self,
        target: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        state_dir: str | None,
        log_path: str | None,
        clock: Callable[[], float] = time.time,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        if not command:
            raise ValueError(f"target {target}: process mode needs a command")
        self.target = target
        self._configured = Launch("process", tuple(command), {"env": dict(env)})
        self._launch = self._configured
        self._previous: Launch | None = None
        self._child: _Child | None = None
        self._stopped_by_us = False
        self._log_path = log_path
        self._clock = clock
        self._base_env = base_env
        self._lock = asyncio.Lock()
        self._state_path: Path | None = None
        if state_dir is not None:
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", target)
            self._state_path = Path(state_dir).resolve() / f"process-{safe}.json"
            self._load()

    # -- Runtime ----------------------------------------------------------------------------

    async def launch(self) -> Launch:
        """The launch spec the next start uses (argv and extra environment)."""
        return self._launch

    async def is_running(self) -> bool:
        """Whether the child (started or adopted) is alive."""
        return self._child is not None and self._child.alive()

    async def started_at(self) -> float | None:
        """When the running child was started (clock time), None if none runs."""
        child = self._child
        return child.started_at if child is not None and child.alive() else None

    def exit_code(self) -> int | None:
        """The exit status of a child that ended on its own (negative: killed by that signal; EXIT_UNKNOWN
        for an adopted child, whose status only its first parent could read); None while it runs, after
        stop(), or when there is no child."""
        child = self._child
        if child is None or self._stopped_by_us:
            return None
        if child.popen is not None:
            return child.popen.poll()
        return None if child.alive() else EXIT_UNKNOWN

    async def stop(self, timeout: float) -> None:
        """SIGTERM the child's session, SIGKILL what is left after `timeout`, wait until it is gone."""
        async with self._lock:
            await self._stop(timeout)

    async def start(self) -> None:
        """Start the current launch spec unless the child is running."""
        async with self._lock:
            if self._child is None or not self._child.alive():
                await self._spawn()

    async def ensure_running(self) -> bool:
        """Adopt the recorded child if it still runs, else start one; True if one was started."""
        async with self._lock:
            if self._child is not None and self._child.alive():
                return False
            await self._spawn()
            return True

    async def replace(self, launch: Launch, stop_timeout: float) -> None:
        """Stop the child and start `launch`, keeping the old launch for rollback (the first one kept
        stays kept until commit or rollback, so a repeated replace cannot lose the good launch)."""
        if launch.kind != "process" or not launch.args:
            raise ActionError(f"target {self.target}: cannot run a {launch.kind!r} launch as a process")
        async with self._lock:
            if self._previous is None:
                self._previous = self._launch
                self._write()
            await self._stop(stop_timeout)
            self._launch = launch
            self._write()
            await self._spawn()

    async def has_previous(self) -> bool:
        """Whether a replaced launch is kept for rollback."""
        return self._previous is not None

    async def commit(self) -> None:
        """Forget the kept launch."""
        async with self._lock:
            if self._previous is not None:
                self._previous = None
                self._write()

    async def rollback(self, stop_timeout: float) -> None:
        """Stop the replacement and start the kept launch again."""
        async with self._lock:
            if self._previous is None:
                raise ActionError(f"target {self.target}: no previous launch to roll back to")
            await self._stop(stop_timeout)
            self._launch, self._previous = self._previous, None
            self._write()
            await self._spawn()

    async def close(self) -> None:
        """Nothing to release; the child keeps running."""

    # -- starting and stopping ----------------------------------------------------------------

    async def _spawn(self) -> None:
        if self._child is not None:
            await self._kill_leftovers(self._child)  # a dead leader's engine processes hold the GPU
        popen = self._popen(self._launch)
        stat = read_stat(popen.pid)  # readable even if it already exited: not reaped yet
        ticks = stat.start_ticks if stat is not None else -1
        self._child = _Child(popen.pid, ticks, self._clock(), self._launch.args, popen)
        self._stopped_by_us = False
        self._write()
        log.info("target %s: started vLLM process %d", self.target, popen.pid)

    def _popen(self, launch: Launch) -> subprocess.Popen[bytes]:
        """Fork and exec the child in a session of its own (fast; Popen, so that this runtime reaps it)."""
        extra = launch.data.get("env") or {}
        env = {**(os.environ if self._base_env is None else self._base_env), **extra}
        if self._state_path is not None:
            env[MARKER_ENV] = str(self._state_path)
        try:
            with contextlib.ExitStack() as stack:
                out: Any = None
                if self._log_path is not None:
                    out = stack.enter_context(open(self._log_path, "ab"))
                return subprocess.Popen(
                    list(launch.args),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT if out is not None else None,
                    start_new_session=True,
                )
        except OSError as exc:
            raise ActionError(f"target {self.target}: cannot start {launch.args[0]!r}: {exc}") from exc

    async def _stop(self, timeout: float) -> None:
        child = self._child
        if child is None:
            return
        self._stopped_by_us = True
        if child.members():
            log.info("target %s: stopping vLLM process %d", self.target, child.pid)
            self._signal(child, signal.SIGTERM)
            # A stopped member (a SIGSTOPped or frozen EngineCore) acts on SIGTERM only once continued;
            # without this it sits out the whole timeout until the SIGKILL.
            self._signal(child, signal.SIGCONT)
            if not await self._wait_gone(child, timeout):
                log.warning(
                    "target %s: process %d ignored SIGTERM for %.0fs: SIGKILL",
                    self.target,
                    child.pid,
                    timeout,
                )
                await self._kill_leftovers(child)
        self._reap(child)
        self._child = None
        self._write()

    async def _kill_leftovers(self, child: _Child) -> None:
        if not child.members():
            return
        self._signal(child, signal.SIGKILL)
        if not await self._wait_gone(child, _KILL_WAIT):
            pids = [s.pid for s in child.members()]
            raise ActionError(f"target {self.target}: processes {pids} survived SIGKILL")

    def _signal(self, child: _Child, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, sig)  # the leader's process group: one atomic signal
        for member in child.members():  # and any that moved to a group of their own
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member.pid, sig)

    async def _wait_gone(self, child: _Child, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self._reap(child)
            if not child.members():
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(_POLL)

    def _reap(self, child: _Child) -> None:
        if child.popen is not None:
            child.popen.poll()

    # -- state file ---------------------------------------------------------------------------

    def _write(self) -> None:
        if self._state_path is None:
            return
        child = self._child
        state = {
            "version": _STATE_VERSION,
            "target": self.target,
            "configured": _launch_dict(self._configured),
            "launch": _launch_dict(self._launch),
            "previous": _launch_dict(self._previous) if self._previous is not None else None,
            "child": None if child is None else child.record(),
        }
        path = self._state_path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(state, f, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise ActionError(f"target {self.target}: cannot write {path}: {exc}") from exc

    def _load(self) -> None:
        assert self._state_path is not None
        try:
            state = json.loads(self._state_path.read_text())
            configured = _launch_from(state["configured"])
            launch = _launch_from(state["launch"])
            previous = _launch_from(state["previous"]) if state.get("previous") else None
            record = state.get("child")
            child = None
            if record:
                argv = tuple(str(a) for a in record.get("argv", ()))
                child = _Child(
                    int(record["pid"]), int(record["start_ticks"]), float(record["started_at"]), argv
                )
        except FileNotFoundError:
            configured, launch, previous, child = self._configured, self._configured, None, None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("target %s: ignoring unreadable state file %s: %s", self.target, self._state_path, exc)
            configured, launch, previous, child = self._configured, self._configured, None, None
        if configured == self._configured:
            self._launch = launch  # an action's relaunch outlives the watchdog
        else:
            log.info("target %s: command changed in the config; the next start uses the new one", self.target)
        self._previous = previous
        if child is not None and child.alive():
            self._child = child
        else:
            # Prefer a live unrecorded child; else keep a dead one whose engine processes linger,
            # so that the next start can clear them first.
            found = self._find_unrecorded()
            self._child = found or (child if child is not None and child.members() else None)
            if self._child is not child:
                try:
                    self._write()
                except ActionError as exc:
                    log.error("%s", exc)  # the next state change tries again
        if self._child is not None and self._child.alive():
            log.info("target %s: adopted running vLLM process %d", self.target, self._child.pid)

    def _find_unrecorded(self) -> _Child | None:
        """A session leader carrying our marker: started just before a crash, before it was recorded."""
        marker = f"{MARKER_ENV}={self._state_path}".encode()
        found: list[ProcStat] = []
        for stat in _all_stats():
            if stat.session != stat.pid or stat.gone:
                continue
            try:
                environ = Path("/proc", str(stat.pid), "environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                found.append(stat)
        if not found:
            return None
        newest = max(found, key=lambda s: s.start_ticks)
        return _Child(newest.pid, newest.start_ticks, self._clock(), self._launch.args)


def _launch_dict(launch: Launch) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(launch.to_json())
    return value


def _launch_from(raw: Any) -> Launch:
    launch = Launch.from_json(json.dumps(raw))
    env = launch.data.get("env", {})
    if launch.kind != "process" or not launch.args or not isinstance(env, dict):
        raise ValueError("not a process launch")
    return launch
