"""vLLM's own recovery: the fault-tolerance endpoints of a server started with `--enable-fault-tolerance`.

vLLM 0.32 (data parallel in external-LB mode only): when an engine core's busy loop raises, the engine aborts
what it runs, reports itself `unhealthy` and waits `engine_recovery_timeout_sec` (120 s by default) for an
orchestrator's instruction; without one it raises and dies. Its API server answers

- `GET /fault_tolerance/status`: `{"schema_version": 1, "total_engines": N, "engines": [{"id": 0,
  "status": "healthy" | "unhealthy" | "dead", "fault_info": "RuntimeError", "ft_error": "..."}]}`
  (`fault_info` while unhealthy; `ft_error` and `last_ft_request_id` after a failed instruction). A server
  without fault tolerance has no such route: 404.
- `POST /fault_tolerance/apply {"instruction": "retry"}`: 202 `{"message": ..., "request_id": ...}`; the
  retry runs in the background (it re-creates the data-parallel group, then marks the engine healthy), and
  is seen done on the status. An engine that is not unhealthy refuses it (its `ft_error` says so).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ActionError

if TYPE_CHECKING:  # the config parser loads this module with the kinds: no HTTP stack for `check`
    import httpx

STATUS_PATH = "/fault_tolerance/status"
APPLY_PATH = "/fault_tolerance/apply"
RETRY = {"instruction": "retry"}
MAX_BODY = 64 * 1024  # a status lists one small object per engine this API server manages
MAX_ENGINES = 1024


@dataclass(frozen=True)
class EngineHealth:
    """One engine's entry of the status."""

    id: int
    status: str  # "healthy" | "unhealthy" | "dead" (what a newer vLLM adds is kept as it says)
    fault_info: str = ""  # the exception type that made it unhealthy
    ft_error: str = ""  # why the last instruction failed


@dataclass(frozen=True)
class FaultStatus:
    """The engines behind one API server, as it reports them."""

    engines: tuple[EngineHealth, ...]

    def with_status(self, status: str) -> tuple[int, ...]:
        """The ids of the engines in that state."""
        return tuple(e.id for e in self.engines if e.status == status)

    @property
    def healthy(self) -> bool:
        """Every engine says healthy (and there is at least one)."""
        return bool(self.engines) and all(e.status == "healthy" for e in self.engines)

    def describe(self) -> str:
        """`engine 0 unhealthy (RuntimeError), engine 1 healthy`."""
        said = [
            f"engine {e.id} {e.status}"
            + (f" ({e.fault_info or e.ft_error})" if e.fault_info or e.ft_error else "")
            for e in self.engines
        ]
        return ", ".join(said) or "no engines"


async def read_status(client: httpx.AsyncClient, base_url: str, timeout: float) -> FaultStatus | None:
    """The server's fault-tolerance status; None if it has none (404: started without fault tolerance).
    ActionError when it does not answer it (timeout, another status, not the documented JSON)."""
    import httpx  # noqa: PLC0415 - `check` loads the kinds, and needs no HTTP stack

    url = base_url.rstrip("/") + STATUS_PATH
    try:
        async with client.stream("GET", url, timeout=timeout) as resp:
            if resp.status_code == 404:
                return None
            body = await _bounded(resp)
    except httpx.HTTPError as exc:
        raise ActionError(f"GET {STATUS_PATH}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200:
        raise ActionError(f"GET {STATUS_PATH}: HTTP status {resp.status_code}")
    return _parse(body)


async def apply_retry(client: httpx.AsyncClient, base_url: str, timeout: float) -> str:
    """Ask the server to retry its unhealthy engines in place; the request id it accepted (202)."""
    import httpx  # noqa: PLC0415

    url = base_url.rstrip("/") + APPLY_PATH
    try:
        async with client.stream("POST", url, json=RETRY, timeout=timeout) as resp:
            body = await _bounded(resp)
    except httpx.HTTPError as exc:
        raise ActionError(f"POST {APPLY_PATH}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code != 202:
        raise ActionError(f"POST {APPLY_PATH}: HTTP status {resp.status_code}")
    answer = _json(body, APPLY_PATH)
    return str(answer.get("request_id", ""))[:64]


async def _bounded(resp: httpx.Response) -> bytes:
    data = bytearray()
    async for chunk in resp.aiter_bytes():
        data += chunk
        if len(data) > MAX_BODY:
            raise ActionError(f"{resp.request.url.path}: answer longer than {MAX_BODY} bytes")
    return bytes(data)


def _json(body: bytes, path: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise ActionError(f"{path}: the answer is not JSON") from exc
    if not isinstance(data, dict):
        raise ActionError(f"{path}: the answer is not a JSON object")
    return data


def _parse(body: bytes) -> FaultStatus:
    engines = _json(body, STATUS_PATH).get("engines")
    if not isinstance(engines, list) or len(engines) > MAX_ENGINES:
        raise ActionError(f"{STATUS_PATH}: no list of engines in the answer")
    out = []
    for e in engines:
        if (
            not isinstance(e, dict)
            or not isinstance(e.get("id"), int)
            or not isinstance(e.get("status"), str)
        ):
            raise ActionError(f"{STATUS_PATH}: an engine without an integer id and a status")
        info, error = e.get("fault_info"), e.get("ft_error")
        out.append(
            EngineHealth(
                e["id"],
                e["status"][:32],
                info[:200] if isinstance(info, str) else "",
                error[:200] if isinstance(error, str) else "",
            )
        )
    return FaultStatus(tuple(out))
