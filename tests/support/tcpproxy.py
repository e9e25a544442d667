"""A loopback TCP proxy a test can cut, to put one process on the wrong side of a network partition.

`TcpProxy(upstream_port)` listens on a free 127.0.0.1 port and forwards each connection to the upstream. `cut()`
makes it a black hole: open connections stop forwarding (bytes are read and dropped, nothing answers) and new
ones are accepted and ignored, so the client sees timeouts, as across a real partition, not refusals.
`heal()` forwards again for new connections. Threads only; `close()` ends everything.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.support.vllm_server import free_port

CHUNK = 65536


class TcpProxy:
    """127.0.0.1:<port> -> 127.0.0.1:<upstream>, until cut."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cut_event = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True, name=f"tcpproxy:{self.port}").start()

    def cut(self) -> None:
        """Black-hole every connection, open or new."""
        self.cut_event.set()

    def heal(self) -> None:
        """Forward again (new connections; the cut ones stay dead)."""
        self.cut_event.clear()

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._closed.set()
        with self._lock:
            for sock in [self._server, *self._sockets]:
                with contextlib.suppress(OSError):
                    sock.close()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._track(client)
            if self.cut_event.is_set():
                continue  # accepted, never answered: the client times out
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream), timeout=2)
            except OSError:
                client.close()
                continue
            self._track(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.2)
        while not self._closed.is_set():
            try:
                data = src.recv(CHUNK)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            if self.cut_event.is_set():
                continue  # dropped: nothing crosses the partition
            try:
                dst.sendall(data)
            except OSError:
                break
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
