"""How the daemon reaches a gateway: the gateway process over its control channel (`process.py`), or (tests
with injected clocks) a GatewayServer in this process (`locallink.py`). Both speak the same commands
(`commands.py`); this protocol is all the daemon imports, so it never loads the gateway's server."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


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
