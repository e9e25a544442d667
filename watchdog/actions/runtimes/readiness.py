"""Is a (re)started vLLM really back? `/health` answers 200 and a canary completion generates a token."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import httpx

from ...config.httpauth import ClientSettings, CredentialError
from ...config.httpclient import HttpClientConfig
from ...config.targets import TargetConfig
from ...sources.monitor import client_for
from ...sources.probes import CanaryProbe, HealthProbe

Sleep = Callable[[float], Awaitable[None]]
POLL = 1.0


class ReadyCheck:
    """Polls one target's health and canary until both succeed or a deadline passes."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        poll: float = POLL,
        client_factory: Callable[..., httpx.AsyncClient] = client_for,
    ) -> None:
        self.client = client  # for targets without TLS settings or credentials
        self.client_factory = client_factory  # (settings, tls): a client for one wait on a target with them
        self.monotonic = monotonic
        self.sleep = sleep
        self.poll = poll

    async def wait(
        self, target: TargetConfig, timeout: float, alive: Callable[[], Awaitable[bool]] | None = None
    ) -> tuple[bool, str]:
        """(True, "") once ready; (False, the last reason) when `timeout` seconds pass first, or at once
        when `alive` says the server process or container has exited (no point waiting for it)."""
        deadline = self.monotonic() + timeout
        settings = ClientSettings(target.http) if target.http != HttpClientConfig() else None
        health = HealthProbe(target.health_url, max(target.health_timeout, 2.0), settings=settings)
        own = None
        if settings is not None:
            try:
                tls = settings.ssl_context()
            except CredentialError:
                tls = None  # /health says why, at each try
            own = self.client_factory(settings, tls)
        try:
            return await self._wait(target, timeout, alive, health, deadline, own or self.client)
        finally:
            await health.aclose()
            if own is not None:
                await own.aclose()

    async def _wait(
        self,
        target: TargetConfig,
        timeout: float,
        alive: Callable[[], Awaitable[bool]] | None,
        health: HealthProbe,
        deadline: float,
        client: httpx.AsyncClient,
    ) -> tuple[bool, str]:
        # The canary always runs here, even where the periodic canary is disabled: only a generated
        # token proves the engine is back, and the model may have changed across a relaunch.
        canary_cfg = replace(target.canary, enabled=True, timeout=max(target.canary.timeout, 10.0))
        canary = CanaryProbe(target.url, canary_cfg, client)
        reason = "not probed yet"
        while True:
            h = await health.probe(0.0)
            if h.ok:
                c = await canary.probe(0.0)
                if c.ok:
                    return True, ""
                reason = f"canary: {c.last_error}"
            else:
                reason = f"/health: {h.last_error}"
                if alive is not None and not await alive():
                    return False, f"the server exited while starting ({reason})"
            if self.monotonic() + self.poll > deadline:
                return False, f"not ready within {timeout:g}s ({reason})"
            await self.sleep(self.poll)
