"""Shared fixtures: loopback fault servers, the shared real vLLM server, fixture payloads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from faultserver import FaultServer

FIXTURES = Path(__file__).parent / "fixtures"

pytest_plugins = ["vllm_server", "docker_engine", "watchdogproc"]


@pytest.fixture
def fault() -> Iterator[FaultServer]:
    """A programmable HTTP server on 127.0.0.1."""
    server = FaultServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def vllm_payload() -> str:
    """A real /metrics body captured from vLLM 0.32 under load."""
    return (FIXTURES / "vllm-0.32.0-metrics.txt").read_text()


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio only (the daemon is asyncio)."""
    return "asyncio"
