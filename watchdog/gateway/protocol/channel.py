"""The control channel between the daemon and the gateway process: JSON lines over a Unix socket.

Authenticated by the kernel, on both ends (`trust.py`): the socket lives in a directory that only our user (or
root) can change, on a path that nobody else can redirect, and the socket itself is 0600. The gateway serves
only peers whose credentials (SO_PEERCRED) are our own uid or root; the daemon checks the directory, the
socket and the listening process's uid the same way before it sends anything, so that another local user who
got there first never receives a command (nor the config with its API keys) and never feeds it a status. One
request and one answer per line: `{"id": 1, "op": "tick", "args": {...}}` -> `{"id": 1, "ok": true, "result":
...}`. Every read is bounded in size and time, and a handful of connections at most are served at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .trust import NotTrusted, Peer, check_peer, check_socket, peer_of, private_dir, trusted_uids

log = logging.getLogger("vllm_watchdog.gateway.channel")  # the name its logs had before the sub-packages
MAX_REQUEST = 1024 * 1024  # a config is a few kB; the cap only stops a runaway peer
MAX_ANSWER = 64 * 1024 * 1024  # snapshots carry the top-K sessions only, but leave room
MAX_CONNECTIONS = 8
MAX_SOCKET_PATH = 107
IDLE_TIMEOUT = 300.0  # a silent control connection is closed (the daemon speaks every second)


class ChannelError(Exception):
    """The gateway did not answer (gone, not started, too slow) or answered garbage."""


class CommandRefused(Exception):
    """The gateway answered, and refused the command (its message says why)."""


def default_socket_path(state_dir: str | None, target: str, listen: str) -> str:
    """Where the control socket lives when the config does not say: the runtime directory systemd gives us
    (or /tmp), in a directory of our own, named by the state directory, target and listen address (which
    only one process on the host can hold), so that two watchdogs on one host never meet. In /tmp when that
    would be too long for a Unix socket (107 bytes). Either side refuses a directory there that another user
    made first (`trust.py`): the /tmp fallback (cron, sudo, `su -c`) is shared with every local user."""
    text = f"{os.path.abspath(state_dir or '')}\0{target}\0{listen}"
    key = hashlib.sha256(text.encode()).hexdigest()[:12]
    name = os.path.join(f"vllm-watchdog-{os.geteuid()}", f"gateway-{key}.sock")
    env = os.environ
    base = env.get("RUNTIME_DIRECTORY", "").split(":")[0] or env.get("XDG_RUNTIME_DIR") or "/tmp"
    path = os.path.join(base, name)
    return path if len(path.encode()) <= MAX_SOCKET_PATH else os.path.join("/tmp", name)


def _peer_allowed(sock: socket.socket | None) -> bool:
    if sock is None or sock.family != socket.AF_UNIX:
        return False
    try:
        return peer_of(sock).uid in trusted_uids(os.geteuid())
    except OSError:
        return False


Handler = Callable[[str, Mapping[str, Any]], Awaitable[Any]]


class ControlServer:
    """The gateway's side: serves commands from the daemon on a Unix socket."""

    def __init__(self, path: str, handler: Handler) -> None:
        self.path = path
        self._handler = handler
        self._server: asyncio.AbstractServer | None = None
        self._open = 0

    async def start(self) -> None:
        """Bind the socket (replacing a stale one) and serve; OSError if it cannot, NotTrusted (an OSError)
        if its directory, or one on the way to it, is another user's."""
        private_dir(os.path.dirname(self.path), euid=os.geteuid(), create=True)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._serve, self.path, limit=MAX_REQUEST)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        """Stop serving and remove the socket if it is still ours."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS or not _peer_allowed(writer.get_extra_info("socket")):
            writer.close()
            return
        self._open += 1
        try:
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), IDLE_TIMEOUT)
                except (asyncio.TimeoutError, ValueError, ConnectionError):  # ValueError: a line over the cap
                    return
                except asyncio.CancelledError:  # shutting down: end quietly (asyncio logs cancelled ones)
                    return
                if not line:
                    return
                writer.write(await self._answer(line))
                await writer.drain()
        except ConnectionError:
            return
        finally:
            self._open -= 1
            writer.close()

    async def _answer(self, line: bytes) -> bytes:
        ident: object = None
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
            ident, op, args = request.get("id"), request.get("op"), request.get("args", {})
            if not isinstance(op, str) or not isinstance(args, dict):
                raise ValueError("op must be a string and args an object")
            answer = {"id": ident, "ok": True, "result": await self._handler(op, args)}
        except (ValueError, TypeError, RecursionError) as exc:
            answer = {"id": ident, "ok": False, "error": str(exc)[:1024]}
        return json.dumps(answer, separators=(",", ":")).encode() + b"\n"


class ControlClient:
    """The daemon's side: one connection, re-opened when lost; one command at a time. A connection is used
    only once its directory, socket and listening process are trusted (`trust.py`)."""

    def __init__(self, path: str, *, timeout: float = 5.0, euid: int | None = None) -> None:
        self.path = path
        self.timeout = timeout
        self.euid = os.geteuid() if euid is None else euid
        self.peer: Peer | None = None  # the verified process at the other end of the current connection
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()
        self._next = 0
        self._refusal = ""  # the last distrust logged (logged again only when it changes)

    async def request(
        self, op: str, args: Mapping[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """Send one command and return its result; ChannelError if the gateway cannot be reached in time,
        CommandRefused if it answered with an error."""
        async with self._lock:
            try:
                return await asyncio.wait_for(self._exchange(op, args or {}), timeout or self.timeout)
            except CommandRefused:
                raise
            except NotTrusted as exc:
                self._drop()
                if str(exc) != self._refusal:
                    log.error("refusing the gateway's control socket", extra={"error": str(exc)})
                    self._refusal = str(exc)
                raise ChannelError(f"gateway control {op}: {exc}") from None
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                self._drop()
                raise ChannelError(f"gateway control {op}: {type(exc).__name__}: {exc}") from None

    async def _exchange(self, op: str, args: Mapping[str, Any]) -> Any:
        if self._streams is None:
            self._streams = await self._connect()
        reader, writer = self._streams
        self._next += 1
        ident = self._next
        writer.write(
            json.dumps({"id": ident, "op": op, "args": args}, separators=(",", ":")).encode() + b"\n"
        )
        await writer.drain()
        line = await reader.readline()
        if not line:
            raise ConnectionResetError("the gateway closed the control connection")
        answer = json.loads(line)
        if not isinstance(answer, dict) or answer.get("id") != ident:
            raise ValueError("an answer that does not match the request")
        if not answer.get("ok"):
            raise CommandRefused(str(answer.get("error", "refused")))
        return answer.get("result")

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect, once the directory and socket are trusted; then the listener must run as us or root."""
        private_dir(os.path.dirname(self.path), euid=self.euid, create=False)
        check_socket(self.path, self.euid)
        reader, writer = await asyncio.open_unix_connection(self.path, limit=MAX_ANSWER)
        try:
            try:
                peer = peer_of(writer.get_extra_info("socket"))
            except (OSError, AttributeError) as exc:  # AttributeError: no socket at all
                raise NotTrusted(f"control socket {self.path}: no peer credentials ({exc})") from None
            check_peer(peer, self.path, self.euid)
        except NotTrusted:
            writer.close()
            raise
        self.peer = peer
        self._refusal = ""
        return reader, writer

    def _drop(self) -> None:
        self.peer = None
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None

    async def aclose(self) -> None:
        """Close the connection."""
        async with self._lock:
            self._drop()
