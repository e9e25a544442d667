"""A gateway in the daemon's own process: a GatewayServer on its own thread, for tests that drive its clock.

It speaks the same commands (`commands.py`) as the gateway process does over its control channel, so a
GatewayControl cannot tell the two links (`link.py`) apart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..protocol.channel import CommandRefused
from .commands import CommandError, GatewayCommands
from .server import GatewayServer


class LocalLink:
    """A GatewayServer on its own thread in this process: tests drive its clock."""

    supervise = True

    def __init__(self, server: GatewayServer, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.server = server
        self.commands = GatewayCommands(server, monotonic=monotonic)

    async def attach(self) -> dict[str, Any]:
        """Start the server thread."""
        await asyncio.to_thread(self.server.start)
        return dict(await self.request("hello"))

    async def request(self, op: str, args: Mapping[str, Any] | None = None) -> Any:
        """Run the command on the gateway's loop."""
        try:
            return await self.server.call(lambda: self.commands.run(op, args or {}))
        except CommandError as exc:
            raise CommandRefused(str(exc)) from None

    async def revive(self) -> dict[str, Any] | None:
        """A thread does not die on its own."""
        return None

    async def stop(self, grace: float) -> None:
        """Stop serving."""
        await asyncio.to_thread(self.server.stop, grace)
