"""Who is asking: the owner of the client's socket on this machine, else the client's address."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

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


def test_a_peer_not_on_this_machine_is_known_by_its_address() -> None:
    ids = ClientIds(lambda: 0.0)
    assert ids.key({"client": ("192.0.2.7", 40000), "server": ("192.0.2.1", 9090)}) == "address:192.0.2.7"
    assert ids.key({"client": ("192.0.2.7", 40001), "server": ("192.0.2.1", None)}) == "address:192.0.2.7"
    assert ids.key({"client": None}) == "unknown"
    assert socket_owner(("127.0.0.1", 5), ("::1", 6)) is None  # two families: no such socket
    assert socket_owner(("not an address", 5), ("127.0.0.1", 6)) is None
    assert socket_owner(("127.0.0.1", 70000), ("127.0.0.1", 6)) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="making a socket of another user needs root (CI runs as root)")
def test_another_users_socket_is_known_by_that_user() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    pid = os.fork()
    if pid == 0:  # the child becomes nobody, connects, and waits to be found
        try:
            os.setuid(65534)
            with socket.create_connection(server.getsockname()):
                time.sleep(30)  # killed as soon as it was found
        finally:
            os._exit(0)
    try:
        accepted, peer = server.accept()
        assert socket_owner(peer, server.getsockname()) == 65534
        mapped = (f"::ffff:{peer[0]}", peer[1])  # as a dual-stack listener names an IPv4 client
        assert ClientIds(lambda: 0.0).key({"client": mapped, "server": server.getsockname()}) == "uid:65534"
        accepted.close()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        server.close()
