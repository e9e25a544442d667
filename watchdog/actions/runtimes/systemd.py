"""The systemd runtime: restarts a vLLM that runs as a systemd unit, through systemctl.

Restart only: the unit file owns the command line, so relaunching with other arguments (replace,
rollback) is refused. Every systemctl call names the configured unit and nothing else, and a unit
that systemd does not know (or that is not the one configured, under another name) is refused
before anything is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import time
from collections.abc import Callable, Sequence

from ...errors import ActionError, RefusedError
from ..incidents.bounded import run_command
from .exits import (
    LOG_BYTES,
    LOG_LINES,
    SYSTEMD_PROPERTIES,
    ExitStatus,
    ExitWatch,
    engine_death,
    systemd_exit,
)
from .runtime import Launch, LogTail, ServerPid

log = logging.getLogger("vllm_watchdog.actions.systemd")  # the name logs have always carried

_UNIT = re.compile(r"^[A-Za-z0-9:_.\\@-]+$")
_RUNNING = frozenset({"active", "reloading", "activating", "deactivating"})
_RESTART_ONLY = "systemd mode supports restart only"
_INVOCATION = re.compile(r"^[0-9a-f]{32}$")


class SystemdRuntime:
    """Runtime for a vLLM systemd unit: stop, start, state and start time through systemctl."""

    kind = "systemd"

    def __init__(
        self,
        target: str,
        unit: str,
        *,
        systemctl: Sequence[str] = ("systemctl",),
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        command_timeout: float = 30.0,
        start_timeout: float = 300.0,
        journalctl: Sequence[str] | None = None,  # None: the journalctl on PATH, if any
    ) -> None:
        if not _UNIT.match(unit) or unit.startswith("-"):
            raise RefusedError(f"target {target}: {unit!r} is not a systemd unit name")
        self.target = target
        self.unit = unit
        self._systemctl = tuple(systemctl)
        self._clock = clock
        self._monotonic = monotonic  # CLOCK_MONOTONIC: the clock of systemd's *Monotonic timestamps
        self._command_timeout = command_timeout
        self._start_timeout = start_timeout
        self._journalctl = tuple(journalctl) if journalctl is not None else None
        self.exit_status = ExitWatch(self._read_exit, monotonic)  # how the last run ended, every 5 s at most

    # -- Runtime ----------------------------------------------------------------------------

    async def launch(self) -> Launch:
        """Refused: the unit file owns the command line."""
        raise ActionError(_RESTART_ONLY)

    async def is_running(self) -> bool:
        """Whether `systemctl is-active` reports the unit active (or starting, reloading, stopping)."""
        _, out, _ = await self._run("is-active", timeout=self._command_timeout)
        return out.strip() in _RUNNING

    async def started_at(self) -> float | None:
        """When the unit's main process started (unix time), None if not running or unknown."""
        if not await self.is_running():
            return None
        props = await self._show("ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic")
        for name in ("ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic"):
            try:
                usec = int(props.get(name, "0"))
            except ValueError:
                continue
            if usec > 0:
                return self._clock() - (self._monotonic() - usec / 1e6)
        return None

    async def stop(self, timeout: float) -> None:
        """`systemctl stop`; if it has not finished after `timeout`, SIGKILL the unit's processes."""
        await self._check_unit()
        if not await self.is_running():
            return
        stopping = asyncio.ensure_future(
            self._run("stop", "--no-ask-password", timeout=timeout + self._command_timeout)
        )
        done, _ = await asyncio.wait({stopping}, timeout=timeout)
        if not done:
            log.warning("target %s: %s still stopping after %.0fs: SIGKILL", self.target, self.unit, timeout)
            await self._checked("kill", "--no-ask-password", "--signal=SIGKILL")
        code, _, err = await stopping
        if code != 0 and await self.is_running():
            raise ActionError(f"target {self.target}: systemctl stop {self.unit} failed: {_tail(err)}")

    async def start(self) -> None:
        """`systemctl start`, unless the unit is running."""
        await self._check_unit()
        if await self.is_running():
            return
        await self._checked("start", "--no-ask-password", timeout=self._start_timeout)

    async def replace(self, launch: Launch, stop_timeout: float) -> None:
        """Refused: the unit file owns the command line."""
        raise ActionError(_RESTART_ONLY)

    async def has_previous(self) -> bool:
        """Never: nothing is ever replaced."""
        return False

    async def commit(self) -> None:
        """Nothing kept, nothing to do."""

    async def rollback(self, stop_timeout: float) -> None:
        """Refused: nothing is ever replaced."""
        raise ActionError(_RESTART_ONLY)

    async def close(self) -> None:
        """Nothing to release."""

    # -- what an incident bundle reads ----------------------------------------------------------

    async def server_pid(self) -> ServerPid:
        """The unit's main process (systemctl show MainPID)."""
        try:
            pid = int((await self._show("MainPID")).get("MainPID", "0"))
        except (ActionError, ValueError) as exc:
            return ServerPid(None, problem=f"no MainPID for {self.unit}: {exc}")
        return ServerPid(pid) if pid > 0 else ServerPid(None, problem=f"{self.unit} has no main process")

    async def log_tail(self, lines: int, max_bytes: int) -> LogTail:
        """The unit's journal (journalctl -u), where journalctl exists."""
        return await self._journal(f"journalctl -u {self.unit}", lines, max_bytes, "-u", self.unit)

    async def _read_exit(self) -> ExitStatus | None:
        """How the unit's last run ended (exits.systemd_exit, with the engine-death line of that run's
        journal, `journalctl _SYSTEMD_INVOCATION_ID=`); None while it runs, or if systemctl fails."""
        try:
            props = await self._show(*SYSTEMD_PROPERTIES)
        except ActionError as exc:
            log.warning("%s", exc)
            return None
        invocation = props.get("InvocationID", "")
        if systemd_exit(props, "") is None or not _INVOCATION.match(invocation):
            return None
        match = f"_SYSTEMD_INVOCATION_ID={invocation}"
        tail = await self._journal(f"journalctl {match}", LOG_LINES, LOG_BYTES, match)
        return systemd_exit(props, engine_death(tail.lines))

    async def _journal(self, source: str, lines: int, max_bytes: int, *select: str) -> LogTail:
        found = shutil.which("journalctl")
        journalctl = self._journalctl or ((found,) if found else ())
        if not journalctl:
            return LogTail(source, problem="journalctl is not installed: no journal to read", absent=True)
        argv = [*journalctl, "--no-pager", "-o", "short-iso", "-n", str(lines), *select]
        try:
            out = await run_command(argv, max_bytes)
        except OSError as exc:
            return LogTail(source, problem=f"cannot run journalctl: {exc.strerror or exc}")
        if out.code != 0 and not out.truncated:
            return LogTail(source, problem=out.problem(journalctl[0]))
        return LogTail(source, tuple(out.stdout.decode(errors="replace").splitlines()[-lines:]))

    # -- systemctl --------------------------------------------------------------------------

    async def _check_unit(self) -> None:
        """RefusedError unless systemd knows the configured unit under the configured name."""
        props = await self._show("Id", "Names", "LoadState")
        if props.get("LoadState") == "not-found" or not props.get("Id"):
            raise RefusedError(f"target {self.target}: systemd has no unit {self.unit}")
        wanted = {self.unit, f"{self.unit}.service"}
        if not wanted & set(props.get("Names", "").split()):
            raise RefusedError(
                f"target {self.target}: {self.unit} resolves to {props['Id']}, not the configured unit"
            )

    async def _show(self, *names: str) -> dict[str, str]:
        args = [f"--property={name}" for name in names]
        out = await self._checked("show", *args)
        props = {}
        for line in out.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                props[key] = value
        return props

    async def _checked(self, verb: str, *options: str, timeout: float | None = None) -> str:
        code, out, err = await self._run(verb, *options, timeout=timeout or self._command_timeout)
        if code != 0:
            raise ActionError(
                f"target {self.target}: systemctl {verb} {self.unit} failed: {_tail(err or out)}"
            )
        return out

    async def _run(self, verb: str, *options: str, timeout: float) -> tuple[int, str, str]:
        """Run `systemctl <verb> <options> <unit>`: the configured unit is the only one ever named."""
        argv = [*self._systemctl, verb, *options, "--", self.unit]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise ActionError(f"target {self.target}: cannot run {self._systemctl[0]}: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise ActionError(
                f"target {self.target}: systemctl {verb} {self.unit} timed out after {timeout:.0f}s"
            ) from None
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def _tail(text: str, limit: int = 500) -> str:
    text = text.strip()
    return text[-limit:] if text else "no output"
