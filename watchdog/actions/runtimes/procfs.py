"""/proc as the process runtime reads it: a process's stat fields, and a child with the session it leads. A
pid and its start time name one process: a reused pid has another start time."""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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


def all_stats(proc: str = "/proc") -> list[ProcStat]:
    """The stat fields of every process."""
    out = []
    with contextlib.suppress(OSError):
        for name in os.listdir(proc):
            if name.isdigit() and (stat := read_stat(int(name), proc)) is not None:
                out.append(stat)
    return out


def marked_leader(marker: bytes) -> ProcStat | None:
    """The newest live session leader with `marker` (NAME=value) in its environment, None if there is none."""
    found: list[ProcStat] = []
    for stat in all_stats():
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
    return max(found, key=lambda s: s.start_ticks)


@dataclass
class Child:
    """The vLLM child: the leader of its own session, started by this watchdog (`popen`) or adopted."""

    pid: int
    start_ticks: int
    started_at: float
    argv: tuple[str, ...]
    popen: subprocess.Popen[bytes] | None = None  # None: adopted from an earlier watchdog

    def record(self) -> dict[str, Any]:
        """What the state file keeps of it."""
        return {
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "started_at": self.started_at,
            "argv": self.argv,
        }

    def alive(self) -> bool:
        """Whether the leader itself still runs (the same process, not one that reuses its pid)."""
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
            for s in all_stats()
            if s.session == self.pid and not s.gone and s.start_ticks >= self.start_ticks
        ]
