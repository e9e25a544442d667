"""Fixtures the gateway's tests share: a loopback upstream and GatewayServers in front of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.gateway_upstream import Upstream
from tests.support.vllm_server import free_port
from vllm_watchdog.gateway.config import GatewayConfig
from vllm_watchdog.gateway.dataplane.server import GatewayServer


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    """A programmable upstream on 127.0.0.1."""
    up = Upstream()
    yield up
    up.close()


@pytest.fixture
def gateway(upstream: Upstream) -> Iterator[Callable[..., GatewayServer]]:
    """Start a GatewayServer in front of `upstream` (config fields as keyword overrides)."""
    servers: list[GatewayServer] = []

    def make(**overrides: Any) -> GatewayServer:
        overrides.setdefault("upstream", upstream.url)
        server = GatewayServer(GatewayConfig(target="test", listen_port=free_port(), **overrides))
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop(grace=1.0)
