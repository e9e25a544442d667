"""Is a (re)started vLLM really back? `/ready` (or `/health`) answers 200 and a canary completion generates a
token.

`GET /ready` is vLLM's readiness endpoint where it has one (vLLM 0.32's data-parallel supervisor serves
`/ready`; its plain API server has none): it is asked first, and a 404 means the server has none, which is
remembered for the rest of this wait (one server start) so that `/health` alone is asked from then on. A
target whose `health_path` is not `/health` is asked on that path alone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import httpx

from ...config.httpauth import ClientSettings, CredentialError
from ...config.httpclient import HttpClientConfig
from ...config.targets import TargetConfig
from ...errors import ScrapeError
from ...sources.httpget import HttpGet
from ...sources.monitor import client_for
from ...sources.probes import CanaryProbe, HealthProbe

Sleep = Callable[[float], Awaitable[None]]
POLL = 1.0
READY_PATH = "/ready"


class ReadyEndpoint:
    """`GET /ready` of one server start: whether it has one (None: not known yet) and its last status."""

    def __init__(self, url: str, timeout: float, settings: ClientSettings | None) -> None:
        self.http = HttpGet(url, {"User-Agent": "vllm-watchdog"}, 64 * 1024, settings=settings)
        self.timeout = timeout
        self.present: bool | None = None

    async def ask(self) -> int | None:
        """The status it answered (None: no answer); a 404 marks it absent."""
        try:
            async with asyncio.timeout(self.timeout):
                status = (await self.http.get()).status
        except (TimeoutError, ScrapeError):
            return None
        self.present = status != 404
        return status


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
        ready = None
        if target.health_path == "/health":
            url = target.url.rstrip("/") + READY_PATH
            ready = ReadyEndpoint(url, max(target.health_timeout, 2.0), settings)
        own = None
        if settings is not None:
            try:
                tls = settings.ssl_context()
            except CredentialError:
                tls = None  # /health says why, at each try
            own = self.client_factory(settings, tls)
        try:
            return await self._wait(target, timeout, alive, (health, ready), deadline, own or self.client)
        finally:
            await health.aclose()
            if ready is not None:
                await ready.http.aclose()
            if own is not None:
                await own.aclose()

    async def _wait(
        self,
        target: TargetConfig,
        timeout: float,
        alive: Callable[[], Awaitable[bool]] | None,
        probes: tuple[HealthProbe, ReadyEndpoint | None],
        deadline: float,
        client: httpx.AsyncClient,
    ) -> tuple[bool, str]:
        # The canary always runs here, even where the periodic canary is disabled: only a generated
        # token proves the engine is back, and the model may have changed across a relaunch.
        canary_cfg = replace(target.canary, enabled=True, timeout=max(target.canary.timeout, 10.0))
        canary = CanaryProbe(target.url, canary_cfg, client)
        reason = "not probed yet"
        while True:
            up, why = await _up(*probes)
            if up:
                c = await canary.probe(0.0)
                if c.ok:
                    return True, ""
                reason = f"canary: {c.last_error}"
            else:
                reason = why
                if alive is not None and not await alive():
                    return False, f"the server exited while starting ({reason})"
            if self.monotonic() + self.poll > deadline:
                return False, f"not ready within {timeout:g}s ({reason})"
            await self.sleep(self.poll)


async def _up(health: HealthProbe, ready: ReadyEndpoint | None) -> tuple[bool, str]:
    """Whether the server says it is ready: /ready where it has one, else /health; and why not."""
    if ready is not None and ready.present is not False:
        status = await ready.ask()
        if status is not None and status != 404:
            return status == 200, f"{READY_PATH}: HTTP status {status}"
    h = await health.probe(0.0)
    return bool(h.ok), f"/health: {h.last_error}"
