"""vLLM's deliberate states, read from vLLM itself: an engine paused (`POST /pause`, RL trainers around a
weight update) or asleep (`POST /sleep`, GPU sharing) takes no step and answers no completion on purpose.

Three sources say so:

- `GET /is_paused` and `GET /is_sleeping` (vLLM 0.32 answers `{"is_paused": true}`, `{"is_sleeping": true}`;
  its /is_sleeping is true while paused too). They exist only with `VLLM_SERVER_DEV_MODE=1`: each endpoint
  is asked once, a 404 means the server has none, and it is not asked again until the server restarts (its
  /health fails, see `EngineStateProbe.server_down`).
- `vllm:engine_sleep_state{sleep_state="awake"} == 0` on /metrics, without dev mode (read by the rules and by
  `asleep_in_store`, which also reads a `sleep_state` value vLLM 0.32 does not have, at a value other than 0,
  as not awake: a newer vLLM's sleep level must not be taken for a hung engine).

An endpoint that does not answer (timeout, connection error, 5xx, a body that is not the expected JSON) says
nothing: the engine is not taken for paused. A SIGSTOPped EngineCore makes /is_paused wait for ever (the API
server asks the engine core), so a really hung engine is never mistaken for a paused one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from ..store import SampleStore

STATE_SERIES = {
    "paused": "vllm_watchdog_engine_paused",
    "sleeping": "vllm_watchdog_engine_sleeping",
    "unhealthy": "vllm_watchdog_engines_unhealthy",
}
"""Endpoint kind -> the series the monitor writes for it under the target's job and instance: 1 if the last
answer was true, 0 if false or if the endpoint did not answer; absent where the server has no such endpoint
(or while it is down). `unhealthy`: how many engines `GET /fault_tolerance/status` (vLLM's
`--enable-fault-tolerance`) last said are `unhealthy`, waiting for an orchestrator's retry (the `recover`
action is one)."""
BOOLEAN_STATES = ("paused", "sleeping")  # asked at GET /is_<kind>
FAULT_PATH = "/fault_tolerance/status"
MAX_ENGINES = 1024
SLEEP_STATE = "vllm:engine_sleep_state"
SLEEP_STATES = frozenset({"awake", "weights_offloaded", "discard_all"})  # vLLM 0.32's sleep_state values
FRESH = 30.0  # seconds an answer stays believed if no newer probe ran (it runs every scrape interval)


@dataclass
class StateEndpoint:
    """One `GET /is_<kind>` endpoint: whether the server has it, and its last answer."""

    kind: str  # "paused" or "sleeping"
    available: bool | None = None  # None: not asked since the server (re)started
    value: bool | None = None  # the last answer; None: none, or it did not answer
    answered_at: float | None = None  # wall-clock time of the last answer
    since: float | None = None  # wall-clock time the engine was first seen in this state, while it is
    last_error: str | None = None

    @property
    def path(self) -> str:
        """The endpoint's path."""
        return FAULT_PATH if self.kind == "unhealthy" else f"/is_{self.kind}"

    def forget(self) -> None:
        """The server went away: ask again once it is back (it may come back without dev mode)."""
        self.available, self.value, self.answered_at, self.since = None, None, None, None

    def believed(self, now: float) -> bool:
        """True if the last answer said so, and is recent."""
        return bool(self.value) and self.answered_at is not None and now - self.answered_at <= FRESH


class EngineStateProbe:
    """Asks a vLLM server whether its engine is paused or asleep (dev-mode endpoints only)."""

    def __init__(
        self,
        base_url: str,
        client: httpx.AsyncClient,
        timeout: float,
        monotonic: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.client = client
        self.timeout = timeout
        self.monotonic = monotonic
        self.endpoints = {kind: StateEndpoint(kind) for kind in BOOLEAN_STATES}
        self.fault = StateEndpoint("unhealthy")  # its value: whether any engine is unhealthy
        self.unhealthy = 0  # how many engines said so, in the last answer

    async def probe(self, now: float) -> None:
        """Ask every endpoint the server has (or may have) once, all at once (a probe takes at most one
        timeout); never raises for target faults."""
        asks = [self._ask(ep, now) for ep in self.endpoints.values() if ep.available is not False]
        await asyncio.gather(*asks, *([self._ask_fault(now)] if self.fault.available is not False else []))

    async def _ask(self, ep: StateEndpoint, now: float) -> None:
        try:
            resp = await self.client.get(self.base_url + ep.path, timeout=self.timeout)
        except httpx.TimeoutException:
            return self._unanswered(ep, f"timeout after {self.timeout:g}s")
        except httpx.HTTPError as exc:
            return self._unanswered(ep, f"{type(exc).__name__}: {exc}")
        except ValueError as exc:  # the target's credentials file cannot be read (a CredentialError)
            return self._unanswered(ep, str(exc))
        if resp.status_code in (404, 405):  # no dev mode (405: a proxy that knows the path for POST only)
            ep.forget()
            ep.available, ep.last_error = False, f"HTTP status {resp.status_code}: not available"
            return None
        if resp.status_code != 200:
            return self._unanswered(ep, f"HTTP status {resp.status_code}")
        try:
            value = resp.json().get(f"is_{ep.kind}")
        except (ValueError, AttributeError):
            value = None
        if not isinstance(value, bool):
            return self._unanswered(ep, f"{ep.path}: no is_{ep.kind} boolean in the answer")
        if value and not ep.value:
            ep.since = now
        elif not value:
            ep.since = None
        ep.available, ep.value, ep.answered_at, ep.last_error = True, value, now, None
        return None

    async def _ask_fault(self, now: float) -> None:
        """GET /fault_tolerance/status: 404 where the server runs without fault tolerance."""
        ep = self.fault
        try:
            resp = await self.client.get(self.base_url + ep.path, timeout=self.timeout)
        except (httpx.HTTPError, ValueError) as exc:
            return self._unanswered(ep, f"{type(exc).__name__}: {exc}")
        if resp.status_code in (404, 405):
            ep.forget()
            ep.available, ep.last_error = False, f"HTTP status {resp.status_code}: not available"
            return None
        try:
            engines = resp.json().get("engines") if resp.status_code == 200 else None
        except (ValueError, AttributeError):
            engines = None
        if not isinstance(engines, list) or len(engines) > MAX_ENGINES:
            return self._unanswered(ep, f"{ep.path}: HTTP status {resp.status_code}, no list of engines")
        self.unhealthy = sum(1 for e in engines if isinstance(e, dict) and e.get("status") == "unhealthy")
        ep.available, ep.value, ep.answered_at, ep.last_error = True, self.unhealthy > 0, now, None
        return None

    def _unanswered(self, ep: StateEndpoint, error: str) -> None:
        # No answer is no evidence: the engine is not taken for paused (a frozen engine core answers nothing).
        ep.value, ep.since, ep.last_error = None, None, error

    def server_down(self) -> None:
        """/health failed: the server may restart with other flags, so every endpoint is asked again."""
        for ep in (*self.endpoints.values(), self.fault):
            ep.forget()

    def samples(self) -> dict[str, float | None]:
        """Series name -> value to store now (1 or 0), or None where the series should be absent."""
        out = {
            STATE_SERIES[kind]: (1.0 if ep.value else 0.0) if ep.available else None
            for kind, ep in self.endpoints.items()
        }
        fault = self.fault
        out[STATE_SERIES["unhealthy"]] = (
            (float(self.unhealthy) if fault.value else 0.0) if fault.available else None
        )
        return out

    def reason(self, now: float) -> str:
        """Why the engine is paused or asleep on purpose, by its own endpoints; "" if they do not say so."""
        for ep in self.endpoints.values():
            if ep.believed(now):
                since = f" since {time.strftime('%H:%M:%S', time.gmtime(ep.since))}Z" if ep.since else ""
                word = "paused" if ep.kind == "paused" else "asleep or paused"
                return f"the engine is {word} on purpose (GET {ep.path} answered true{since})"
        return ""


def asleep_in_store(store: SampleStore, target: str, now: float, lookback: float) -> str:
    """Why the target's engine is not awake, by its `vllm:engine_sleep_state`: `sleep_state="awake"` is 0, or
    a state this watchdog does not know (a newer vLLM's) is not 0, which is read as not awake; "" if awake or
    unknown."""
    t_ms, lookback_ms = int(now * 1000), int(lookback * 1000)
    why: dict[str, str] = {}  # engine -> the series that says it is not awake
    for series in store.select(SLEEP_STATE):
        labels = dict(series.labels)
        state = labels.get("sleep_state")
        last = series.at(t_ms, lookback_ms) if labels.get("target") == target and state else None
        if last is None:
            continue
        engine = labels.get("engine", "0")
        if state == "awake" and last[1] == 0.0:
            why[engine] = '{sleep_state="awake"} is 0'
        elif state not in SLEEP_STATES and last[1] != 0.0:
            why.setdefault(engine, f'{{sleep_state="{state}"}} is {last[1]:g}, a state not known to be awake')
    if not why:
        return ""
    said = "; ".join(f"{SLEEP_STATE}{text}, engine {engine}" for engine, text in sorted(why.items()))
    return f"the engine is asleep on purpose ({said})"
