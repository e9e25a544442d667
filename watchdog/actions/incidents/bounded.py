"""Commands and files read with a bound on bytes: what a collector keeps of a tool's output or a log file.

A command is killed when its output passes the bound or when its caller is cancelled (the collection's budget
ran out), and reaped before the call returns (a killed process is gone within milliseconds; the wait for it is
bounded all the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_CHUNK = 64 * 1024
_REAP_WAIT = 2.0


@dataclass(frozen=True)
class Output:
    """What a command printed (each stream cut at the bound) and its exit status (None: killed)."""

    code: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool = False

    def problem(self, argv0: str) -> str:
        """Why the command failed, from its status and the end of its stderr; "" when it succeeded."""
        if self.code == 0:
            return ""
        said = self.stderr.decode(errors="replace").strip().splitlines()
        last = said[-1][:300] if said else "no output"
        status = "killed" if self.code is None else f"exited {self.code}"
        return f"{os.path.basename(argv0)} {status}: {last}"


async def run_command(argv: Sequence[str], max_bytes: int) -> Output:
    """Run `argv` (no shell, stdin closed) and keep at most `max_bytes` of each stream; OSError if it
    cannot start."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        (out, cut_out), (err, cut_err) = await asyncio.gather(
            _read(proc.stdout, max_bytes), _read(proc.stderr, max_bytes)
        )
        if cut_out or cut_err:
            await _kill(proc)
        code = await proc.wait()
        return Output(None if cut_out or cut_err else code, out, err, cut_out or cut_err)
    finally:
        if proc.returncode is None:
            await _kill(proc)


async def matching_lines(
    argv: Sequence[str], keep: Callable[[str], bool], last: int, max_line: int = 4096
) -> tuple[list[str], Output]:
    """Run `argv` and keep the last `last` lines of its stdout that pass `keep` (each cut at `max_line`
    characters): the whole output is read, and only those lines are held. Output carries stderr."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=max_line * 2,
    )
    kept: deque[str] = deque(maxlen=last)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        errors = asyncio.ensure_future(_read(proc.stderr, _CHUNK))
        while True:
            try:
                raw = await proc.stdout.readline()
            except ValueError:  # a line over the reader's limit: skip it
                raw = await proc.stdout.read(max_line * 2)
                continue
            if not raw:
                break
            line = raw.decode(errors="replace").rstrip("\n")[:max_line]
            if keep(line):
                kept.append(line)
        err, _ = await errors
        code = await proc.wait()
        return list(kept), Output(code, b"", err)
    finally:
        if proc.returncode is None:
            await _kill(proc)


async def _read(stream: asyncio.StreamReader, max_bytes: int) -> tuple[bytes, bool]:
    data = bytearray()
    while chunk := await stream.read(_CHUNK):
        if len(data) + len(chunk) > max_bytes:
            data += chunk[: max_bytes - len(data)]
            return bytes(data), True
        data += chunk
    return bytes(data), False


async def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(proc.wait(), _REAP_WAIT)


def read_head(path: str, max_bytes: int) -> bytes:
    """The first `max_bytes` of a file (procfs files report size 0: read, not stat)."""
    with open(path, "rb") as f:
        return f.read(max_bytes)


def read_tail(path: str, max_bytes: int) -> tuple[bytes, bool]:
    """The last `max_bytes` of a regular file, and whether anything before them was left out."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = max(0, size - max_bytes)
        f.seek(start)
        return f.read(max_bytes), start > 0


def last_lines(data: bytes, lines: int, cut: bool) -> list[str]:
    """The last `lines` lines of `data`; a first line that `cut` says began before the data is dropped."""
    text = data.decode(errors="replace").splitlines()
    if cut and text:
        text = text[1:]
    return text[-lines:] if lines else []
