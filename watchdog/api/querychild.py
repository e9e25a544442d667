"""A query's whole work in a forked child process, so that the daemon's event loop (scrapes, rule evaluation,
actions) only waits on a pipe while a read-API query is parsed, evaluated, sorted, redacted and encoded.

`os.fork` gives the child a copy-on-write snapshot of the store as it is at that moment: nothing crosses a
thread boundary and nothing is copied up front. The child drops the parent's signal handling first (asyncio's
wakeup fd is the parent's own: a signal to the child must never reach the parent's loop), closes every
descriptor but its pipe, lowers its priority, limits its memory, CPU and wall time and writes no core file;
it runs the work, writes the framed answer to the pipe and leaves with `os._exit`, running nothing of the
parent's. The parent reads the pipe from its loop, up to a byte cap, kills the child at the deadline and
always reaps it. A crash in the child (a segfault in a native parser, an abort) costs that one query.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import math
import os
import resource
import signal
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

HEADER = 16  # b"SSS LLLLLLLLLLL\n": the HTTP status and the body's length
CHUNK = 1 << 20  # bytes asked of the pipe per read
PIPE_SIZE = 1 << 20  # the pipe's buffer, as far as the kernel allows: fewer wake-ups of the loop
POLL = 0.01  # seconds between checks for the child's exit where pidfd_open is missing
EXIT_MEMORY = 3  # the child's exit status when its work ran out of its memory budget
PIPE_FD = 3  # the child moves its end of the pipe here and closes every descriptor above


@dataclass(frozen=True)
class Answer:
    """What the child answered: an HTTP status and the encoded body."""

    status: int
    body: bytes


@dataclass(frozen=True)
class ChildLimits:
    """The bounds of one child: wall seconds (the parent kills it then), bytes of answer, bytes of memory
    beyond what the parent had mapped, CPU seconds, and how much lower its CPU priority is."""

    seconds: float = 2.5
    max_bytes: int = 64 << 20
    memory: int = 1 << 30
    cpu_seconds: int = 4
    nice: int = 10


class ChildFailed(Exception):
    """The child gave no answer: `kind` is timeout, too_large, memory or crashed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def frame(answer: Answer) -> bytes:
    """The bytes a child writes: the header, then the body."""
    return b"%03d %011d\n" % (answer.status, len(answer.body)) + answer.body


def unframe(raw: bytes) -> Answer | None:
    """The answer in `raw`, or None if it is not one whole frame (the child died while writing)."""
    head = raw[:HEADER]
    if len(head) < HEADER or head[3:4] != b" " or head[-1:] != b"\n":
        return None
    try:
        status, length = int(head[:3]), int(head[4:-1])
    except ValueError:
        return None
    return Answer(status, raw[HEADER:]) if len(raw) - HEADER == length else None


def describe(status: int) -> str:
    """A wait status in words: `killed by SIGSEGV`, `exit status 1`."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"killed by {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def _limit(limits: ChildLimits) -> None:
    """In the child: lower priority, no core file, and ceilings on memory, CPU and wall time."""
    os.nice(limits.nice)
    with open("/proc/self/statm", "rb") as statm:
        mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    for kind, wanted in (
        (resource.RLIMIT_AS, mapped + limits.memory),
        (resource.RLIMIT_CPU, limits.cpu_seconds),
        (resource.RLIMIT_CORE, 0),
    ):
        hard = resource.getrlimit(kind)[1]
        value = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(kind, (value, value))
    signal.alarm(math.ceil(limits.seconds) + 2)  # should the parent be gone, SIGALRM ends the child


def _child(
    work: Callable[[], Answer], write_fd: int, limits: ChildLimits, mask: set[int | signal.Signals]
) -> NoReturn:
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        for sig in signal.valid_signals():
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        os.dup2(write_fd, PIPE_FD)
        most = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        os.closerange(PIPE_FD + 1, 1 << 20 if most == resource.RLIM_INFINITY else most)
        gc.disable()  # a collection would touch, and so copy, every page of the parent's heap
        _limit(limits)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        try:
            data = frame(work())
        except MemoryError:
            code = EXIT_MEMORY
        else:
            view = memoryview(data)
            while view:
                view = view[os.write(PIPE_FD, view) :]
            code = 0
    finally:
        os._exit(code)


def _exit_status(loop: asyncio.AbstractEventLoop, pid: int) -> asyncio.Future[int]:
    """The child's wait status; a callback on the loop reaps it, whether anybody still awaits it or not."""
    done: asyncio.Future[int] = loop.create_future()
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = -1

    def check() -> None:
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            reaped, status = pid, 0
        if reaped == 0:
            if pidfd < 0:
                loop.call_later(POLL, check)
            return
        if pidfd >= 0:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        if not done.done():
            done.set_result(status)

    if pidfd >= 0:
        loop.add_reader(pidfd, check)
    else:
        loop.call_later(POLL, check)
    return done


async def _read(loop: asyncio.AbstractEventLoop, fd: int, cap: int) -> bytes | None:
    """Everything written to the pipe until end of file, or None past `cap` bytes."""
    chunks: list[bytes] = []
    size = 0
    done: asyncio.Future[bool] = loop.create_future()

    def readable() -> None:
        nonlocal size
        if done.done():
            return
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        size += len(chunk)
        chunks.append(chunk)
        if not chunk or size > cap:
            done.set_result(size <= cap)

    loop.add_reader(fd, readable)
    try:
        within = await done
    finally:
        loop.remove_reader(fd)
    return b"".join(chunks) if within else None


class Child:
    """A forked child running one query; `answer()` waits for what it writes."""

    def __init__(self, pid: int, read_fd: int, limits: ChildLimits) -> None:
        self.pid = pid
        self.read_fd = read_fd
        self.limits = limits
        self.exited = _exit_status(asyncio.get_running_loop(), pid)

    async def _collect(self) -> Answer:
        raw = await _read(asyncio.get_running_loop(), self.read_fd, HEADER + self.limits.max_bytes)
        if raw is None:
            raise ChildFailed("too_large", f"the answer is larger than {self.limits.max_bytes} bytes")
        answer = unframe(raw)
        if answer is not None:
            return answer
        status = await asyncio.shield(self.exited)  # end of file: it has exited
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_MEMORY:
            raise ChildFailed("memory", f"the query needed more than {self.limits.memory} bytes of memory")
        raise ChildFailed("crashed", f"the query's process died ({describe(status)})")

    async def answer(self) -> Answer:
        """The child's answer; ChildFailed if it timed out, wrote too much, ran out of memory or died."""
        try:
            return await asyncio.wait_for(self._collect(), self.limits.seconds)
        except TimeoutError:
            raise ChildFailed("timeout", "query timed out in query execution") from None
        finally:
            os.close(self.read_fd)
            if not self.exited.done():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)  # not reaped yet, so the pid is still this child's


def spawn(work: Callable[[], Answer], limits: ChildLimits) -> Child:
    """Fork a child that runs `work` and writes its answer; the parent returns at once."""
    read_fd, write_fd = os.pipe()
    try:
        with contextlib.suppress(OSError):  # past /proc/sys/fs/pipe-max-size: the default 64 KiB
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        # Signals stay blocked across the fork, so that none reaches the child before it drops the
        # parent's handlers and wakeup fd.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork while threads exist
                pid = os.fork()
            if pid == 0:
                _child(work, write_fd, limits, mask)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    os.set_blocking(read_fd, False)
    return Child(pid, read_fd, limits)
