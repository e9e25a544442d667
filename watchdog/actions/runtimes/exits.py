"""Why a vLLM server exited: a crash or a clean stop, by its exit status and by the end of its own log.

vLLM's engine can die and the API server still exit with status 0 (vLLM #48966): a supervisor that reads
exit codes alone (systemd's `Restart=on-failure`, Docker's `on-failure` policy) takes that for a clean stop
and leaves the server down. So an exit is a crash when its status is not 0, or when the log of that run
(a bounded tail) holds one of vLLM 0.32's engine-death lines:

- `EngineDeadError` (and its message, `EngineCore encountered an issue. See stack trace (above) ...`);
- `EngineCore encountered a fatal error.` (the engine core's loop raised);
- `Engine core process EngineCore_DP0 died unexpectedly.` (and older vLLMs' `Engine core proc ... died`);
- `[shutdown] MPClient: engine core exited unexpectedly; starting cleanup`;
- `Engine core initialization failed.` and `Worker proc ... died unexpectedly`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

ENGINE_DEATH = re.compile(
    r"EngineDeadError"
    r"|EngineCore encountered (?:a fatal error|an issue)"
    r"|Engine core (?:proc|process) \S+ died unexpectedly"
    r"|engine core exited unexpectedly"
    r"|Engine core initialization failed"
    r"|Worker proc \S+ died unexpectedly"
)
LOG_LINES = 200  # the end of the run's log that is scanned
LOG_BYTES = 64 * 1024  # read at most this much of it
ASK_EVERY = (
    5.0  # seconds between two looks at a Docker or systemd server's exit (the supervisor ticks each 1 s)
)


@dataclass(frozen=True)
class ExitStatus:
    """How a server's last run ended: its status, and the engine-death line of its log if one was found."""

    code: int | None  # the exit status (negative: killed by that signal); None: unknown
    death: str = ""  # the marker of the log line that says the engine died ("" if none was found)
    detail: str = ""  # what else says it crashed (Docker's OOMKilled, systemd's Result), "" if nothing
    respawn: bool = True  # whether the watchdog should start it again (its own policy will not)

    @property
    def crashed(self) -> bool:
        """A crash whatever the status once the engine died; else any status but 0."""
        return bool(self.death) or self.code != 0 or bool(self.detail)

    def describe(self) -> str:
        """One line for the log and the audit: `exited with status 0 after "EngineDeadError..." (a crash)`."""
        status = "an unknown status" if self.code is None else f"status {self.code}"
        after = f' after "{self.death}"' if self.death else ""
        extra = f", {self.detail}" if self.detail else ""
        return f"exited with {status}{after}{extra} ({'a crash' if self.crashed else 'a clean stop'})"


def engine_death(lines: Iterable[str]) -> str:
    """The engine-death marker of the last line that has one ("" if none): the marker alone, never the rest
    of the line (a log line may carry request text)."""
    found = ""
    for line in lines:
        match = ENGINE_DEATH.search(line)
        if match is not None:
            found = match.group(0)
    return found


def _hidden(code: int | None, detail: str, death: str, self_restarts: bool) -> bool:
    """Whether the watchdog starts a Docker or systemd server again: only the crash that reads as a clean
    stop (status 0, nothing else wrong, and an engine-death line), which an exit-code supervisor misses,
    and only where the server's own policy would not start it again on any exit. Every other exit is left
    to that policy and to the routes (VLLMDown), as an operator's `docker stop` or `systemctl stop` is."""
    return code == 0 and not detail and bool(death) and not self_restarts


def docker_exit(state: dict[str, object], policy: str, death: str) -> ExitStatus | None:
    """How a container's last run ended, from `docker inspect`'s State and HostConfig.RestartPolicy.Name;
    None while it runs or restarts, or before it ever ran."""
    if state.get("Running") or state.get("Restarting") or state.get("Status") not in ("exited", "dead"):
        return None
    raw = state.get("ExitCode")
    code = raw if isinstance(raw, int) else None
    detail = "OOM-killed" if state.get("OOMKilled") else ""
    self_restarts = policy in ("always", "unless-stopped")
    return ExitStatus(code, death, detail, _hidden(code, detail, death, self_restarts))


SYSTEMD_PROPERTIES = ("ActiveState", "Result", "ExecMainCode", "ExecMainStatus", "Restart", "InvocationID")


def systemd_exit(props: dict[str, str], death: str) -> ExitStatus | None:
    """How a unit's last run ended, from `systemctl show` of SYSTEMD_PROPERTIES; None while it is active,
    starting or stopping, or before it ran."""
    if props.get("ActiveState") not in ("inactive", "failed") or not props.get("InvocationID"):
        return None
    status = props.get("ExecMainStatus", "")
    number = int(status) if status.lstrip("-").isdigit() else None
    how = props.get("ExecMainCode", "")  # 1: exited with the status; 2, 3: killed (dumped) by the signal
    code = number if how == "1" else -number if number is not None and how in ("2", "3") else None
    result = props.get("Result", "")
    if code == -15 and result == "success":
        code = 0  # ended by SIGTERM, which systemd counts as a clean end (its own stop sends it)
    detail = "" if result in ("success", "") else f"systemd Result={result}"
    self_restarts = props.get("Restart") in ("always", "on-success")
    return ExitStatus(code, death, detail, _hidden(code, detail, death, self_restarts))


class ExitWatch:
    """Reads how a server's last run ended at most every `every` seconds (`docker inspect` and `systemctl
    show` are not free; the supervisor asks each second), and answers the last reading in between."""

    def __init__(
        self,
        read: Callable[[], Awaitable[ExitStatus | None]],
        monotonic: Callable[[], float],
        every: float = ASK_EVERY,
    ) -> None:
        self.read, self.monotonic, self.every = read, monotonic, every
        self._next, self._last = float("-inf"), None  # type: float, ExitStatus | None

    async def __call__(self) -> ExitStatus | None:
        """The last reading, read again when it is `every` seconds old. One that asks for a respawn is
        handed out once: the respawn changes what the server is, and a stale copy would ask again."""
        if self.monotonic() >= self._next:
            self._next = self.monotonic() + self.every
            self._last = await self.read()
        status = self._last
        if status is not None and status.respawn:
            self._last = None
        return status
