"""The readiness check after a (re)start: /ready where the server has one (404: absent for that start, then
/health), and a canary token; against a real HTTP server whose answers the test programs, time injected."""

from __future__ import annotations

import httpx
import pytest

from tests.support.clock import Clock
from tests.support.faultserver import FaultServer
from vllm_watchdog.actions.runtimes.readiness import ReadyCheck
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.config.targets import TargetConfig

pytestmark = pytest.mark.anyio


def target(url: str, health_path: str = "/health") -> TargetConfig:
    text = f"targets: [{{name: t, url: '{url}', health_path: '{health_path}'}}]\n"
    return parse_config(text, "c.yml", env={}).targets[0]


def asked(fault: FaultServer, path: str) -> int:
    return sum(1 for _, p, _ in fault.requests if p == path)


async def check(fault: FaultServer, timeout: float, health_path: str = "/health") -> tuple[bool, str]:
    clock = Clock()

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    async with httpx.AsyncClient(trust_env=False) as client:
        return await ReadyCheck(client, monotonic=clock, sleep=sleep).wait(
            target(fault.url, health_path), timeout
        )


def serving(fault: FaultServer) -> None:
    fault.set("/health", "")
    fault.set("/v1/models", {"data": [{"id": "m"}]})
    fault.set("/v1/completions", {"usage": {"completion_tokens": 1}})


async def test_a_server_without_ready_is_asked_once_then_health_alone(fault: FaultServer) -> None:
    serving(fault)
    fault.set("/v1/completions", {"usage": {"completion_tokens": 0}})  # not generating yet: polled again
    assert await check(fault, 5.0) == (False, "not ready within 5s (canary: completion generated no tokens)")
    assert asked(fault, "/ready") == 1 and asked(fault, "/health") == 6  # the 404 is remembered


async def test_ready_where_it_exists_decides_over_health(fault: FaultServer) -> None:
    serving(fault)
    fault.set("/ready", "", status=503)  # vLLM's DP supervisor: up, but a rank is not ready yet
    assert await check(fault, 3.0) == (False, "not ready within 3s (/ready: HTTP status 503)")
    assert asked(fault, "/health") == 0
    fault.set("/ready", "")
    assert await check(fault, 3.0) == (True, "")


async def test_a_custom_health_path_is_asked_alone(fault: FaultServer) -> None:
    serving(fault)
    fault.set("/ready", "", status=503)
    fault.set("/livez", "")
    assert await check(fault, 3.0, "/livez") == (True, "")
    assert asked(fault, "/ready") == 0
