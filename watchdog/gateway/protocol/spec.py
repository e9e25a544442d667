"""What the daemon and the gateway process agree on: the spec a gateway runs with, and its exit codes.

The daemon's side (`process.py`) hands a spec to the process it starts; the gateway process (`main.py`) runs
one. Both import this module, so the daemon never imports the gateway's server to start one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import GatewayConfig
from .channel import default_socket_path

STOP_GRACE = 5.0  # in-flight requests get this long when the gateway is stopped on purpose
EXIT_CANNOT_LISTEN = 3
EXIT_CONTROL_SOCKET = 4  # the control socket's directory (or one on the way) is another user's, or unusable


@dataclass(frozen=True)
class GatewaySpec:
    """Everything a gateway process needs: its config, control socket and lease (sent as JSON on stdin)."""

    gateway: GatewayConfig
    control_socket: str
    control_lease: float


def spec_for(gateway: GatewayConfig, state_dir: str | None) -> GatewaySpec:
    """The spec of the gateway a config describes (the same whoever starts it: daemon, systemd, compose)."""
    listen = f"{gateway.listen_host}:{gateway.listen_port}"
    socket_path = gateway.control_socket or default_socket_path(state_dir, gateway.target, listen)
    return GatewaySpec(gateway, socket_path, gateway.control_lease)
