"""Who is asking: the local user owning the client's end of a TCP connection, else the client's address.

Any local process reaches the API on loopback without a token, each connection from a new port, so the port
says nothing and the address (127.0.0.1) is everybody's. The kernel knows more: sock_diag (the netlink family
`ss` uses) finds one socket by its two ends and says who owns it, the client's end too, whose local address is
the peer's and whose remote address is ours. One exact look-up costs the same however many sockets the host
has; reading /proc/net/tcp instead cost 8.5 ms per look-up at 2,000 sockets, which an attacker opening
connections turned into a stalled loop. A peer not found (another host, a socket gone already) is known by its
address.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Callable, Mapping
from typing import Any

CACHE_SECONDS = 10.0  # how long one connection's owner is remembered (a kept-alive client asks many times)
CACHE_SIZE = 4096
TIMEOUT = 0.5  # seconds for the kernel's answer (it answers at once: the bound is for a broken netlink)

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_REQUEST = struct.Struct("=BBBBI")  # family, protocol, extensions, pad, states (inet_diag_req_v2)
_SOCKID = struct.Struct("!HH16s16s")  # ports and addresses of the two ends (inet_diag_sockid), big-endian
_SOCKID_TAIL = struct.Struct("=III")  # interface, cookie (two words; all ones: no cookie to check)
# inet_diag_msg: family, state, timer, retransmits; the socket id; expires, rqueue, wqueue; then idiag_uid
_UID_AT = _NLMSG_HEADER.size + 4 + _SOCKID.size + _SOCKID_TAIL.size + 12
_ALL_STATES = 0xFFFFFFFF
_NO_COOKIE = 0xFFFFFFFF


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` as an address; an IPv4-mapped IPv6 address as the IPv4 address it stands for (the client's
    socket of a dual-stack listener's IPv4 connection is an IPv4 socket)."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _request(local: tuple[Any, int], remote: tuple[Any, int]) -> bytes:
    """A netlink message asking for the TCP socket whose own end is `local`, its other end `remote`."""
    family = socket.AF_INET if local[0].version == 4 else socket.AF_INET6
    sockid = _SOCKID.pack(
        local[1], remote[1], local[0].packed.ljust(16, b"\0"), remote[0].packed.ljust(16, b"\0")
    )
    body = (
        _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, _ALL_STATES)
        + sockid
        + _SOCKID_TAIL.pack(0, _NO_COOKIE, _NO_COOKIE)
    )
    return (
        _NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + body
    )


def socket_owner(peer: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the TCP socket whose own end is `peer` and whose other end is `server`, or None."""
    ours, theirs = _address(peer[0]), _address(server[0])
    if ours is None or theirs is None or ours.version != theirs.version:
        return None
    if not (0 <= peer[1] < 65536 and 0 <= server[1] < 65536):
        return None
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as link:
            link.settimeout(TIMEOUT)
            link.send(_request((ours, peer[1]), (theirs, server[1])))
            answer = link.recv(65536)
    except OSError:
        return None
    if len(answer) < _UID_AT + 4:
        return None
    _, kind, _, _, _ = _NLMSG_HEADER.unpack_from(answer)
    if kind != _SOCK_DIAG_BY_FAMILY:  # NLMSG_ERROR: no such socket
        return None
    (uid,) = struct.unpack_from("=I", answer, _UID_AT)
    return int(uid)


class ClientIds:
    """The client a request comes from, as a key of the fair queue: `uid:1000` or `address:10.0.0.7`."""

    def __init__(
        self,
        monotonic: Callable[[], float],
        owner: Callable[[tuple[str, int], tuple[str, int]], int | None] = socket_owner,
    ) -> None:
        self.monotonic = monotonic
        self.owner = owner
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
            uid = self.owner((str(peer[0]), peer[1]), (str(server[0]), server[1]))
        key = f"address:{peer[0]}" if uid is None else f"uid:{uid}"
        if len(self.cache) >= CACHE_SIZE:
            self.cache.clear()
        self.cache[conn] = (key, now + CACHE_SECONDS)
        return key
