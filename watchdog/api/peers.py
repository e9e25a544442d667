"""Who is asking: the local user owning the client's end of a TCP connection, else the client's address.

Any local process reaches the API on loopback without a token, each connection from a new port, so the port
says nothing and the address (127.0.0.1) is everybody's. The kernel knows more: /proc/net/tcp (tcp6 for IPv6
and v4-mapped addresses) lists every socket of this network namespace with its owner's uid, the client's end
too, whose local address is the peer's and whose remote address is ours. A peer not found there (another
host, a socket gone already) is known by its address.
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

MAX_READ = 4 << 20  # bytes of /proc/net/tcp read for one look-up (about 27,000 sockets)
CACHE_SECONDS = 10.0  # how long one connection's owner is remembered (a kept-alive client asks many times)
CACHE_SIZE = 4096
PROC_NET = Path("/proc/net")


def _hex(host: str) -> tuple[str, str] | None:
    """The /proc/net file that lists sockets of `host`'s family, and `host` as that file writes it: each
    32-bit word of the address in the machine's byte order, in upper-case hex."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return None
    packed = address.packed
    words = (int.from_bytes(packed[i : i + 4], sys.byteorder) for i in range(0, len(packed), 4))
    return ("tcp" if address.version == 4 else "tcp6"), "".join(f"{w:08X}" for w in words)


def socket_owner(peer: tuple[str, int], server: tuple[str, int], proc_net: Path = PROC_NET) -> int | None:
    """The uid owning the socket whose own end is `peer` and whose other end is `server`, or None."""
    ours, theirs = _hex(peer[0]), _hex(server[0])
    if ours is None or theirs is None or ours[0] != theirs[0]:
        return None
    needle = f": {ours[1]}:{peer[1]:04X} {theirs[1]}:{server[1]:04X} ".encode()
    try:
        with (proc_net / ours[0]).open("rb") as table:
            data = table.read(MAX_READ)
    except OSError:
        return None
    at = data.find(needle)
    if at < 0:
        return None
    end = data.find(b"\n", at)
    fields = data[at : end if end >= 0 else len(data)].split()
    # ":", local, remote, st, tx_queue:rx_queue, tr:tm->when, retrnsmt, uid, ...
    return int(fields[7]) if len(fields) > 7 and fields[7].isdigit() else None


class ClientIds:
    """The client a request comes from, as a key of the fair queue: `uid:1000` or `address:10.0.0.7`."""

    def __init__(self, monotonic: Callable[[], float], proc_net: Path = PROC_NET) -> None:
        self.monotonic = monotonic
        self.proc_net = proc_net
        self.cache: dict[tuple[Any, Any], tuple[str, float]] = {}

    def key(self, scope: Mapping[str, Any]) -> str:
        """The client key of an ASGI request scope."""
        peer, server = scope.get("client"), scope.get("server")
        if not peer:
            return "unknown"
        conn = (tuple(peer), tuple(server) if server else None)
        now = self.monotonic()
        known = self.cache.get(conn)
        if known is not None and known[1] > now:
            return known[0]
        uid = None
        if server and isinstance(peer[1], int) and isinstance(server[1], int):
            uid = socket_owner((str(peer[0]), peer[1]), (str(server[0]), server[1]), self.proc_net)
        key = f"address:{peer[0]}" if uid is None else f"uid:{uid}"
        if len(self.cache) >= CACHE_SIZE:
            self.cache.clear()
        self.cache[conn] = (key, now + CACHE_SECONDS)
        return key
