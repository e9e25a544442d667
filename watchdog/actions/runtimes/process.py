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
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import ActionError
from ...statehealth import PRIVATE_FILE
from ..incidents.bounded import last_lines, read_tail
from .exits import LOG_BYTES, LOG_LINES, ExitStatus, engine_death
from .processstate import ProcessState, read_state, write_state
from .procfs import Child, marked_leader, read_stat
from .runtime import Launch, LogTail, ServerPid

log = logging.getLogger("vllm_watchdog.actions.process")  # the name logs have always carried

MARKER_ENV = "VLLM_WATCHDOG_PROCESS"
EXIT_UNKNOWN = 255  # exit_code() of an adopted child that died: it did, but its status is lost
_KILL_WAIT = 10.0  # after SIGKILL: the kernel frees a process in milliseconds, unless it is stuck in D state
_POLL = 0.05


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
        self._child: Child | None = None
        self._stopped_by_us = False
        self._log_path = log_path
        self._log_start = 0  # the log file's size when the child started: its run's lines come after
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

    async def exit_status(self) -> ExitStatus | None:
        """How a child that ended on its own ended: its exit_code() and the engine-death line of its run's
        log (a bounded tail); None while it runs, after stop(), or when there is no child."""
        code = self.exit_code()
        if code is None:
            return None
        death = ""
        if self._log_path is not None:
            try:
                data, cut = await asyncio.to_thread(_read_run, self._log_path, self._log_start, LOG_BYTES)
                death = engine_death(last_lines(data, LOG_LINES, cut))
            except OSError as exc:
                log.warning("target %s: cannot read %s: %s", self.target, self._log_path, exc)
        return ExitStatus(code, death)

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

    async def retire(self, timeout: float) -> int | None:
        """The target left the config: stop the child (as `stop` does) and forget it, state file included, so
        that a target of that name added later starts afresh. The pid stopped; None if no child ran."""
        async with self._lock:
            child = self._child
            pid = child.pid if child is not None and child.alive() else None
            await self._stop(timeout)
            if self._state_path is not None:
                with contextlib.suppress(FileNotFoundError):
                    self._state_path.unlink()
            return pid

    # -- what an incident bundle reads ----------------------------------------------------------

    async def server_pid(self) -> ServerPid:
        """The child's pid while it runs."""
        child = self._child
        if child is None or not child.alive():
            return ServerPid(None, problem="the vLLM process is not running")
        return ServerPid(child.pid)

    async def log_tail(self, lines: int, max_bytes: int) -> LogTail:
        """The end of the file the child's output goes to (state_dir/vllm-<target>.log)."""
        path = self._log_path
        if path is None:
            return LogTail(
                "", problem="no log file: the child's output is not kept without a state_dir", absent=True
            )
        try:
            data, cut = await asyncio.to_thread(read_tail, path, max_bytes)
        except OSError as exc:
            return LogTail(path, problem=f"cannot read {path}: {exc.strerror or exc}")
        return LogTail(path, tuple(last_lines(data, lines, cut)))

    # -- starting and stopping ----------------------------------------------------------------

    async def _spawn(self) -> None:
        if self._child is not None:
            await self._kill_leftovers(self._child)  # a dead leader's engine processes hold the GPU
        popen = self._popen(self._launch)
        stat = read_stat(popen.pid)  # readable even if it already exited: not reaped yet
        ticks = stat.start_ticks if stat is not None else -1
        self._child = Child(popen.pid, ticks, self._clock(), self._launch.args, popen)
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
                    fd = os.open(self._log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_FILE)
                    self._log_start = os.fstat(fd).st_size
                    out = stack.enter_context(os.fdopen(fd, "ab"))
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

    async def _kill_leftovers(self, child: Child) -> None:
        if not child.members():
            return
        self._signal(child, signal.SIGKILL)
        if not await self._wait_gone(child, _KILL_WAIT):
            pids = [s.pid for s in child.members()]
            raise ActionError(f"target {self.target}: processes {pids} survived SIGKILL")

    def _signal(self, child: Child, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, sig)  # the leader's process group: one atomic signal
        for member in child.members():  # and any that moved to a group of their own
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member.pid, sig)

    async def _wait_gone(self, child: Child, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self._reap(child)
            if not child.members():
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(_POLL)

    def _reap(self, child: Child) -> None:
        if child.popen is not None:
            child.popen.poll()

    # -- state file ---------------------------------------------------------------------------

    def _write(self) -> None:
        if self._state_path is None:
            return
        state = ProcessState(self._configured, self._launch, self._previous, self._child)
        try:
            write_state(self._state_path, self.target, state)
        except OSError as exc:
            raise ActionError(f"target {self.target}: cannot write {self._state_path}: {exc}") from exc

    def _load(self) -> None:
        assert self._state_path is not None
        try:
            saved = read_state(self._state_path)
            configured, launch, previous, child = saved.configured, saved.launch, saved.previous, saved.child
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

    def _find_unrecorded(self) -> Child | None:
        """A session leader carrying our marker: started just before a crash, before it was recorded."""
        leader = marked_leader(f"{MARKER_ENV}={self._state_path}".encode())
        if leader is None:
            return None
        return Child(leader.pid, leader.start_ticks, self._clock(), self._launch.args)


def _read_run(path: str, start: int, max_bytes: int) -> tuple[bytes, bool]:
    """What the file holds after offset `start`, at most its last `max_bytes`; and whether some was cut."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = 0 if start > size else start  # shorter than when the run began: rotated, read it all
        begin = max(start, size - max_bytes)
        f.seek(begin)
        return f.read(max_bytes), begin > start
