"""File descriptors: the soft limit raised to the hard one at start, and a reserve that clients cannot take.

Go raises RLIMIT_NOFILE's soft limit to the hard limit when a program starts, so Prometheus is never held to
the default 1,024; Python does not. And a listener that accepts until the process runs out of descriptors
leaves nothing for scrapes, probes and state writes, then logs a traceback per failed accept (155,620 lines,
79 MB, in 45 s). So a listening `ReservingSocket` closes at once a connection whose descriptor eats into the
last `reserve`, and at EMFILE lets the event loop's own one-second back-off run without a retry per pending
connection; `AcceptErrors` writes the loop's report of it as one line a minute, with a count.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)
RESERVE = 64  # descriptors kept for scrapes, probes, notifications and state writes
NR_OPEN = "/proc/sys/fs/nr_open"  # the kernel's ceiling when the hard limit is "unlimited"
ACCEPT_OUT_OF_RESOURCE = "socket.accept() out of system resource"  # asyncio's message (selector_events)
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


@dataclass(frozen=True)
class OpenFilesLimit:
    """RLIMIT_NOFILE after `raise_open_files_limit`, and the soft limit it found."""

    soft: int
    hard: int
    was: int


def _ceiling(hard: int) -> int:
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        with open(NR_OPEN) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20  # Linux's default nr_open


def raise_open_files_limit() -> OpenFilesLimit:
    """Raise the soft RLIMIT_NOFILE to the hard limit, as Go does; keep it if the kernel refuses."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = _ceiling(hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as exc:
            log.warning(
                "cannot raise the open-files limit", extra={"soft": soft, "hard": hard, "error": str(exc)}
            )
            return OpenFilesLimit(soft, hard, soft)
        log.info("open-files limit raised to the hard limit", extra={"soft": want, "was": soft})
        return OpenFilesLimit(want, hard, soft)
    return OpenFilesLimit(soft, hard, soft)


def soft_limit() -> int | None:
    """The soft RLIMIT_NOFILE; None if unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def open_fds() -> int | None:
    """How many descriptors this process holds (Linux /proc); None where that cannot be read."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir held open
    except OSError:
        return None


def fds_available(reserve: int = 0) -> int | None:
    """Descriptors this process may still open, less `reserve`; None if unknown or unlimited."""
    soft, used = soft_limit(), open_fds()
    return None if soft is None or used is None else soft - used - reserve


class FdReserve:
    """Whether a new connection's descriptor eats into the last `reserve` of the soft limit.

    The kernel hands out the lowest free descriptor: a new one numbered `n` means at least `n + 1` are open;
    past the floor that alone decides, in O(1). Above a quarter of the limit, where earlier closes may have
    left lower holes, the open descriptors are counted, at most every `recount` seconds.
    """

    def __init__(
        self,
        reserve: int = RESERVE,
        *,
        limit: Callable[[], int | None] = soft_limit,
        count: Callable[[], int | None] = open_fds,
        monotonic: Callable[[], float] = time.monotonic,
        recount: float = 0.25,
    ) -> None:
        self.reserve = reserve
        self.limit, self.count, self.monotonic, self.recount = limit, count, monotonic, recount
        self.shed = 0  # connections closed at accept because they would eat into the reserve
        self.accept_errors = 0  # accepts that failed with EMFILE/ENFILE
        self._counted: tuple[float, int | None] = (-recount, None)

    def exhausted(self, fd: int) -> bool:
        """Whether the connection on descriptor `fd` leaves fewer than `reserve` free."""
        soft = self.limit()
        if soft is None:
            return False
        floor = soft - self.reserve
        if fd >= floor:
            return True
        if fd < soft // 4:
            return False
        now = self.monotonic()
        at, used = self._counted
        if now - at >= self.recount:
            used = self.count()
            self._counted = (now, used)
        return used is not None and used > floor


class ReservingSocket(socket.socket):
    """A listening socket for asyncio whose accept() sheds connections at the descriptor reserve.

    A connection that would leave fewer than `reserve` descriptors free is closed at once (the client sees the
    connection close) and reported to the loop as "nothing to accept", so that the next waits its turn. At
    EMFILE, the first failure in `backoff` seconds goes to the loop, which stops accepting for a second and
    reports it; the loop's further tries in the same pass (up to its backlog) see "nothing to accept" instead
    of logging a traceback each.
    """

    guard: FdReserve  # set by reserving_listener
    backoff = 0.5
    _failed_at = -1.0

    def accept(self) -> tuple[socket.socket, Any]:
        """Accept one connection, or shed it (BlockingIOError) when the reserve would be touched."""
        try:
            conn, addr = super().accept()
        except OSError as exc:
            if exc.errno not in _OUT_OF_DESCRIPTORS:
                raise
            self.guard.accept_errors += 1
            now = time.monotonic()
            if now - self._failed_at < self.backoff:
                raise BlockingIOError(errno.EAGAIN, "out of descriptors: accepting again shortly") from None
            self._failed_at = now
            raise
        if self.guard.exhausted(conn.fileno()):
            self.guard.shed += 1
            conn.close()
            raise BlockingIOError(errno.EAGAIN, "descriptor reserve reached: connection closed")
        return conn, addr


def reserving_listener(host: str, port: int, guard: FdReserve) -> socket.socket:
    """A bound TCP socket on host:port (SO_REUSEADDR, inheritable) that keeps `guard`'s reserve."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = ReservingSocket(family, socket.SOCK_STREAM)
    sock.guard = guard
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.set_inheritable(True)
    return sock


class AcceptErrors:
    """An event-loop exception handler: "accept out of resources" becomes one line per `every` seconds, with
    the count since the last one and no traceback; everything else goes to the loop's default handler."""

    def __init__(self, every: float = 60.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.every, self.monotonic = every, monotonic
        self.total = 0
        self._since, self._logged_at = 0, -every

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Become `loop`'s exception handler."""
        loop.set_exception_handler(self)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Count and maybe log an accept failure; pass anything else on."""
        if context.get("message") != ACCEPT_OUT_OF_RESOURCE:
            loop.default_exception_handler(context)
            return
        self.total += 1
        self._since += 1
        now = self.monotonic()
        if now - self._logged_at < self.every:
            return
        exc = context.get("exception")
        log.error(
            "out of file descriptors: connections wait while accepting backs off",
            extra={"failures": self._since, "error": str(exc), "open_fds": open_fds(), "limit": soft_limit()},
        )
        self._since, self._logged_at = 0, now
