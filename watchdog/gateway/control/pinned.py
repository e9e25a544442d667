"""A gateway process the daemon may signal: the child it started, or an adopted one it verified and pinned.

A pid that a gateway names over the control channel is only a claim, and a pid number can be reused by the
time it is signalled. So the daemon signals a gateway only through a handle: the Popen of its own child, or a
pidfd on the process that holds the control socket's listening end (the kernel's SO_PEERCRED pid), opened only
when that is the pid the gateway claims and it runs as our user or root. A signal sent through a pidfd never
reaches a process that took the pid over later.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess

from ..protocol.trust import Peer, trusted_uids

log = logging.getLogger("vllm_watchdog.gateway.pinned")  # the name its logs had before the sub-packages


class PinnedProcess:
    """A gateway process this daemon may signal (its child, or a pidfd on a verified one)."""

    def __init__(
        self, pid: int, *, child: subprocess.Popen[bytes] | None = None, pidfd: int | None = None
    ) -> None:
        self.pid = pid
        self.child = child
        self._pidfd = pidfd

    def alive(self) -> bool:
        """Whether the process still runs (a child of ours is reaped here once it ended)."""
        if self.child is not None:
            return self.child.poll() is None
        if self._pidfd is None:
            return False
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        return not poller.poll(0)  # a pidfd turns readable when its process ends

    def send(self, sig: int) -> None:
        """Signal the process; nothing if it has ended (never a process that took its pid over)."""
        with contextlib.suppress(ProcessLookupError):
            if self.child is not None:
                self.child.send_signal(sig)  # does nothing once the child was reaped
            elif self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)

    def close(self) -> None:
        """Let go of the pidfd (the process goes on)."""
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def pin(peer: Peer, claimed: object, euid: int, path: str) -> PinnedProcess | None:
    """A pidfd on the process serving `path` if it is the pid the gateway claims and runs as our user or root;
    None (logged) otherwise, and such a gateway is never signalled."""
    if isinstance(claimed, bool) or claimed != peer.pid or peer.pid <= 0:
        log.warning(
            "the gateway claims a pid that does not hold its control socket: it will not be stopped or "
            "started again by this watchdog",
            extra={"control": path, "claimed_pid": claimed, "socket_pid": peer.pid},
        )
        return None
    if peer.uid not in trusted_uids(euid):  # the channel refused such a peer already
        return None
    try:
        fd = os.pidfd_open(peer.pid)
    except OSError as exc:  # gone already, or a kernel without pidfds (before 5.3)
        log.warning(
            "cannot pin the gateway process: it will not be stopped or started again by this watchdog",
            extra={"control": path, "pid": peer.pid, "error": str(exc)},
        )
        return None
    return PinnedProcess(peer.pid, pidfd=fd)
