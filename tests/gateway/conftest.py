"""Fixtures the gateway's tests share: a loopback upstream and GatewayServers in front of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.gateway_upstream import Upstream
from tests.support.replayrig import Rig
from tests.support.vllm_server import free_port
from vllm_watchdog.config.gatewayreplay import ReplayConfig
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


@pytest.fixture
def rig(upstream: Upstream, gateway: Callable[..., GatewayServer]) -> Iterator[Callable[..., Rig]]:
    """Make a Rig with config overrides (replay: ReplayConfig keywords under `replay`)."""
    rigs: list[Rig] = []

    def make(**overrides: Any) -> Rig:
        replay = ReplayConfig(**overrides.pop("replay", {}))
        made = Rig(gateway(replay=replay, **overrides), upstream)
        rigs.append(made)
        return made

    yield make
    for made in rigs:
        made.pool.shutdown(wait=False, cancel_futures=True)
