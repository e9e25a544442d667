"""Python stacks of a running (or SIGSTOPped) process with py-spy, which reads its memory from outside.

`py-spy dump --nonblocking` neither pauses the process nor needs it to run, so a stopped or hung
interpreter is read as it is. Only frames are kept: never `--locals`, whose values could hold prompts and
completions. From the host it reads a container's processes by their host pid (through /proc/<pid>/root),
given ptrace rights over them (root, or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any

from .bounded import run_command

MAX_OUTPUT = 4 * 1024 * 1024
MAX_THREADS = 256
MAX_FRAMES = 128


class StackError(Exception):
    """py-spy could not read the process."""


def find_py_spy(configured: str = "") -> str | None:
    """The py-spy to run: the configured path, else the one installed beside this interpreter (the venv's
    bin/), else the first on PATH; None if there is none."""
    if configured:
        return configured
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def command(py_spy: str, pid: int) -> list[str]:
    """The py-spy command line for one process: JSON, non-blocking, frames only."""
    return [py_spy, "dump", "--nonblocking", "--json", "--pid", str(pid)]


async def dump(py_spy: str, pid: int) -> list[dict[str, Any]]:
    """The threads of `pid` with their frames, innermost first; StackError with py-spy's reason."""
    try:
        out = await run_command(command(py_spy, pid), MAX_OUTPUT)
    except OSError as exc:
        raise StackError(f"cannot run {py_spy}: {exc.strerror or exc}") from None
    if out.truncated:
        raise StackError(f"py-spy printed more than {MAX_OUTPUT} bytes")
    if out.code != 0:
        raise StackError(_reason(out.stderr) or out.problem(py_spy))
    return parse(out.stdout)


def _reason(stderr: bytes) -> str:
    """py-spy's error line ("Error: ..."), without the backtrace it prints after it."""
    for line in stderr.decode(errors="replace").splitlines():
        if line.startswith("Error:"):
            return line.removeprefix("Error:").strip()[:300]
    return ""


def parse(data: bytes) -> list[dict[str, Any]]:
    """py-spy's JSON as threads of frames; whatever else it holds (locals included) is dropped."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise StackError(f"py-spy printed no JSON: {exc}") from None
    if not isinstance(doc, list):
        raise StackError("py-spy printed no list of threads")
    threads = []
    for raw in doc[:MAX_THREADS]:
        if not isinstance(raw, dict):
            continue
        frames = [
            {"name": str(f.get("name", "")), "file": str(f.get("filename", "")), "line": _int(f.get("line"))}
            for f in (raw.get("frames") or [])[:MAX_FRAMES]
            if isinstance(f, dict)
        ]
        threads.append(
            {
                "thread_id": _int(raw.get("thread_id")),
                "os_thread_id": _int(raw.get("os_thread_id")),
                "name": str(raw.get("thread_name") or ""),
                "active": bool(raw.get("active")),
                "owns_gil": bool(raw.get("owns_gil")),
                "frames": frames,
            }
        )
    return threads


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
