"""Active probes: GET /health, and a 1-token canary completion that proves the engine generates."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ..config.httpauth import ClientSettings
from ..config.targets import CanaryConfig
from ..errors import ScrapeError
from .httpget import HttpGet

PROBE_SERIES: dict[str, tuple[str, str]] = {
    "health": ("vllm_watchdog_health_up", "vllm_watchdog_health_latency_seconds"),
    "canary": ("vllm_watchdog_canary_success", "vllm_watchdog_canary_latency_seconds"),
}
"""Probe kind -> (outcome series 1/0, latency series in seconds), as the monitor stores them."""
HEALTH_BODY_LIMIT = 1 << 20  # vLLM answers /health with an empty body; a proxy's error page fits too
_HEALTH_HEADERS = {"Accept-Encoding": "identity", "User-Agent": "vllm-watchdog"}


@dataclass
class ProbeStatus:
    """The last result of one probe."""

    ok: bool | None = None  # None: never ran
    latency: float = 0.0
    last_probe: float | None = None
    last_error: str | None = None
    last_ok: float | None = None  # wall-clock time the last successful probe was sent
    runs: int = 0
    failures: int = 0

    def record(self, now: float, ok: bool, latency: float, error: str | None) -> ProbeStatus:
        """Store one outcome."""
        self.ok, self.latency, self.last_probe, self.last_error = ok, latency, now, error
        self.last_ok = now if ok else self.last_ok
        self.runs += 1
        self.failures += 0 if ok else 1
        return self


class HealthProbe:
    """GET /health with a timeout over the whole exchange, on a kept-alive connection; 200 means up."""

    def __init__(
        self,
        url: str,
        timeout: float,
        monotonic: Callable[[], float] = time.perf_counter,
        tls: ssl.SSLContext | None = None,
        settings: ClientSettings | None = None,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.monotonic = monotonic
        self.status = ProbeStatus()
        self._http = HttpGet(url, _HEALTH_HEADERS, HEALTH_BODY_LIMIT, tls, settings=settings)

    async def probe(self, now: float) -> ProbeStatus:
        """Run once at wall-clock `now`; never raises for target faults."""
        start = self.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                resp = await self._http.get()
            ok = resp.status == 200
            error = None if ok else f"HTTP status {resp.status}"
        except TimeoutError:
            ok, error = False, f"timeout after {self.timeout:g}s"
        except ScrapeError as exc:
            ok, error = False, str(exc)
        return self.status.record(now, ok, self.monotonic() - start, error)

    async def aclose(self) -> None:
        """Close the kept-alive connection."""
        await self._http.aclose()


class CanaryProbe:
    """A tiny completion against the served model; success needs at least one generated token."""

    def __init__(
        self,
        base_url: str,
        config: CanaryConfig,
        client: httpx.AsyncClient,
        monotonic: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.config = config
        self.client = client
        self.monotonic = monotonic
        self.model: str | None = config.model
        self.status = ProbeStatus()
        key = config.api_key
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}  # vLLM's --api-key guards /v1

    async def _served_model(self) -> str:
        resp = await self.client.get(
            self.base_url + "/v1/models", headers=self.headers, timeout=self.config.timeout
        )
        if resp.status_code != 200:
            raise ValueError(f"/v1/models returned HTTP status {resp.status_code}")
        data = _json_object(resp)
        models = data.get("data")
        if not isinstance(models, list) or not models or not isinstance(models[0], dict):
            raise ValueError("/v1/models lists no model")
        model_id = models[0].get("id")
        if not isinstance(model_id, str):
            raise ValueError("/v1/models: first model has no string id")
        return model_id

    async def _complete(self) -> None:
        if self.model is None:
            self.model = await self._served_model()
        body = {
            "model": self.model,
            "prompt": self.config.prompt,
            "max_tokens": self.config.max_tokens,
            "temperature": 0,
            "stream": False,
        }
        resp = await self.client.post(
            self.base_url + "/v1/completions", json=body, headers=self.headers, timeout=self.config.timeout
        )
        if resp.status_code == 404 and self.config.model is None:
            self.model = None  # the served model changed (restart with another model): ask again
        if resp.status_code != 200:
            raise ValueError(f"/v1/completions returned HTTP status {resp.status_code}")
        data = _json_object(resp)
        usage = data.get("usage")
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if not isinstance(tokens, int) or tokens < 1:
            raise ValueError("completion generated no tokens")

    async def probe(self, now: float) -> ProbeStatus:
        """Run once at wall-clock `now`; never raises for target faults. Prompts are never logged."""
        start = self.monotonic()
        try:
            await self._complete()
            ok, error = True, None
        except httpx.TimeoutException:
            ok, error = False, f"timeout after {self.config.timeout:g}s"
        except httpx.HTTPError as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"
        except ValueError as exc:  # CredentialError too: the target's credentials file cannot be read
            ok, error = False, str(exc)
        return self.status.record(now, ok, self.monotonic() - start, error)


def _json_object(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError as exc:
        raise ValueError(f"{resp.request.url.path}: response is not JSON") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{resp.request.url.path}: response is not a JSON object")
    return data
