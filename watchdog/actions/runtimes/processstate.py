"""The process runtime's state file, `state_dir/process-<target>.json`: the configured, current and kept
launches and the child, written atomically (mode 0600), so that a restarted watchdog adopts the child."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...statehealth import private_dir
from .procfs import Child
from .runtime import Launch

_STATE_VERSION = 1


@dataclass(frozen=True)
class ProcessState:
    """What the state file holds: the launch of the config, the launch in use, the one kept for rollback and
    the child."""

    configured: Launch
    launch: Launch
    previous: Launch | None
    child: Child | None


def write_state(path: Path, target: str, state: ProcessState) -> None:
    """Replace the state file atomically (a temporary file, fsynced, renamed); OSError if it cannot."""
    doc = {
        "version": _STATE_VERSION,
        "target": target,
        "configured": _launch_dict(state.configured),
        "launch": _launch_dict(state.launch),
        "previous": _launch_dict(state.previous) if state.previous is not None else None,
        "child": None if state.child is None else state.child.record(),
    }
    private_dir(str(path.parent))
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_state(path: Path) -> ProcessState:
    """The state file's contents; FileNotFoundError if there is none, OSError, ValueError, KeyError or
    TypeError if it cannot be read or is not one."""
    state = json.loads(path.read_text())
    configured = _launch_from(state["configured"])
    launch = _launch_from(state["launch"])
    previous = _launch_from(state["previous"]) if state.get("previous") else None
    record = state.get("child")
    child = None
    if record:
        argv = tuple(str(a) for a in record.get("argv", ()))
        child = Child(int(record["pid"]), int(record["start_ticks"]), float(record["started_at"]), argv)
    return ProcessState(configured, launch, previous, child)


def _launch_dict(launch: Launch) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(launch.to_json())
    return value


def _launch_from(raw: Any) -> Launch:
    launch = Launch.from_json(json.dumps(raw))
    env = launch.data.get("env", {})
    if launch.kind != "process" or not launch.args or not isinstance(env, dict):
        raise ValueError("not a process launch")
    return launch
