"""The watchdog as a real subprocess, for end-to-end tests: start it, poll its API, find vLLM servers."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest


def start_watchdog(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    """`vllm-watchdog run --config cfg`, output appended to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "vllm_watchdog", "run", "--config", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def poll(url: str, pred: Callable[[Any], bool], limit: float, what: str, log: Path) -> Any:
    """GET url (JSON) until pred holds; AssertionError with the last answer and the log's end if it never does."""
    deadline = time.monotonic() + limit
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(url, timeout=5).json()
            if pred(last):
                return last
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"{what} not within {limit}s; last: {last}; watchdog log: {log.read_text()[-3000:]}")


def api_servers(vport: int) -> list[int]:
    """PIDs of vLLM API servers listening on vport (by command line)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in argv and str(vport).encode() in argv:
            pids.append(int(entry.name))
    return pids


@pytest.fixture
def cleanup() -> Iterator[list[Callable[[], None]]]:
    """Callbacks run at teardown, even when the test fails: no vLLM or watchdog outlives the test."""
    todo: list[Callable[[], None]] = []
    yield todo
    for fn in reversed(todo):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            fn()
