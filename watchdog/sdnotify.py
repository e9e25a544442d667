"""systemd notification protocol: READY=1, STOPPING=1 and WATCHDOG=1 over $NOTIFY_SOCKET."""

from __future__ import annotations

import socket
from collections.abc import Mapping


class Notifier:
    """Sends sd_notify datagrams; a no-op when not started by systemd."""

    def __init__(self, env: Mapping[str, str]) -> None:
        addr = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + addr[1:] if addr.startswith("@") else addr
        usec = env.get("WATCHDOG_USEC", "")
        self.watchdog_interval: float | None = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 else None

    @property
    def enabled(self) -> bool:
        """True when systemd gave us a socket."""
        return bool(self.address)

    def send(self, message: str) -> bool:
        """Send one message; failures are swallowed because systemd may be gone during shutdown."""
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self.address)
                sock.sendall(message.encode())
            return True
        except OSError:
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
