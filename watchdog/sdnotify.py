"""systemd notification protocol over $NOTIFY_SOCKET: READY=1, STOPPING=1, WATCHDOG=1, STATUS= and
RELOADING=1 (with the MONOTONIC_USEC= that systemd 253 and later want with it)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping


class Notifier:
    """Sends sd_notify datagrams; a no-op when not started by systemd."""

    def __init__(self, env: Mapping[str, str], monotonic_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.monotonic_ns = monotonic_ns  # CLOCK_MONOTONIC, as systemd reads MONOTONIC_USEC
        self._status: str | None = None
        addr = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + addr[1:] if addr.startswith("@") else addr
        usec = env.get("WATCHDOG_USEC", "")
        self.watchdog_interval: float | None = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 else None

    @property
    def enabled(self) -> bool:
        """True when systemd gave us a socket."""
        return bool(self.address)

    def send(self, message: str) -> bool:
        """Send one message without ever waiting; False if it was not sent. Failures are swallowed: systemd
        may be gone during shutdown. A receiver that stops reading fills its queue (10 datagrams by default,
        net.unix.max_dgram_qlen); a blocking send would then stop the caller's event loop, signal handlers
        included, so a message that does not fit at once is dropped, as a WATCHDOG=1 nobody reads is."""
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                sock.connect(self.address)
                sock.send(message.encode())
            return True
        except OSError:  # BlockingIOError (a full queue) among them
            return False

    def ready(self) -> bool:
        """Tell systemd start-up finished."""
        return self.send("READY=1")

    def ping(self) -> bool:
        """Keep the systemd watchdog from killing us."""
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        """Tell systemd we are shutting down."""
        return self.send("STOPPING=1")

    def reloading(self) -> bool:
        """Tell systemd a reload started; READY=1 (`ready`) says it finished, whatever its outcome."""
        return self.send(f"RELOADING=1\nMONOTONIC_USEC={self.monotonic_ns() // 1000}")

    def status(self, line: str) -> bool:
        """Show `line` in `systemctl status`; sent only when it changed. False when nothing was sent."""
        line = " ".join(line.split())  # one line: a newline would start another assignment
        if line == self._status or not self.address:
            return False
        sent = self.send(f"STATUS={line}")
        if sent:
            self._status = line
        return sent
