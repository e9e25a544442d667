"""Who is asking: the owner of the client's socket on this machine, else the client's address."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_watchdog.api.peers import ClientIds, socket_owner


def _connected(family: socket.AddressFamily, host: str) -> Iterator[tuple[socket.socket, socket.socket]]:
    server = socket.socket(family)
    server.bind((host, 0))
    server.listen()
    client = socket.create_connection(server.getsockname()[:2])
    accepted, _ = server.accept()
    try:
        yield client, accepted
    finally:
        for s in (client, accepted, server):
            s.close()


@pytest.fixture(params=[(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")], ids=["tcp", "tcp6"])
def connection(request: pytest.FixtureRequest) -> Iterator[tuple[socket.socket, socket.socket]]:
    family, host = request.param
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        yield from _connected(family, host)
    except OSError as exc:
        pytest.skip(f"cannot listen on {host}: {exc}")


def test_the_clients_socket_is_found_with_its_owner(connection: tuple[socket.socket, socket.socket]) -> None:
    _client, accepted = connection
    peer, server = accepted.getpeername()[:2], accepted.getsockname()[:2]
    assert socket_owner(peer, server) == os.getuid()
    assert socket_owner(server, peer) == os.getuid()  # the accepted end is ours
    assert socket_owner(peer, (server[0], server[1] ^ 1)) is None
    ids = ClientIds(lambda: 0.0)
    assert ids.key({"client": peer, "server": server}) == f"uid:{os.getuid()}"


def test_a_peer_not_on_this_machine_is_known_by_its_address(tmp_path: Path) -> None:
    ids = ClientIds(lambda: 0.0, proc_net=tmp_path)  # no tables at all
    assert ids.key({"client": ("10.0.0.7", 40000), "server": ("10.0.0.1", 9090)}) == "address:10.0.0.7"
    assert ids.key({"client": ("10.0.0.7", 40001), "server": ("10.0.0.1", None)}) == "address:10.0.0.7"
    assert ids.key({"client": None}) == "unknown"
    (tmp_path / "tcp").write_bytes(b"x" * (8 << 20))  # a table past the read bound: read in part, no match
    assert ids.key({"client": ("127.0.0.1", 5), "server": ("127.0.0.1", 6)}) == "address:127.0.0.1"
