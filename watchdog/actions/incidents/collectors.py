"""The parts of one incident's collection: processes, stacks, log, metrics, GPU and kernel log.

Each part is a coroutine that returns what it found (parts.Found) or raises; parts.Collection runs them
at once within the budget. The processes of the server are found once (`locate`) and shared by the parts
that read them. Everything kept passes through the config's Redactor; no part reads prompts or completions
(stacks are frames without locals; vLLM's request-log lines, which print prompts, are withheld from the log
tail).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...config.targets import TargetConfig
from ...redact import Redactor
from ...store import SampleStore
from ..runtimes.runtime import Observable, Runtime
from . import gpu, procs, stacks
from .openmetrics import openmetrics, target_series
from .parts import Absent, Found, Part

MAX_LOG_BYTES = 4 * 1024 * 1024
MAX_LOG_LINE = 4096
# py-spy processes at once: each one reads a busy process's memory on a host whose cores vLLM fills, so two
# at a time, the engine's first, finish sooner than all at once.
STACK_CONCURRENCY = 2
ENGINE_MARK = "VLLM::"  # vLLM's engine and worker processes name themselves VLLM::EngineCore, VLLM::Worker...
# Each part's own limit, in seconds; the collection's budget (incidents.budget) cuts whatever runs longer.
# The stacks, what a hang is diagnosed from, have no limit of their own: they get the whole budget.
TIMEOUTS = {"processes": 2.0, "stacks": 86400.0, "log": 3.0, "metrics": 3.0, "gpu": 3.0, "kernel": 3.0}
# vLLM's request log (RequestLogger, on by default before 0.10) prints prompts and outputs on such lines.
REQUEST_LOG_MARKS = ("Received request", "prompt:", "prompt_token_ids", "Generated response", "output:")
WITHHELD = "[line withheld: vLLM's request log prints prompts and completions]"


@dataclass(frozen=True)
class Sources:
    """Where one collection looks: the target and its runtime, the store, NVML, the tools and the clock."""

    target: TargetConfig
    runtime: Runtime | None
    store: SampleStore | None
    nvml: Any | None
    redactor: Redactor
    py_spy: str | None
    log_lines: int
    metrics_window: float
    gpu_host: bool  # NVML is configured or the NVIDIA driver is loaded
    now: float
    dmesg: Sequence[str] = ("dmesg",)
    proc: str = "/proc"


def parts(src: Sources) -> list[Part]:
    """The parts for `src`, each with its own timeout (TIMEOUTS)."""
    task = asyncio.ensure_future(_locate(src))
    task.add_done_callback(lambda f: f.cancelled() or f.exception())  # read even when no part awaits it
    located = lambda: asyncio.shield(task)  # noqa: E731 - a part cut at its timeout must not cancel it for the other
    return [  # started in this order: the stacks first
        Part("stacks", lambda: _stacks(src, located), TIMEOUTS["stacks"]),
        Part("processes", lambda: _processes(src, located), TIMEOUTS["processes"]),
        Part("log", lambda: _log(src), TIMEOUTS["log"]),
        Part("metrics", lambda: _metrics(src), TIMEOUTS["metrics"]),
        Part("gpu", lambda: _gpu(src), TIMEOUTS["gpu"]),
        Part("kernel", lambda: _kernel(src), TIMEOUTS["kernel"]),
    ]


async def _locate(src: Sources) -> list[int]:
    """The server's processes: its top process and every descendant (host pids)."""
    if not isinstance(src.runtime, Observable):
        raise Absent(f"the target's runtime ({getattr(src.runtime, 'kind', 'none')}) shows no processes")
    found = await src.runtime.server_pid()
    if found.pid is None:
        raise Absent(found.problem or "no server process")
    pid = found.pid
    # Read on the loop, not in a worker thread that could queue behind others: the stacks wait on this, and
    # these files (cgroup, the tasks' children) are small and never wait on the process's memory map.
    if found.container_id and not procs.in_container(pid, found.container_id, src.proc):
        raise Absent(
            f"pid {pid} of container {found.container_id[:12]} is not in its cgroup here: the watchdog must "
            "share the host's pid namespace (--pid host) to read a container's processes"
        )
    return procs.process_tree(pid, src.proc)


async def _processes(src: Sources, located: Callable[[], Awaitable[list[int]]]) -> Found:
    pids = await located()

    def read() -> tuple[list[dict[str, Any]], str]:
        return [procs.facts(pid, src.proc) for pid in pids], procs.vllm_version(pids[0], src.proc)

    found, version = await asyncio.to_thread(read)
    for entry in found:
        if "cmdline" in entry:
            entry["cmdline"] = src.redactor.argv(entry["cmdline"])
    facts = {"pids": pids, "vllm_version": version, "command": found[0].get("cmdline", [])}
    return Found({"processes.json": json_bytes(found)}, facts)


async def _stacks(src: Sources, located: Callable[[], Awaitable[list[int]]]) -> Found:
    pids = await located()
    py_spy = src.py_spy
    if py_spy is None:
        raise Absent("py-spy is not installed (pip install py-spy, or set incidents.py_spy)")
    gate = asyncio.Semaphore(STACK_CONCURRENCY)

    async def one(pid: int) -> dict[str, Any]:
        async with gate:
            try:
                return {"pid": pid, "threads": await stacks.dump(py_spy, pid)}
            except stacks.StackError as exc:
                return {"pid": pid, "error": str(exc)}

    order = _by_priority(pids, src.proc)  # comm files: small, on the loop as the tree was
    dumps = {pid: asyncio.ensure_future(one(pid)) for pid in order}  # the semaphore serves them in order
    await asyncio.gather(*dumps.values())
    found = [dumps[pid].result() for pid in pids]
    read = sum(1 for f in found if "threads" in f)
    if not read:
        raise RuntimeError("; ".join(f"pid {f['pid']}: {f['error']}" for f in found)[:1000])
    return Found({"stacks.json": json_bytes(found)}, {"read": read, "of": len(found)})


async def _log(src: Sources) -> Found:
    if not isinstance(src.runtime, Observable):
        raise Absent("the target's runtime keeps no log the watchdog can read")
    if src.log_lines == 0:
        raise Absent("incidents.log_lines is 0")
    tail = await src.runtime.log_tail(src.log_lines, MAX_LOG_BYTES)
    if tail.problem and not tail.lines:
        raise Absent(tail.problem) if tail.absent else RuntimeError(tail.problem)
    lines = [_shown(line, src.redactor) for line in tail.lines]
    text = "".join(line + "\n" for line in lines)
    return Found({"log.txt": text.encode()}, {"source": tail.source, "lines": len(lines)})


def _shown(line: str, redactor: Redactor) -> str:
    line = line[:MAX_LOG_LINE]
    if any(mark in line for mark in REQUEST_LOG_MARKS):
        return WITHHELD
    return redactor.text(line)


async def _metrics(src: Sources) -> Found:
    if src.store is None:
        raise Absent("no sample store")
    end_ms = int(src.now * 1000)
    start_ms = end_ms - int(src.metrics_window * 1000)
    series, cut = target_series(src.store, src.target.name, src.target.gpus, start_ms, end_ms)
    if not series:
        raise Absent(f"the store holds no series of {src.target.name} in the last {src.metrics_window:g}s")
    # The window is copied now; its text is written with the bundle, after the action went on.
    text = lambda: openmetrics(series, src.redactor.text)  # noqa: E731
    return Found(facts={"series": len(series), "truncated": cut}, later={"metrics.om": text})


async def _gpu(src: Sources) -> Found:
    if not src.gpu_host:
        raise Absent("no GPU: NVML is not configured (gpus.nvml) and no NVIDIA driver is loaded")
    if src.nvml is None:
        raise Absent("nvidia-ml-py is not installed")
    snap = await gpu.nvml_snapshot(src.nvml, src.target.gpus)
    if src.store is not None:
        snap["last_xid"] = gpu.last_xids(src.store, src.target.gpus)
    return Found({"gpu.json": json_bytes(snap)}, {"error": snap["error"]} if "error" in snap else {})


async def _kernel(src: Sources) -> Found:
    if not src.gpu_host:
        raise Absent("no GPU: the NVIDIA driver's kernel log lines are read on GPU hosts")
    lines = await gpu.driver_lines(src.dmesg)
    xids = [line for line in lines if gpu.XID_MARK in line]
    text = "".join(line + "\n" for line in lines)
    return Found({"kernel.txt": text.encode()}, {"lines": len(lines), "xid_lines": len(xids)})


def _by_priority(pids: list[int], proc: str) -> list[int]:
    """The order to read stacks in: vLLM's engine processes (VLLM::EngineCore, its workers), then the server's
    top process (the API server), then the rest."""
    engines = [pid for pid in pids[1:] if procs.name(pid, proc).startswith(ENGINE_MARK)]
    return engines + [pid for pid in pids if pid not in engines]


def json_bytes(doc: Any) -> bytes:
    """A bundle's JSON file: indented, keys sorted."""
    return (json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n").encode()


def gpu_host(configured: bool, target: TargetConfig, driver_dir: str = "/proc/driver/nvidia") -> bool:
    """Whether GPU evidence is wanted: NVML configured, GPUs named for the target, or the driver loaded."""
    return configured or bool(target.gpus) or os.path.isdir(driver_dir)
