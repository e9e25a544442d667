"""How the watchdog reaches a target's vLLM: the Runtime protocol and the launch spec it saves."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Launch:
    """How a target's vLLM is launched, complete enough to recreate it exactly; JSON-serialisable.

    `args` is the command line that actions edit (docker: the container's Cmd; process: the argv).
    `data` is everything else the runtime needs (docker: image, env, mounts, host config; process: env).
    """

    kind: str  # "docker" | "process"
    args: tuple[str, ...]
    data: Mapping[str, Any] = field(default_factory=dict)

    def with_args(self, args: Sequence[str]) -> Launch:
        """The same launch with another command line."""
        return replace(self, args=tuple(args))

    def to_json(self) -> str:
        """Serialise for the state database."""
        return json.dumps(
            {"kind": self.kind, "args": list(self.args), "data": dict(self.data)}, sort_keys=True
        )

    @classmethod
    def from_json(cls, text: str) -> Launch:
        """Inverse of to_json; ValueError if the text is not a launch spec."""
        raw = json.loads(text)
        if not isinstance(raw, dict) or not isinstance(raw.get("args"), list) or "kind" not in raw:
            raise ValueError("not a saved launch spec")
        return cls(
            kind=str(raw["kind"]), args=tuple(str(a) for a in raw["args"]), data=dict(raw.get("data") or {})
        )


class Runtime(Protocol):
    """Stops, starts and relaunches one target's vLLM. Every method raises ActionError on failure and
    RefusedError before touching anything the config does not name. All methods are safe to call again
    after a watchdog crash (kill -9) in the middle of any of them."""

    kind: str  # "docker" | "process" | "systemd"
    target: str  # the target name from config

    async def launch(self) -> Launch:
        """The current launch spec; ActionError where the runtime cannot relaunch (systemd)."""
        ...

    async def is_running(self) -> bool:
        """Whether the vLLM server process/container is running (not whether it is ready)."""
        ...

    async def started_at(self) -> float | None:
        """Unix time the running server was started, None if not running or unknown."""
        ...

    async def stop(self, timeout: float) -> None:
        """Stop gracefully (SIGTERM, vLLM drains), SIGKILL after `timeout` seconds. Stopped already: no-op."""
        ...

    async def start(self) -> None:
        """Start the (stopped) server with its current launch spec. Running already: no-op."""
        ...

    async def replace(self, launch: Launch, stop_timeout: float) -> None:
        """Stop the current server and start `launch` in its place, keeping the old one (stopped) so that
        rollback() can bring it back. Does not wait for readiness; the caller does."""
        ...

    async def has_previous(self) -> bool:
        """Whether replace() kept an old server that commit() or rollback() has not dealt with yet."""
        ...

    async def commit(self) -> None:
        """The replacement proved ready: discard the kept old server. Nothing kept: no-op."""
        ...

    async def rollback(self, stop_timeout: float) -> None:
        """Remove the replacement and start the kept old server again, exactly as it was."""
        ...

    async def close(self) -> None:
        """Release clients; never stops the server."""
        ...


@dataclass(frozen=True)
class ServerPid:
    """Where a target's vLLM runs on this host: its top process by host pid, or why there is none."""

    pid: int | None
    container_id: str = ""  # docker: the process must lie in this container's cgroup
    problem: str = ""


@dataclass(frozen=True)
class LogTail:
    """The last lines of a target's vLLM log, where they came from, or why there are none."""

    source: str
    lines: tuple[str, ...] = ()
    problem: str = ""
    absent: bool = False  # the problem is that there is no log to read here (no file, no journal)


@runtime_checkable
class Observable(Protocol):
    """A runtime that can say where its vLLM runs and show its log (what an incident bundle keeps)."""

    async def server_pid(self) -> ServerPid:
        """The server's top process; never raises (a failure is the ServerPid's problem)."""
        ...

    async def log_tail(self, lines: int, max_bytes: int) -> LogTail:
        """The last `lines` lines of the server's log, at most `max_bytes` read; never raises."""
        ...
