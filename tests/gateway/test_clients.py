"""The write deadline on its own: a send that waits for the client past `write_timeout` aborts the connection."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from vllm_watchdog.gateway.dataplane.clients import ClientStalled, ClientTransports, ClientWriter

pytestmark = pytest.mark.anyio


class FakeTransport:
    """What ClientWriter and ClientTransports read of a transport."""

    def __init__(self, buffered: int, peer: tuple[str, int] = ("127.0.0.1", 5000)) -> None:
        self.buffered = buffered
        self.peer = peer
        self.aborted = False

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (16384, 65536)

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str) -> Any:
        return self.peer if name == "peername" else None

    def abort(self) -> None:
        self.aborted = True


async def test_a_send_the_client_does_not_take_aborts_its_connection() -> None:
    transport = FakeTransport(buffered=70_000)  # above the low-water mark: writing is paused
    never = asyncio.Event()

    async def blocked(message: Any) -> None:
        await never.wait()

    writer = ClientWriter(blocked, cast(asyncio.Transport, transport), timeout=0.01)
    with pytest.raises(ClientStalled):
        await writer({"type": "http.response.body", "body": b"x", "more_body": True})
    assert writer.stalled and transport.aborted


async def test_below_the_low_water_mark_a_send_goes_straight_through() -> None:
    transport = FakeTransport(buffered=0)
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    writer = ClientWriter(send, cast(asyncio.Transport, transport), timeout=0.01)
    await writer({"type": "http.response.start", "status": 200, "headers": []})
    transport.buffered = 20_000  # paused or not, a client that takes it in time is fine
    await writer({"type": "http.response.body", "body": b"", "more_body": False})
    assert len(sent) == 2 and not writer.stalled and not transport.aborted


def test_connections_are_found_by_the_scope_client_while_open() -> None:
    table = ClientTransports()
    transport = FakeTransport(0, ("127.0.0.1", 4242))
    table.add(cast(asyncio.Transport, transport))
    assert table.of({"client": ("127.0.0.1", 4242)}) is transport
    assert table.of({"client": ("127.0.0.1", 4243)}) is None and table.of({"client": None}) is None
    table.discard(cast(asyncio.Transport, transport))
    assert table.of({"client": ("127.0.0.1", 4242)}) is None and len(table) == 0
