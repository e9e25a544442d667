"""How the daemon reaches a gateway: the gateway process over its control channel, or (tests with injected
clocks) a GatewayServer in this process. Both speak the same commands (`commands.py`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from .channel import CommandRefused
from .commands import CommandError, GatewayCommands
from .server import GatewayServer


class GatewayLink(Protocol):
    """One gateway, as the daemon sees it."""

    supervise: bool  # this side starts the gateway (False: systemd or compose does, and may not have yet)

    async def attach(self) -> dict[str, Any]:
        """Reach (start or adopt) the gateway; its hello. OSError if it cannot listen."""

    async def request(self, op: str, args: Mapping[str, Any] | None = None) -> Any:
        """One command; ChannelError if unreachable, CommandRefused if refused."""

    async def revive(self) -> dict[str, Any] | None:
        """Start a new gateway if the old one died; its hello, or None if there is nothing to revive."""

    async def stop(self, grace: float) -> None:
        """Stop the gateway (if this side owns it); in-flight requests get `grace` seconds."""


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
